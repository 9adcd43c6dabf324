# frozen_string_literal: true

# What the profiler's own threads cost a server, thread by thread: puma
# serving the Rails-depth app (bench/lib/rails_app.ru, as bench/run rails)
# under wrk, each configuration in a fresh puma, alternating; each thread's
# context switches a second and CPU time, read from /proc (Linux only).
#
#   ruby bench/thread_costs.rb                  # the defaults beside no profiler, 3 runs of 10 s each
#   ruby bench/thread_costs.rb --runs 5 --seconds 20 --app puma_app.ru
#   ruby bench/thread_costs.rb --config "memprofiler_pprof_rs 0.01, mode: :exact"   # instead of the defaults
#
# The windows' timer thread (memprofiler-windows) wakes for the sampling
# windows' polls: each wake-up costs two context switches and a postponed
# job in a request thread. The flusher thread (a FileFlusher writing every
# second, as in bench/run puma and rails) builds and gzips a profile. Count
# figures (wake-ups, switches) move far less with the machine's load than
# requests a second do; read CPU to about ±20% on a shared machine.

require "optparse"
require_relative "lib/puma_bench"

options = { runs: 3, seconds: 10, app: "rails_app.ru", configs: ["no profiler", "memprofiler_pprof_rs 0.01"] }
chosen = []
OptionParser.new do |o|
  o.banner = "usage: ruby bench/thread_costs.rb [options]"
  o.on("--runs N", Integer, "runs per configuration (default 3)") { |v| options[:runs] = v }
  o.on("--seconds N", Integer, "seconds of wrk per run (default 10)") { |v| options[:seconds] = v }
  o.on("--app RACKUP", "rails_app.ru (default), rails_ar_app.ru or puma_app.ru") { |v| options[:app] = v }
  o.on("--config NAME", "a configuration of bench/lib/configs.rb instead of the defaults, beside no profiler " \
                        "(repeatable)") { |v| chosen << v }
end.parse!
options[:configs] = (["no profiler"] + chosen).uniq unless chosen.empty?
abort "thread_costs.rb: reads /proc/PID/task, which this system does not have" unless File.directory?("/proc/self/task")
abort "thread_costs.rb: --runs and --seconds must be at least 1" unless options[:runs].positive? && options[:seconds].positive?
unknown = options[:configs].reject { |config| BenchConfigs.known?(config) }
abort "thread_costs.rb: unknown configuration #{unknown.first.inspect}" unless unknown.empty?
missing = %w[puma wrk].find { |tool| !system("command -v #{tool} >/dev/null 2>&1") }
abort "thread_costs.rb: #{missing} is not installed (script/bootstrap --bench installs it)" if missing

path, connections = PumaBench::APPS.fetch(options[:app]) do
  abort "thread_costs.rb: --app is one of #{PumaBench::APPS.keys.join(', ')}"
end
CLOCK_TICKS = PumaBench::CLOCK_TICKS

# Per thread of `pid`, by kind: [context switches, CPU ticks, system ticks,
# minor page faults].
def thread_counts(pid)
  Dir["/proc/#{pid}/task/*"].each_with_object(Hash.new { |h, k| h[k] = [0, 0, 0, 0] }) do |task, sums|
    name = File.read("#{task}/comm").strip
    status = File.read("#{task}/status")
    switches = %w[voluntary nonvoluntary].sum { |kind| status[/^#{kind}_ctxt_switches:\s+(\d+)/, 1].to_i }
    kind = PumaBench::THREAD_KINDS.find { |prefix, _| name.start_with?(prefix) }&.last || :other
    stat = File.read("#{task}/stat")
    # (Fields after the name, which may hold ") " itself: minflt is the
    # 8th, utime the 12th, stime the 13th.)
    fields = stat[(stat.rindex(")") + 2)..].split
    sums[kind][0] += switches
    sums[kind][1] += Integer(fields[11]) + Integer(fields[12])
    sums[kind][2] += Integer(fields[12])
    sums[kind][3] += Integer(fields[7])
  rescue Errno::ENOENT, Errno::ESRCH
    next # a thread that ended as we read
  end
end

results = BenchReport.alternate(options[:configs], options[:runs]) do |config|
  PumaBench.serve(config, options[:app]) do |url, _dir, pid|
    PumaBench.wrk(url + path, 3, connections) # warm-up: templates, caches, the windows' rates
    before = thread_counts(pid)
    cpu_before = PumaBench.cpu_seconds(pid)
    run = PumaBench.wrk(url + path, options[:seconds], connections)
    cpu = PumaBench.cpu_seconds(pid) - cpu_before
    after = thread_counts(pid)
    deltas = after.to_h { |kind, counts| [kind, counts.each_with_index.map { |count, i| count - before[kind][i] }] }
    { requests: run[:requests], seconds: options[:seconds], cpu: cpu, deltas: deltas }
  end
end

puts "#{options[:app]} under puma (#{PumaBench::THREADS} threads), wrk #{options[:seconds]} s, medians of " \
     "#{options[:runs]} runs; per second of wrk, or per request"
header = format("%-30s %9s %12s %11s %11s %9s %11s %10s %10s %10s", "configuration", "requests", "CPU/request",
                "req user", "req system", "req cs/s", "req faults", "timer cs/s", "timer CPU", "flush CPU")
puts header, "-" * header.size
results.each do |config, runs|
  median = ->(&value) { BenchReport.median(runs.map(&value)) }
  count = ->(run, kind, index) { run[:deltas].fetch(kind, [0, 0, 0, 0])[index] }
  per_second = ->(kind, index) { median.call { |r| count.call(r, kind, index).fdiv(r[:seconds]) } }
  per_request = ->(kind, index) { median.call { |r| count.call(r, kind, index).fdiv(r[:requests]) } }
  user_ms = median.call { |r| (count.call(r, :requests, 1) - count.call(r, :requests, 2)) * 1000.0 / CLOCK_TICKS / r[:requests] }
  puts format("%-30s %9d %9.2f ms %8.2f ms %8.2f ms %9.0f %11.1f %10.0f %8.1f %% %8.1f %%", config,
              median.call { |r| r[:requests] }, median.call { |r| r[:cpu] / r[:requests] } * 1000.0, user_ms,
              per_request.call(:requests, 2) * 1000.0 / CLOCK_TICKS, per_second.call(:requests, 0),
              per_request.call(:requests, 3), per_second.call(:timer, 0),
              per_second.call(:timer, 1) * 100.0 / CLOCK_TICKS, per_second.call(:flusher, 1) * 100.0 / CLOCK_TICKS)
end
puts "(req: puma's request threads, CPU a request in user and system time, context switches a second (voluntary " \
     "and not), minor page faults a request; timer and flusher CPU: share of one core)"
