# frozen_string_literal: true

# What the profiler costs the thread that serves a request: a Rails app
# called in this process (bench/lib/in_process_app.rb, no puma, no
# socket), in blocks of requests with the profiler on, off, and off
# again, the six orders in turn, all in ONE process. Each block's CPU time
# is compared with that of the block without the profiler in its round,
# seconds away: on a shared machine fresh-process rounds (bench/run rails)
# move by several points from one run to the next, and blocks close
# together move together.
# The second block without the profiler is the control: what the method
# reads where nothing differs.
#
#   ruby -Ilib bench/request_cost.rb                   # the ActiveRecord app, 60 rounds of 100-request blocks
#   ruby -Ilib bench/request_cost.rb --app rails       # the Rails-depth app
#   ruby -Ilib bench/request_cost.rb --window-budget 25000 --rounds 120 --block 60
#   ruby -Ilib bench/request_cost.rb --wake-ups 400    # no profiler: a process that only sleeps and wakes
#
# "request thread": the CPU time of the thread that ran the requests (the
# app, the hooks, the samples, the postponed jobs that ran on it); "process":
# every thread's (adds the windows' timer thread). The profiler is started
# before its block and stopped and flushed after it (a server's flusher
# thread would flush: bench/thread_costs.rb measures that thread under
# puma). What a running server is past is left out, unmeasured: the
# warm-up (window_warm_up: 0), and after each start the requests of its
# first 1.25 s, while the windows learn the allocation rate again and
# spend the second of budget each start grants (spent over ~0.25 s at a
# time: sampler/windows/budget.rs). After every block, on or off,
# FILLER unmeasured requests absorb what it leaves behind (the flush's
# garbage and its leftovers, released by a job on the request thread), and
# the rounds go through the six orders of the three blocks in turn, so
# that each block follows each other equally often. Each start clears the
# live-sample table: a server's full one is not measured here.
#
# --wake-ups N replaces the profiler, in the blocks marked "on", by a
# process of its own that only sleeps and wakes N times a second (the C
# program bench/lib/wake_cost.c): what a timer's wake-ups alone cost the
# requests, with none of the profiler's work ("process" then means this
# process only, without the sleeper's own CPU).

require "optparse"
require "fileutils"
require "tmpdir"
require "memprofiler_pprof_rs"
require_relative "lib/in_process_app"
require_relative "lib/report"

options = { app: "rails-ar", rounds: 60, block: 100, filler: 20, mode: :light }
parser = OptionParser.new do |o|
  o.banner = "usage: ruby -Ilib bench/request_cost.rb [options]"
  o.on("--app APP", InProcessApp::TARGETS, "rails-ar (default: the ActiveRecord app) or rails (Rails-depth)") do |v|
    options[:app] = v
  end
  o.on("--rounds N", Integer, "rounds of three blocks (default 60; a multiple of 6 gives each order as often)") do |v|
    options[:rounds] = v
  end
  o.on("--block N", Integer, "requests a measured block (default 100)") { |v| options[:block] = v }
  o.on("--filler N", Integer, "unmeasured requests after each block (default 20)") { |v| options[:filler] = v }
  o.on("--mode MODE", %w[light exact], "the collector's mode (default light, the default)") do |v|
    options[:mode] = v.to_sym
  end
  o.on("--sample-rate R", Float, "the collector's sample_rate (default its default, 0.01)") { |v| options[:rate] = v }
  o.on("--window-budget N", Integer, "the collector's window_budget (default its default, 100,000)") do |v|
    options[:budget] = v
  end
  o.on("--wake-ups N", Integer, "instead of the profiler: a process waking N times a second") do |v|
    options[:wake_ups] = v
  end
end
begin
  parser.parse!
rescue OptionParser::ParseError => e
  abort "request_cost.rb: #{e.message}"
