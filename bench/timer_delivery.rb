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
#   ruby bench/timer_delivery.rb --busy 1   # a busy loop beside (bench/lib/busy_loops.rb): a full machine

require "optparse"
require "rbconfig"
require "tmpdir"
require_relative "lib/busy_loops"
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
       options[:busy] >= 0 && options[:rate] <= 1_000_000
  abort "timer_delivery.rb: --rate must be 1-1,000,000, --steps and --kib at least 1, --rounds at least 6, " \
        "--busy at least 0"
end

KINDS = %w[none thread signal].freeze

Dir.mktmpdir("timer-delivery") do |dir|
  binary = BenchReport.build_c(dir, "timer_delivery", "timer_delivery.rb", "-lpthread", "-lrt")

  BusyLoops.start(options[:busy])
  runs = BenchReport.alternate(KINDS, options[:rounds]) do |kind|
    out = `#{binary} #{kind} #{options[:rate]} #{options[:steps]} #{options[:kib]}`
    abort "timer_delivery.rb: the program failed (#{kind})" unless Process.last_status.success?
    fires, jobs, worker, process, wall = out.split.map(&:to_f)
    abort "timer_delivery.rb: the #{kind} timer never fired" if kind != "none" && fires.zero?
    { fires: fires, jobs: jobs, worker: worker, process: process, wall: wall }
  end
  puts "Machine: #{BenchReport.machine}"
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
    per_fire = %i[worker process].map do |key|
      costs = pairs.map { |run, none| (run[key] - none[key]) / run[:fires] * 1e6 }
      low, high = BenchReport.median_interval(costs)
      format("%.1f us [%.1f-%.1f]", BenchReport.median(costs), low, high)
    end
    fired = BenchReport.median(runs[kind].map { |run| run[:fires] / (options[:rate] * run[:wall]) })
    jobs = BenchReport.median(runs[kind].map { |run| run[:jobs] / run[:fires] })
    [kind == "thread" ? "a timer thread sets a flag" : "a timer signal to the worker", *cells, *per_fire,
     format("%.2f / %.2f", fired, jobs)]
  end
  BenchReport.table(["how the worker is interrupted", "worker's CPU", "process's CPU", "worker's a fire",
                     "process's a fire", "fired / jobs a fire"], rows)
  puts "(\"a fire\": the CPU over the run without a timer, per timer event; \"fired\": events over rate x time; " \
       "\"jobs a fire\": how many the worker saw, the rest folded into one flag; the process's CPU is this " \
       "process's only: what the timer costs the busy processes beside it is not counted)"
  # And signal against thread, paired in their round: the worker's CPU with a
  # signal over the process's with a thread (each kind's whole cost).
  ratios = runs["signal"].zip(runs["thread"]).map { |signal, thread| signal[:worker] / thread[:process] }
  low, high = BenchReport.median_interval(ratios)
  puts format("signal (worker) / thread (process), paired by round: %.3fx [%.3f-%.3f]",
              BenchReport.median(ratios), low, high)
end
