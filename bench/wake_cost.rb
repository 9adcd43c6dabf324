# frozen_string_literal: true

# What a thread's wake-up costs on this machine, with nothing else done:
# the floor under the sampling windows' timer thread (its wake-ups a
# second, from bench/thread_costs.rb, times this is what sleeping and
# waking alone takes of a core). A C thread sleeps to deadlines RATE times
# a second (with the 1 us timer slack the timer thread asks for, and with
# Linux's default) and reports the CPU time the kernel charged it.
#
#   ruby bench/wake_cost.rb                        # 600 wake-ups a second, 5 s, 3 runs of each
#   ruby bench/wake_cost.rb --rate 300 --seconds 10 --runs 5

require "optparse"
require "rbconfig"
require "tmpdir"
require_relative "lib/report"

options = { rate: 600, seconds: 5, runs: 3 }
OptionParser.new do |o|
  o.banner = "usage: ruby bench/wake_cost.rb [options]"
  o.on("--rate N", Integer, "wake-ups a second (default 600)") { |v| options[:rate] = v }
  o.on("--seconds N", Integer, "seconds a run (default 5)") { |v| options[:seconds] = v }
  o.on("--runs N", Integer, "runs of each timer slack (default 3)") { |v| options[:runs] = v }
end.parse!
abort "wake_cost.rb: --rate, --seconds and --runs must be at least 1" unless options.values.all?(&:positive?)

Dir.mktmpdir("wake-cost") do |dir|
  binary = BenchReport.build_wake_cost(dir, "wake_cost.rb")
  period_ns = 1_000_000_000 / options[:rate]
  results = { 1 => [], 0 => [] }
  options[:runs].times do
    results.each_key do |slack|
      wakes, cpu = `#{binary} #{period_ns} #{options[:seconds]} #{slack}`.split.map(&:to_f)
      abort "wake_cost.rb: the timer program failed" unless Process.last_status.success? && wakes&.positive?
      results[slack] << [cpu / wakes * 1e6, cpu / options[:seconds] * 100]
    end
  end
  puts "#{options[:rate]} wake-ups a second, #{options[:seconds]} s a run, #{options[:runs]} runs " \
       "(CPU the kernel charged the sleeping thread; median [lowest-highest])"
  results.each do |slack, runs|
    per_wake = runs.map(&:first).sort
    share = runs.map(&:last).sort
    puts format("  timer slack %-17s %5.1f us a wake-up [%.1f-%.1f], %.2f%% of a core",
                slack == 1 ? "1 us:" : "default (50 us):", per_wake[per_wake.size / 2], per_wake.first,
                per_wake.last, share[share.size / 2])
  end
end
