# frozen_string_literal: true

# What it costs to interrupt a busy thread RATE times a second, two ways:
# a timer thread that sleeps on a timerfd and sets a flag the worker
# checks (how the sampling windows' polls reach Ruby today:
# src/ruby/window_timer.rs and the postponed job), and a POSIX timer whose
# signal the kernel delivers to the worker itself (timer_create with
# SIGEV_THREAD_ID, as signal-based profilers sample). The C program
# bench/lib/timer_delivery.c does a fixed amount of cache-bound work in
# one thread; each run is paired with a run without any timer next to it,
# the three kinds alternating, and the table gives medians of the paired
# ratios with a 95% interval, and what one event costs.
#
#   ruby bench/timer_delivery.rb                      # 2,000 events a second, 15 rounds
#   ruby bench/timer_delivery.rb --rate 440 --rounds 21 --steps 600000000
#   ruby bench/timer_delivery.rb --busy 1   # another busy process per core but one: a full machine

require "optparse"
require "rbconfig"
require "tmpdir"
require_relative "lib/report"

options = { rate: 2_000, rounds: 15, steps: 300_000_000, kib: 1_024, busy: 0 }
OptionParser.new do |o|
  o.banner = "usage: ruby bench/timer_delivery.rb [options]"
  o.on("--rate N", Integer, "events a second (default 2,000)") { |v| options[:rate] = v }
  o.on("--rounds N", Integer, "rounds of the three kinds (default 15)") { |v| options[:rounds] = v }
  o.on("--steps N", Integer, "the worker's steps a run (default 300,000,000: ~2 s here)") { |v| options[:steps] = v }
  o.on("--kib N", Integer, "the worker's working set in KiB (default 1,024)") { |v| options[:kib] = v }
  o.on("--busy N", Integer, "busy processes beside the runs (default 0): the timer thread then takes a core " \
                            "from someone") { |v| options[:busy] = v }
end.parse!
unless options.values_at(:rate, :rounds, :steps, :kib).all?(&:positive?) && options[:rounds] >= 6 &&
       options[:busy] >= 0
  abort "timer_delivery.rb: --rate, --steps and --kib must be at least 1, --rounds at least 6, --busy at least 0"
end

KINDS = %w[none thread signal].freeze

Dir.mktmpdir("timer-delivery") do |dir|
  binary = File.join(dir, "timer_delivery")
  source = File.join(BenchReport::ROOT, "bench", "lib", "timer_delivery.c")
  compiler = RbConfig::CONFIG.fetch("CC", "cc").split.first
  system(compiler, "-O2", "-o", binary, source, "-lpthread", "-lrt") or abort "timer_delivery.rb: #{compiler} failed"

  busy = Array.new(options[:busy]) { spawn(binary, "none", "1", (10**13).to_s, "64", out: File::NULL) }
  stop_busy = lambda do
    Process.kill(:KILL, *busy) unless busy.empty?
    busy.each { |pid| Process.wait(pid) }
    busy.clear
  end
  at_exit { stop_busy.call }
  runs = BenchReport.alternate(KINDS, options[:rounds]) do |kind|
    out = `#{binary} #{kind} #{options[:rate]} #{options[:steps]} #{options[:kib]}`
    abort "timer_delivery.rb: the program failed (#{kind})" unless Process.last_status.success?
    events, worker, process, wall = out.split.map(&:to_f)
    { events: events, worker: worker, process: process, wall: wall }
  end
  puts "Machine: #{BenchReport.machine}"
  stop_busy.call
  beside = options[:busy].positive? ? ", #{options[:busy]} busy process(es) beside" : ""
  puts "#{options[:rate]} events a second#{beside}; a worker of #{options[:steps]} steps through #{options[:kib]} KiB " \
       "(no timer: #{format('%.2f', BenchReport.median(runs['none'].map { |r| r[:worker] }))} s of CPU); " \
       "#{options[:rounds]} rounds; medians of the ratios to the run without a timer in the same round, " \
       "[95% interval]"
  rows = %w[thread signal].map do |kind|
    pairs = runs[kind].zip(runs["none"])
    cells = %i[worker process].map do |key|
      ratios = pairs.map { |run, none| run[key] / none[key] }
      low, high = BenchReport.median_interval(ratios)
      format("%.3fx [%.3f-%.3f]", BenchReport.median(ratios), low, high)
    end
    per_event = pairs.map { |run, none| (run[:process] - none[:process]) / run[:events] * 1e6 }
    worker_per_event = pairs.map { |run, none| (run[:worker] - none[:worker]) / run[:events] * 1e6 }
    [kind == "thread" ? "a timer thread sets a flag" : "a timer signal to the worker", *cells,
     format("%.1f us", BenchReport.median(worker_per_event)), format("%.1f us", BenchReport.median(per_event))]
  end
  BenchReport.table(["how the worker is interrupted", "worker's CPU", "process's CPU", "worker's a event",
                     "process's a event"], rows)
end
