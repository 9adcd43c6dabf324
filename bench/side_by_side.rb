# frozen_string_literal: true

# Two pumas at the same time: one without a profiler and one with a
# configuration, each pinned to a core of its own and loaded by a wrk of its
# own on the other core, in fresh processes each round. Both servers live
# through the same seconds of the machine, so what the machine does meanwhile
# (other tenants, its clock) moves both; halfway through each round they
# swap cores, so that neither keeps the faster one. A round's ratio is the
# geometric mean of its two halves'. Within each half, too, the servers and
# their wrks trade cores every --swap-every seconds (1 by default), so that a
# core slowed for a few seconds (another tenant on its sibling) slows both.
# Pinned, the profiler's own threads (the windows' timer, the flusher) take
# their CPU from their server's core, as they do on a server with no core to
# spare.
#
#   ruby bench/side_by_side.rb                 # the defaults beside no profiler, the Rails-depth app, 12 rounds
#   ruby bench/side_by_side.rb --control       # no profiler beside no profiler: the method's own spread
#   ruby bench/side_by_side.rb --app rails_ar_app.ru --rounds 24 --config "memprofiler_pprof_rs 0.01, mode: :exact"
#
# Linux with at least two CPUs, taskset, puma and wrk (script/bootstrap
# --bench). The profiled server writes a profile every --flush-interval
# seconds (15 by default, as a push to Pyroscope would).

require "optparse"
require_relative "lib/puma_bench"

options = { rounds: 12, seconds: 8, app: "rails_app.ru", config: "memprofiler_pprof_rs 0.01", flush_interval: 15,
            cpus: [0, 1], swap_every: 1.0 }
OptionParser.new do |o|
  o.banner = "usage: ruby bench/side_by_side.rb [options]"
  o.on("--rounds N", Integer, "rounds, each in fresh processes (default 12)") { |v| options[:rounds] = v }
  o.on("--seconds N", Integer, "seconds of wrk in each half of a round (default 8)") { |v| options[:seconds] = v }
  o.on("--app RACKUP", "rails_app.ru (default), rails_ar_app.ru or puma_app.ru") { |v| options[:app] = v }
  o.on("--config NAME", "a configuration of bench/lib/configs.rb (default: the defaults)") { |v| options[:config] = v }
  o.on("--control", "no profiler beside no profiler") { options[:config] = "no profiler, control" }
  o.on("--flush-interval S", Float, "seconds between profiles (default 15)") { |v| options[:flush_interval] = v }
  o.on("--cpus A,B", Array, "the two CPUs (default 0,1)") { |v| options[:cpus] = v }
  o.on("--swap-every S", Float, "seconds between core swaps within a half (default 1; 0: only between halves)") do |v|
    options[:swap_every] = v
  end
end.parse!
def fail_with(message) = abort("side_by_side.rb: #{message}")
options[:cpus] = options[:cpus].map { |c| Integer(c, exception: false) or fail_with("--cpus takes CPU numbers, not #{c}") }
fail_with("--rounds and --seconds must be at least 1") unless options[:rounds].positive? && options[:seconds].positive?
fail_with("--flush-interval must be positive") unless options[:flush_interval].positive?
fail_with("--swap-every must be 0 or more") if options[:swap_every].negative?
fail_with("unknown configuration #{options[:config].inspect}") unless BenchConfigs.known?(options[:config])
fail_with("--cpus takes two different CPUs") unless options[:cpus].size == 2 && options[:cpus].uniq.size == 2
fail_with("reads /proc/PID/task, which this system does not have") unless File.directory?("/proc/self/task")
missing = %w[taskset puma wrk].find { |tool| !system("command -v #{tool} >/dev/null 2>&1") }
fail_with("#{missing} is not installed (script/bootstrap --bench installs puma and wrk)") if missing
unless options[:cpus].all? { |cpu| system("taskset -c #{cpu} true >/dev/null 2>&1") }
  fail_with("cannot run on CPUs #{options[:cpus].join(' and ')} (--cpus)")
end
path, connections = PumaBench::APPS.fetch(options[:app]) do
  fail_with("--app is one of #{PumaBench::APPS.keys.join(', ')}")
end
ENV["BENCH_FLUSH_INTERVAL"] = options[:flush_interval].to_s

# Moves every thread of process `pid` to CPU `cpu`; false if it could not
# (the process has ended).
def pin(pid, cpu)
  Process.wait(spawn_pin(pid, cpu))
  Process.last_status.success?
end