end
abort "request_cost.rb: --rounds must be at least 6 and --block at least 1" if options[:rounds] < 6 || options[:block] < 1
abort "request_cost.rb: --filler must be 0 or more, got #{options[:filler]}" if options[:filler].negative?
unless (options[:rounds] % 6).zero?
  warn "request_cost.rb: --rounds #{options[:rounds]} is not a multiple of 6: the orders come unevenly"
end
if options[:wake_ups]
  unless options[:wake_ups].between?(1, 1_000_000)
    abort "request_cost.rb: --wake-ups must be 1-1,000,000 a second, got #{options[:wake_ups]}"
  end
  flags = { rate: "--sample-rate", budget: "--window-budget" }
  collector_flag = flags.find { |key, _| options[key] }&.last || (options[:mode] == :exact && "--mode exact")
  abort "request_cost.rb: --wake-ups runs no profiler: it takes no #{collector_flag}" if collector_flag
end
abort "request_cost.rb: --mode exact has no windows: it takes no --window-budget" if options[:mode] == :exact && options[:budget]

request = InProcessApp.request_for(options[:app])

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
exact_live = []
if options[:wake_ups]
  # The sleeping process, compiled once, started before each "on" block
  # and killed after it.
  dir = Dir.mktmpdir("request-cost")
  at_exit { FileUtils.rm_rf(dir) }
  waker = BenchReport.build_wake_cost(dir, "request_cost.rb")
  on_description = "a process waking #{options[:wake_ups]} times a second"
  on_block = lambda do
    # (It sleeps and wakes for at most 10 minutes: a block is far shorter,
    # and a sleeper orphaned by a killed run does not linger.)
    pid = Process.spawn(waker, (1_000_000_000 / options[:wake_ups]).to_s, "600", "1", out: File::NULL)
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
  allocated = -> { GC.stat(:total_allocated_objects) }
  on_block = lambda do
    collector.start!
    from = allocated.call
    InProcessApp.run_for(request, 1.25)
    # window_coverage is the share of the allocations since start! that
    # were hooked: the block's own share is the difference.
    before = [collector.window_coverage, allocated.call - from] if options[:mode] == :light
    result = measure.call
    if before
      after = [collector.window_coverage, allocated.call - from]
      coverage << (((after[0] * after[1]) - (before[0] * before[1])) / (after[1] - before[1]))
    end
    result
  ensure
    collector.stop!
    collector.flush
    # In exact mode the FREEOBJ hook stays on while samples it took are
    # alive, into the blocks without the profiler (counted, and said).
    exact_live << collector.live_heap_samples_count if options[:mode] == :exact
  end
end
blocks = { on: on_block, off: measure, control: measure }
# The six orders, arranged so that across round boundaries too each block
# follows each other block equally often (3 times in 6 rounds), and never
# itself.
orders = blocks.keys.permutation.to_a.values_at(0, 1, 5, 2, 3, 4)

rounds = Array.new(options[:rounds]) do |round|
  result = orders[round % orders.size].to_h do |name|
    measured = blocks.fetch(name).call
    options[:filler].times { request.call }
    [name, measured]
  end
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
     "(on, off, off again; the six orders in turn; #{options[:filler]} unmeasured after each); on: #{on_description}"
BenchReport.table(["paired ratio", "median", "95% interval of the median"], rows)
gcs = blocks.keys.map { |name| format("%s %.1f", name, BenchReport.median(rounds.map { |r| r[name][2] })) }
puts "(GCs a block, median: #{gcs.join(', ')}; off alone: " \
     "#{format('%.2f ms', BenchReport.median(rounds.map { |r| r[:off][0] }) * 1000)} of request-thread CPU a request)"
unless coverage.empty?
  puts "(share of the measured blocks' allocations the windows hooked, median: " \
       "#{format('%.3f', BenchReport.median(coverage))})"
end
if exact_live.any?(&:positive?)
  puts "(mode: :exact kept its FREEOBJ hook on after a block while its samples lived: a median of " \
       "#{BenchReport.median(exact_live).round} live samples after a block's flush; the blocks without it " \
       "paid that hook too, so on / off reads low)"
end
puts BenchReport.machine
