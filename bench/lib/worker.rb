# frozen_string_literal: true

# Runs one workload under one profiler configuration in this (fresh)
# process and prints the result as one JSON line. Started by bench/run:
#
#   ruby -Ilib bench/lib/worker.rb WORKLOAD "CONFIGURATION" [ITERATIONS]
#
# With ITERATIONS (bench/run callgrind, under valgrind) a loop workload runs
# that many iterations and the profiler is stopped without reading out its
# results, so that the instruction count is the workload's and the hooks'.

require "json"
require "objspace"
require "memprofiler_pprof_rs"
require_relative "workloads"
require_relative "configs"

def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)

def rss_kb
  File.read("/proc/self/status")[/^VmRSS:\s+(\d+)/, 1].to_i
end

workload, config, iterations = ARGV
size = iterations ? [Integer(iterations)] : []
BenchWorkloads::WARMUPS.fetch(workload).call
GC.start
peak = {}
excluded = 0.0
stop = BenchConfigs.fetch(config).call
allocated_before = GC.stat(:total_allocated_objects)
started = now
if workload == "scenario"
  # At the retained set's peak: memory, and the cost of flushing that state
  # (taken out of the workload's time).
  at_peak = lambda do |ctx|
    began = now
    peak[:rss_kb] = rss_kb
    peak[:retained_objects] = ctx.retained.size
    if (collector = $bench_collector)
      peak[:live_samples] = collector.live_heap_samples_count
      peak[:collector_bytes] = ObjectSpace.memsize_of(collector)
      flush_began = now
      data = collector.flush(yield_gvl: true)
      peak[:flush_seconds] = now - flush_began
      peak[:profile_bytes] = data.pprof_data.bytesize
    end
    excluded += now - began
  end
  BenchWorkloads::Scenario.run(at_peak: at_peak)
else
  BenchWorkloads::ALL.fetch(workload).call(*size)
end
seconds = now - started - excluded
allocated = GC.stat(:total_allocated_objects) - allocated_before
extra = stop&.call(report: iterations.nil?) || {}
# How far the gem's per-class estimates are from what the loop allocated:
# the largest relative error over the classes it allocates.
if (by_class = extra.delete(:allocated_by_class)) && (truth = BenchWorkloads::CLASS_COUNTS[workload])
  extra[:estimate_error] = truth[:per_iteration].map do |klass, per_iteration|
    expected = per_iteration * truth[:iterations]
    (by_class[klass] - expected).abs / expected.to_f
  end.max
end
puts JSON.generate({ seconds: seconds, rss_kb: rss_kb, peak: peak, allocated: allocated }.merge(extra))