# Requests, and CPU seconds by kind of thread, of each server over
# `seconds` of wrk loading both at once (`load`: the path and wrk's
# connections), server i pinned to cpus[i] and its wrk to the other, the two
# trading cores every `swap_every` seconds (0: never).
def half(servers, cpus, load, seconds, swap_every)
  path, connections = load
  servers.each_with_index do |(_, pid), i|
    fail_with("could not move puma #{pid} to CPU #{cpus[i]}") unless pin(pid, cpus[i])
  end
  before = servers.map { |_, pid| [PumaBench.thread_seconds(pid), PumaBench.cpu_seconds(pid)] }
  loads = servers.each_with_index.map do |(url, _), i|
    reader = IO.popen(PumaBench.wrk_command(url + path, seconds, connections, cpu: cpus[1 - i]))
    [reader, Thread.new { reader.read }]
  end
  swap_cores(servers.map(&:last), loads.map { |reader, _| reader.pid }, cpus, seconds, swap_every)
  requests = loads.map do |reader, output|
    out = output.value
    reader.close
    PumaBench.wrk_result(out, Process.last_status.success?)[:requests]
  rescue RuntimeError => e
    fail_with(e.message.lines.first.chomp) # wrk failed or completed no request
  end
  servers.each_with_index.map do |(_, pid), i|
    threads = PumaBench.thread_seconds(pid).to_h { |kind, s| [kind, s - before[i][0].fetch(kind, 0.0)] }
    { requests: requests[i], threads: threads, cpu: PumaBench.cpu_seconds(pid) - before[i][1] }
  end
end

# Every `swap_every` seconds until `seconds` have gone by: puma i and wrk i
# trade cores with the other pair (puma i on cpus[i] and wrk i on the other
# to begin with). An even number of intervals (seconds / swap_every) leaves
# each pair as long on each core; otherwise the round's second half, which
# starts the other way round, evens it out. The four moves of a swap run at
# once, in an order that alternates, so that neither server has a core to
# itself while the others move.
def swap_cores(pumas, wrks, cpus, seconds, swap_every)
  return if swap_every.zero?

  began = Process.clock_gettime(Process::CLOCK_MONOTONIC)
  (1...(seconds / swap_every).round).each do |swap|
    sleep([began + (swap * swap_every) - Process.clock_gettime(Process::CLOCK_MONOTONIC), 0].max)
    order = swap.odd? ? cpus.reverse : cpus
    moves = [0, 1].flat_map { |i| [[pumas[i], order[i]], [wrks[i], order[1 - i]]] }
    moves.reverse! if swap.even?
    moves.map { |pid, cpu| spawn_pin(pid, cpu) }.each { |mover| Process.wait(mover) }
  end
end

# Starts moving every thread of process `pid` to CPU `cpu`; the mover's pid.
def spawn_pin(pid, cpu)
  Process.spawn("taskset", "-a", "-p", "-c", cpu.to_s, pid.to_s, out: File::NULL, err: File::NULL)
end

# One round: both servers fresh (which core each starts on alternates), a
# warm-up, then a half on each assignment of the cores. [without, with] per
# half.
def round(index, options, path, connections)
  configs = ["no profiler", options[:config]]
  cpus = index.even? ? options[:cpus] : options[:cpus].reverse
  PumaBench.serve(configs[0], options[:app], cpu: cpus[0]) do |url_a, _, pid_a|
    PumaBench.serve(configs[1], options[:app], cpu: cpus[1]) do |url_b, _, pid_b|
      servers = [[url_a, pid_a], [url_b, pid_b]]
      swap = options[:swap_every]
      load = [path, connections]
      half(servers, cpus, load, 3, 0) # warm-up: caches, templates, the windows' rates
      [half(servers, cpus, load, options[:seconds], swap), half(servers, cpus.reverse, load, options[:seconds], swap)]
    end
  end
end

RATIOS = {
  "requests" => ->(a, b) { b[:requests].fdiv(a[:requests]) },
  "request threads' CPU a request" => lambda { |a, b|
    (b[:threads].fetch(:requests) / b[:requests]) / (a[:threads].fetch(:requests) / a[:requests])
  },
  "process CPU a request" => ->(a, b) { (b[:cpu] / b[:requests]) / (a[:cpu] / a[:requests]) }
}.freeze

puts "#{options[:app]}: #{options[:config].inspect} beside \"no profiler\", at the same time, each on a core of its " \
     "own; #{options[:rounds]} rounds of 2 x #{options[:seconds]} s"
rounds = Array.new(options[:rounds]) do |index|
  halves = round(index, options, path, connections)
  ratios = RATIOS.transform_values { |ratio| Math.sqrt(halves.map { |a, b| ratio.call(a, b) }.reduce(:*)) }
  puts format("round %2d: %s", index + 1, ratios.map { |name, r| format("%s %.3fx", name, r) }.join(", "))
  { ratios: ratios, halves: halves }
end

puts
rows = RATIOS.keys.map do |name|
  values = rounds.map { |r| r[:ratios][name] }
  low, high = BenchReport.median_interval(values)
  [name, format("%.3fx", BenchReport.median(values)), low ? format("[%.3f-%.3f]", low, high) : "(more rounds)"]
end
BenchReport.table(["with / without, paired in time", "median", "95% interval"], rows)
per_request = lambda do |kind|
  ms = rounds.flat_map { |r| r[:halves].map { |_, b| b[:threads].fetch(kind, 0.0) * 1000 / b[:requests] } }
  format("%.2f ms", BenchReport.median(ms))
end
puts "(the profiled server's threads a request, median over the halves: requests #{per_request.call(:requests)}, " \
     "timer #{per_request.call(:timer)}, flusher #{per_request.call(:flusher)}; a round's ratio is the geometric " \
     "mean of its halves', the interval a sign test's)"
