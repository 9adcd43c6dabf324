# frozen_string_literal: true

# The longest single allocation while the live map fills up and is
# thinned: everything the NEWOBJ hook does for one sample (admission,
# thinning, recording) happens inside one allocation, with the GVL held.
#
#   ruby -Ilib bench/hook_stalls.rb                       # caps 50,000 and 1,000,000
#   ruby -Ilib bench/hook_stalls.rb --caps 1000000 --keep 3000000
#
# Each cap runs in a fresh process: a loop keeps KEEP Strings alive (so the
# live map fills and is thinned again and again), every allocation sampled
# (sample_rate 1.0, no windows, mode :exact), timing each iteration. The
# table gives the longest iteration, the 99.99th percentile, and how many
# took over 1 ms and over 10 ms. Iterations in which Ruby collected
# garbage are left out (they time the GC); the same loop without the
# profiler is the first row.

require "English"
require "json"
require "optparse"
require "rbconfig"

options = { caps: [50_000, 1_000_000], keep: 2_500_000, worker: nil }
OptionParser.new do |o|
  o.banner = "usage: ruby -Ilib bench/hook_stalls.rb [options]"
  o.on("--caps A,B", Array, "max_heap_samples to try (default 50000,1000000)") do |v|
    options[:caps] = v.map { |cap| Integer(cap) }
  end
  o.on("--keep N", Integer, "Strings kept alive (default 2,500,000)") { |v| options[:keep] = v }
  o.on("--worker CAP,KEEP", Array) { |v| options[:worker] = v.map { |n| Integer(n) } }
end.parse!

# One run (cap 0: no profiler): prints the iteration times' figures.
def run_worker(cap, keep)
  $LOAD_PATH.unshift(File.expand_path("../lib", __dir__))
  require "memprofiler_pprof_rs"
  if cap.positive?
    collector = MemprofilerPprof::Collector.new(sample_rate: 1.0, mode: :exact, window_budget: nil,
                                                max_heap_samples: cap, max_allocation_samples: 10_000)
    collector.start!
  end
  kept = Array.new(keep)
  times = Array.new(keep)
  clock = Process.method(:clock_gettime)
  last = clock.call(Process::CLOCK_MONOTONIC, :nanosecond)
  gcs = GC.count
  keep.times do |i|
    kept[i] = +"kept"
    now = clock.call(Process::CLOCK_MONOTONIC, :nanosecond)
    # (An iteration in which Ruby collected garbage times the GC.)
    times[i] = GC.count == gcs ? now - last : 0
    gcs = GC.count
    last = now
  end
  dropped = collector ? collector.flush.dropped_samples_heap_bufsize : 0
  collector&.stop!
  times.sort!
  puts JSON.generate(longest: times.last, p9999: times[(times.size * 0.9999).floor],
                     over_1ms: times.count { |t| t > 1_000_000 }, over_10ms: times.count { |t| t > 10_000_000 },
                     thinned: dropped)
end

if options[:worker]
  run_worker(*options[:worker])
  exit
end

puts "| max_heap_samples | longest | 99.99th percentile | over 1 ms | over 10 ms | thinned out |"
puts "|---|---|---|---|---|---|"
[0, *options[:caps]].each do |cap|
  out = IO.popen([RbConfig.ruby, __FILE__, "--worker", "#{cap},#{options[:keep]}"], &:read)
  abort "worker failed: cap #{cap}" unless $CHILD_STATUS.success?
  row = JSON.parse(out)
  puts format("| %s | %.1f ms | %.3f ms | %d | %d | %d |", cap.zero? ? "no profiler" : cap, row["longest"] / 1e6,
              row["p9999"] / 1e6, row["over_1ms"], row["over_10ms"], row["thinned"])
end
