# frozen_string_literal: true

# What context labels cost (MemprofilerPprof.with_labels):
# - per call: with_labels around an empty block, beside the block alone
#   and a fiber-local set and reset (what it does at the least), for one
#   set used again and again (an endpoint) and for a new set each call (a
#   request id: the table fills, then every call folds);
# - per allocation: the allocation loop of bench/run alloc (4 objects an
#   iteration) at the collector's defaults, with and without a label set
#   current, beside no profiler: the hook reads the label only when it
#   takes a sample.
# Each configuration runs in a fresh process, alternating, --runs times
# (default 5); the table gives medians.
#
#   ruby -Ilib bench/labels.rb [--runs 5]
#   ruby -Ilib bench/labels.rb --callgrind   # instruction counts instead (valgrind)

require "optparse"
require "rbconfig"
require "open3"

CALLS = 500_000
ITERATIONS = 1_000_000

CALL_CONFIGS = {
  "block alone" => "n.times { blk.call }",
  "fiber-local set and reset" => "n.times { Thread.current[:k] = 1; blk.call; Thread.current[:k] = nil }",
  "with_labels, one set" => 'n.times { MemprofilerPprof.with_labels(endpoint: "GET /users/:id", &blk) }',
  "with_labels, a new set each call" => "n.times { |i| MemprofilerPprof.with_labels(request_id: i, &blk) }",
  # A request through the Rack middleware, to an app that does nothing:
  # what RackLabels adds to every request (the env is built outside).
  "RackLabels, GET /users/:id" => <<~RUBY.chomp
    app = MemprofilerPprof::RackLabels.new(->(_env) { blk.call })
    envs = Array.new(100) { |i| { "REQUEST_METHOD" => "GET", "PATH_INFO" => "/users/\#{i}" } }
    n.times { |i| app.call(envs[i % 100]) }
  RUBY
}.freeze

ALLOC_CONFIGS = {
  "no profiler" => [false, false],
  "defaults, no labels" => [true, false],
  "defaults, inside with_labels" => [true, true]
}.freeze

LOOP = <<~RUBY
  def leaf(i) = [i.to_s, "x\#{i}", { i => i }]
  def middle(i) = leaf(i)
  def outer(n) = n.times { |i| middle(i) }
RUBY

def call_script(body)
  <<~RUBY
    require "memprofiler_pprof_rs"
    blk = proc {}
    n = #{CALLS}
    t = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    #{body}
    puts (Process.clock_gettime(Process::CLOCK_MONOTONIC) - t) / n * 1e9
  RUBY
end

def alloc_script(profile, labels, iterations, options = "")
  <<~RUBY
    require "memprofiler_pprof_rs"
    #{LOOP}
    #{profile ? "MemprofilerPprof::Collector.new(#{options}).start!" : ''}
    #{labels ? 'MemprofilerPprof.labels = { endpoint: "GET /users/:id" }' : ''}
    t = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    outer(#{iterations})
    puts Process.clock_gettime(Process::CLOCK_MONOTONIC) - t
  RUBY
end

def run(script, prefix = [])
  out, err, status = Open3.capture3(*prefix, RbConfig.ruby, "-I", File.expand_path("../lib", __dir__), "-e", script)
  abort "bench/labels.rb: a run failed: #{err}" unless status.success?
  [out, err]
end

def median(values) = values.sort[values.size / 2]

runs = 5
callgrind = false
OptionParser.new do |opts|
  opts.on("--runs N", Integer) { |n| runs = n }
  opts.on("--callgrind") { callgrind = true }
end.parse!

if callgrind
  # Instructions of the whole process (loading included, hence also per
  # iteration over no profiler's), one run each: they repeat exactly.
  iterations = 300_000
  puts "ruby #{RUBY_VERSION}, callgrind, allocation loop of #{iterations} iterations x 4 objects"
  rows = ALLOC_CONFIGS.map do |name, (profile, labels)|
    _out, err = run(alloc_script(profile, labels, iterations),
                    %w[valgrind --tool=callgrind --callgrind-out-file=/dev/null])
    [name, err[/Collected : (\d+)/, 1].to_i]
  end
  base = rows.first[1]
  rows.each do |name, count|
    puts format("  %-32s %14d instructions  %.4fx  %+7.1f a loop iteration",
                name, count, count.fdiv(base), (count - base).fdiv(iterations))
  end
  # The label's read in the hook, where it is most often made: every
  # allocation sampled (4 a loop iteration).
  every = "sample_rate: 1.0, window_budget: nil, max_allocation_samples: 10_000_000, max_heap_samples: 10_000_000"
  iterations = 50_000
  counts = [false, true].map do |labels|
    _out, err = run(alloc_script(true, labels, iterations, every),
                    %w[valgrind --tool=callgrind --callgrind-out-file=/dev/null])
    err[/Collected : (\d+)/, 1].to_i
  end
  puts "every allocation sampled (#{iterations} iterations): #{counts[0]} instructions without labels, " \
       "#{counts[1]} inside with_labels: #{format('%+.1f', (counts[1] - counts[0]).fdiv(4 * iterations))} a sample"
  exit
end

puts "ruby #{RUBY_VERSION}, #{runs} runs each (fresh processes, alternating), medians"

samples = Hash.new { |h, k| h[k] = [] }
runs.times do
  CALL_CONFIGS.each { |name, body| samples[name] << run(call_script(body)).first.to_f }
  ALLOC_CONFIGS.each { |name, (profile, labels)| samples[name] << run(alloc_script(profile, labels, ITERATIONS)).first.to_f }
end

puts "\nper call (#{CALLS} calls):"
CALL_CONFIGS.each_key { |name| puts format("  %-34s %8.0f ns", name, median(samples[name])) }
puts "\nallocation loop (#{ITERATIONS} iterations x 4 objects):"
base = median(samples["no profiler"])
ALLOC_CONFIGS.each_key do |name|
  puts format("  %-34s %8.3f s  %.3fx", name, median(samples[name]), median(samples[name]) / base)
end
