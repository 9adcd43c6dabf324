# frozen_string_literal: true

# What the profiler costs the thread that serves a request, read to a
# point or two: a Rails app called in this process (bench/lib/rails_requests.rb's
# apps, no puma, no socket), in blocks of requests with the profiler on,
# off, and off again, in a rotated order, all in ONE process. Each block's
# CPU time is compared with its neighbours', a second or two apart: on a
# shared machine fresh-process rounds (bench/run rails) move by several
# points from one run to the next, and neighbouring blocks move together.
# The second block without the profiler is the control: what the method
# reads where nothing differs.
#
#   ruby -Ilib bench/request_cost.rb                      # the ActiveRecord app, 100 rounds of 100-request blocks
#   ruby -Ilib bench/request_cost.rb --app rails --rounds 200 --mode exact
#   ruby -Ilib bench/request_cost.rb --wake-ups 400   # no profiler: a process that only sleeps and wakes
#
# "request thread": the CPU time of the thread that ran the requests (the
# app, the hooks, the samples, the postponed jobs that ran on it); "process":
# every thread's (adds the windows' timer thread). The profiler is started
# before a block and stopped after it, and flushed between blocks, outside
# them, as a server's flusher would (its cost is the flusher thread's, not
# the requests': bench/thread_costs.rb measures it under puma). What a
# running server is past is left out: the warm-up (window_warm_up: 0), and
# after each start the first 30 requests, while the windows spend the
# budget saved while stopped.
#
# --wake-ups N replaces the profiler, in the blocks marked "on", by a
# process of its own that only sleeps and wakes N times a second (the C
# program of bench/wake_cost.rb): what a timer's wake-ups alone cost the
# requests, with none of the profiler's work ("process" then means this
# process only, without the sleeper's own CPU).

require "optparse"
require "rack/mock"
require "fileutils"
require "tmpdir"
require "memprofiler_pprof_rs"
require_relative "lib/report"

options = { app: "rails-ar", rounds: 100, block: 100, mode: :light }
OptionParser.new do |o|
  o.banner = "usage: ruby -Ilib bench/request_cost.rb [options]"
  o.on("--app APP", %w[rails rails-ar], "rails-ar (default: the ActiveRecord app) or rails (Rails-depth)") do |v|
    options[:app] = v
  end
  o.on("--rounds N", Integer, "rounds of three blocks (default 100)") { |v| options[:rounds] = v }
  o.on("--block N", Integer, "requests a block (default 100)") { |v| options[:block] = v }
  o.on("--mode MODE", %w[light exact], "the collector's mode (default light, the default)") do |v|
    options[:mode] = v.to_sym
  end
  o.on("--sample-rate R", Float, "the collector's sample_rate (default its default, 0.01)") { |v| options[:rate] = v }
  o.on("--window-budget N", Integer, "the collector's window_budget (default its default, 50,000)") do |v|
    options[:budget] = v
  end
  o.on("--wake-ups N", Integer, "instead of the profiler: a process waking N times a second") do |v|
    options[:wake_ups] = v
  end
end.parse!
abort "request_cost.rb: --rounds must be at least 6 and --block at least 1" if options[:rounds] < 6 || options[:block] < 1
if options[:wake_ups] && !options[:wake_ups].between?(1, 1_000_000)
  abort "request_cost.rb: --wake-ups must be 1-1,000,000 a second, got #{options[:wake_ups]}"
end

app, path = if options[:app] == "rails"
              require_relative "lib/rails_app/app"
              [BenchRails.app, "/products"]
            else
              require_relative "lib/rails_ar_app/app"
              [BenchRailsAr.app, "/orders?page=3"]
            end
request = lambda do
  env = Rack::MockRequest.env_for("http://127.0.0.1#{path}", "REMOTE_ADDR" => "127.0.0.1", "HTTP_HOST" => "127.0.0.1")
  status, _headers, body = app.call(env)
  body.each(&:bytesize)
  body.close if body.respond_to?(:close)
  raise "the app answered #{status}" unless status == 200
