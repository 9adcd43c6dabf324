# frozen_string_literal: true

# What a retention report (Collector#retention_report) costs on a big heap:
# the whole report's time, the parent's pause for the fork, and the memory
# the walking child writes (its private pages: copied from the parent's on
# write, or its own). Each run is a fresh process holding about `--objects`
# live objects, in one of two shapes:
#
#   cache: a Hash of N/2 String keys to N/2 Strings, under a constant,
#          profiled at the defaults: the sampled objects are two hops from a
#          root, and the walk stops once their paths are known;
#   chain: N one-element Arrays, each holding the next, under a constant,
#          with a 100-byte String at the far end, the one object sampled:
#          the walk must reach every object before it finds that path.
#
#   ruby -Ilib bench/retention.rb [--objects 2000000] [--runs 3]
#
# Medians over the runs, with the range. The bounds are lifted (timeout 600
# s, max_memory_mb 4096), so that the whole walk is measured.

require "optparse"
require "rbconfig"
require "json"
require_relative "lib/report"

def worker(shape, count)
  require "memprofiler_pprof_rs"
  case shape
  when "cache"
    collector = MemprofilerPprof::Collector.new.tap(&:start!)
    cache = {}
    (count / 2).times { |i| cache["key #{i}"] = "value #{i} " * 8 }
    Object.const_set(:BENCH_CACHE, cache)
    options = { top: 5, per_site: 3 }
  when "chain"
    collector = build_chain(count)
    options = { top: 1, per_site: 1, sites: ["String#center"] }
  end
  GC.start
  live = ObjectSpace.count_objects.then { |c| c[:TOTAL] - c[:FREE] }
  rss_kb = File.read("/proc/self/status")[/VmRSS:\s+(\d+)/, 1].to_i
  report = collector.retention_report(**options, timeout: 600, max_objects: count * 3, max_memory_mb: 4096)
  found = report.sites.sum { |site| site["objects"].count { |o| o["path"] } }
  puts JSON.generate(live: live, rss_mb: rss_kb / 1024.0, seconds: report.seconds, fork_ms: report.fork_seconds * 1000,
                     child_mb: report.child_private_bytes.to_f / (1 << 20), reached: report.objects_reached,
                     found: found, stopped: report.stopped)
end

# The chain is built before the collector starts, so that the String at
# its end is the one object sampled (at rate 1.0); only the constant holds
# it once this returns.
def build_chain(count)
  tail = []
  chain = tail
  count.times { chain = [chain] }
  Object.const_set(:BENCH_CHAIN, chain)
  collector = MemprofilerPprof::Collector.new(sample_rate: 1.0).tap(&:start!)
  tail << "the end of the chain".center(100, ".")
  collector
end

if ARGV.first == "--worker"
  worker(ARGV[1], Integer(ARGV[2]))
  exit
end

objects = 2_000_000
runs = 3
OptionParser.new do |opts|
  opts.on("--objects N", Integer) { |n| objects = n }
  opts.on("--runs N", Integer) { |n| runs = n }
end.parse!

lib = File.expand_path("../lib", __dir__)
results = Hash.new { |h, k| h[k] = [] }
runs.times do
  %w[cache chain].each do |shape|
    out = IO.popen([RbConfig.ruby, "-I", lib, __FILE__, "--worker", shape, objects.to_s], &:read)
    raise "worker failed: #{out}" unless Process.last_status.success?

    results[shape] << JSON.parse(out)
  end
end

puts "Retention report on #{RUBY_DESCRIPTION}, #{runs} fresh processes per shape, median [min-max]"
puts format("%-6s %10s %9s %20s %18s %22s %12s %6s", "shape", "live objs", "RSS MB", "report s",
            "fork pause ms", "child wrote MB", "reached", "paths")
results.each do |shape, list|
  cell = lambda do |key, fmt|
    values = list.map { |r| r[key] }
    "#{format(fmt, BenchReport.median(values))} [#{format(fmt, values.min)}-#{format(fmt, values.max)}]"
  end
  puts format("%-6s %10d %9.0f %20s %18s %22s %12d %6s", shape, BenchReport.median(list.map { |r| r["live"] }),
              BenchReport.median(list.map { |r| r["rss_mb"] }), cell.call("seconds", "%.2f"), cell.call("fork_ms", "%.1f"),
              cell.call("child_mb", "%.0f"), BenchReport.median(list.map { |r| r["reached"] }),
              list.map { |r| r["found"] }.join("/"))
end
