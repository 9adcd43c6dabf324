# frozen_string_literal: true

# Whether sampling windows are armed in time when requests rotate over a
# thread pool with idle time between them, as in a threaded server: each
# request (PER allocations) goes to the pool thread that waited longest,
# then the process sleeps IDLE ms. Ruby flags the postponed job that arms
# the hook on the thread that ran last, which then waits for its turn
# (ruby/window_timer.rs). Per seed, in a fresh process: the share of the
# pool's allocations the windows missed (the profile's "(missed by sampling
# windows)" row), and what the windows' timer thread cost: its wake-ups a
# second and its share of a CPU while the pool ran, and the process's CPU
# time and the thread's wake-ups over 3 seconds of sleep after it.
#
#   ruby -Ilib bench/thread_pool_windows.rb [--seeds 4] [--threads 16] [--idle 2] [--per 2000]

require "optparse"
require "open3"
require "rbconfig"

options = { seeds: 4, threads: 16, idle: 2.0, per: 2_000, requests: 600, idle_after: 3.0 }
OptionParser.new do |opts|
  opts.on("--seeds N", Integer) { |n| options[:seeds] = n }
  opts.on("--threads N", Integer) { |n| options[:threads] = n }
  opts.on("--idle MS", Float) { |ms| options[:idle] = ms }
  opts.on("--per N", Integer) { |n| options[:per] = n }
  opts.on("--requests N", Integer) { |n| options[:requests] = n }
end.parse!

WORKER = <<~'RUBY'
  require "memprofiler_pprof_rs"
  seed, threads, idle, per, requests, idle_after = ARGV
  collector = MemprofilerPprof::Collector.new(mode: :light, sample_rate: 0.1, window_probability: 0.1,
                                              window_warm_up: 0, seed: Integer(seed))
  requests = Integer(requests)
  per = Integer(per)
  collector.start!
  queue = Queue.new
  done = Queue.new
  pool = Array.new(Integer(threads)) do
    Thread.new do
      while (count = queue.pop)
        count.times { String.new }
        done << true
      end
    end
  end
  began = Process.clock_gettime(Process::CLOCK_MONOTONIC)
  requests.times do
    queue << per
    done.pop
    sleep Float(idle) / 1000
  end
  queue.close
  pool.each(&:join)
  serving = Process.clock_gettime(Process::CLOCK_MONOTONIC) - began
  data = collector.flush
  # The timer thread's wake-ups and time on a CPU (ns).
  timer = lambda do
    task = Dir["/proc/self/task/*"].find { |t| File.read("#{t}/comm").start_with?("memprofiler-win") }
    next [0, 0] unless task

    [File.read("#{task}/status")[/^voluntary_ctxt_switches:\s+(\d+)/, 1].to_i,
     File.read("#{task}/schedstat").split.first.to_i]
  end
  switches, timer_ns = timer.call
  cpu = Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID)
  sleep Float(idle_after)
  idle_cpu = Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID) - cpu
  idle_switches = timer.call.first - switches
  collector.stop!
  profile = MemprofilerPprof::PprofReader.parse(data.pprof_data)
  index = profile.sample_type_names.index("alloc_objects")
  missed = profile.samples.select { |s| s.frames.first&.name == "(missed by sampling windows)" }
                  .sum { |s| s.values[index] }
  puts [missed.fdiv(requests * per), switches, timer_ns, serving, idle_cpu, idle_switches].join(" ")
RUBY

lib = File.expand_path("../lib", __dir__)
puts "Ruby #{RUBY_VERSION}: #{options[:threads]} pool threads, #{options[:requests]} requests of " \
     "#{options[:per]} allocations, #{options[:idle]} ms idle after each; sample_rate 0.1, window_probability 0.1"
puts
puts "| seed | missed, % of the pool's allocations | serving: timer wake-ups a second | " \
     "serving: timer thread's CPU | idle #{options[:idle_after]} s: process CPU ms | idle: timer wake-ups |"
puts "|---|---|---|---|---|---|"
options[:seeds].times do |i|
  args = [i + 1, options[:threads], options[:idle], options[:per], options[:requests], options[:idle_after]].map(&:to_s)
  out, err, status = Open3.capture3(RbConfig.ruby, "-I", lib, "-e", WORKER, *args)
  abort "bench/thread_pool_windows.rb: seed #{i + 1} failed: #{err}" unless status.success?
  missed, switches, timer_ns, serving, idle_cpu, idle_switches = out.split.map { |v| Float(v) }
  puts format("| %d | %.1f | %.0f | %.2f%% | %.1f | %d |", i + 1, 100 * missed, switches / serving,
              100 * timer_ns / 1e9 / serving, 1000 * idle_cpu, idle_switches)
end