end

# One block: [request thread CPU, process CPU] per request (s), GCs.
measure = lambda do
  gcs = GC.count
  process = Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID)
  thread = Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID)
  options[:block].times { request.call }
  thread = Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID) - thread
  process = Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID) - process
  [thread / options[:block], process / options[:block], GC.count - gcs]
end

# Templates compiled, caches filled.
300.times { request.call }
coverage = []
if options[:wake_ups]
  # The sleeping process, compiled once, started before each "on" block
  # and killed after it.
  dir = Dir.mktmpdir("request-cost")
  at_exit { FileUtils.rm_rf(dir) }
  waker = File.join(dir, "wake_cost")
  compiler = RbConfig::CONFIG.fetch("CC", "cc").split.first
  source = File.join(__dir__, "lib", "wake_cost.c")
  system(compiler, "-O2", "-o", waker, source, "-lpthread") or abort "request_cost.rb: #{compiler} failed on #{source}"
  on_description = "a process waking #{options[:wake_ups]} times a second"
  on_block = lambda do
    pid = Process.spawn(waker, (1_000_000_000 / options[:wake_ups]).to_s, "3600", "1", out: File::NULL)
    begin
      measure.call
    ensure
      Process.kill(:KILL, pid)
      Process.wait(pid)
    end
  end
else
  collector_options = { mode: options[:mode], window_warm_up: 0 }
  collector_options[:sample_rate] = options[:rate] if options[:rate]
  collector_options[:window_budget] = options[:budget] if options[:budget]
  collector_options[:window_budget] = nil if options[:mode] == :exact
  collector = MemprofilerPprof::Collector.new(**collector_options)
  on_description = "collector #{collector_options.inspect}"
  # The windows' rates learnt.
  collector.start!
  100.times { request.call }
  collector.stop!
  collector.flush
  on_block = lambda do
    collector.start!
    # Unmeasured: the budget saved while stopped is spent first (windows
    # come closer together for ~0.25 s), which a running server has not.
    30.times { request.call }
    result = measure.call
    collector.stop!
    coverage << collector.window_coverage if options[:mode] == :light
    collector.flush
    result
  end
end
blocks = { on: on_block, off: measure, control: measure }

rounds = Array.new(options[:rounds]) do |round|
  result = blocks.keys.rotate(round).to_h { |name| [name, blocks.fetch(name).call] }
  $stderr.print "."
  result
end
$stderr.puts

def row(label, ratios)
  low, high = BenchReport.median_interval(ratios)
  [label, format("%.3fx", BenchReport.median(ratios)), format("%.3f-%.3f", low, high)]
end

rows = []
{ "request thread" => 0, "process" => 1 }.each do |what, index|
  rows << row("on / off: #{what} CPU a request", rounds.map { |r| r[:on][index] / r[:off][index] })
  rows << row("control, off / off: #{what} CPU a request", rounds.map { |r| r[:control][index] / r[:off][index] })
end
puts
puts "#{options[:app]} in this process, #{options[:rounds]} rounds of three #{options[:block]}-request blocks " \
     "(on, off, off again; rotated); on: #{on_description}"
BenchReport.table(["paired ratio", "median", "95% interval of the median"], rows)
gcs = blocks.keys.map { |name| format("%s %.1f", name, BenchReport.median(rounds.map { |r| r[name][2] })) }
puts "(GCs a block, median: #{gcs.join(', ')}; off alone: " \
     "#{format('%.2f ms', BenchReport.median(rounds.map { |r| r[:off][0] }) * 1000)} of request-thread CPU a request)"
unless coverage.empty?
  puts "(share of allocations the windows hooked, median over blocks: #{format('%.3f', BenchReport.median(coverage))})"
end
puts BenchReport.machine
