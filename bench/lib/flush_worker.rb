# frozen_string_literal: true

# (5) Flush cost, in a fresh process: builds 50,000 live samples (sample
# rate 1.0, caps lifted) across thousands of stacks with the scenario's call
# chains, then flushes once while another thread ticks every millisecond
# and records its longest gap (how long the flush kept the GVL).
#
#   ruby -Ilib bench/lib/flush_worker.rb VARIANT [MODE]
#
# MODE: light (the default) or exact. build_seconds: the build's time (every
# allocation a sample), to compare with "none" for the cost per sample.
# VARIANT: none (no profiler: the RSS baseline), default (flush's default
# keywords), plain (no GVL release at all), yield_gvl, proactive,
# limit_met (a max_profile_bytes the profile meets: built once, kept and
# gzipped), pyroscope (PyroscopeFlusher's limits: 2,000,000 bytes, 16,000
# samples, the class as a frame), bytes_folded (a max_profile_bytes of
# 500,000 the profile exceeds: sizes measured by extra builds).

require "json"
require "objspace"
require "zlib"
require "memprofiler_pprof_rs"
require_relative "workloads"

def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)
def rss_kb = File.read("/proc/self/status")[/^VmRSS:\s+(\d+)/, 1].to_i

LIVE_SAMPLES = 50_000
variant = ARGV.fetch(0)
options = {
  "default" => {}, "plain" => { yield_gvl: false, proactively_yield_gvl: false },
  "yield_gvl" => { yield_gvl: true, proactively_yield_gvl: false },
  "proactive" => { yield_gvl: true, proactively_yield_gvl: true },
  "limit_met" => { max_profile_bytes: 1_000_000_000 },
  "pyroscope" => { max_profile_bytes: 2_000_000, max_profile_samples: 16_000, sample_labels: :class_frame },
  "bytes_folded" => { max_profile_bytes: 500_000 }
}
collector = nil
unless variant == "none"
  collector = MemprofilerPprof::Collector.new(sample_rate: 1.0, max_allocation_samples: 100_000_000,
                                              max_heap_samples: 100_000_000, mode: ARGV.fetch(1, "light").to_sym)
  collector.start!
end

ctx = BenchWorkloads::Scenario::Context.new(7, retain_all: true)
chains = 0
build_began = now
allocated_before = GC.stat(:total_allocated_objects)
loop do
  1_000.times do |n|
    ctx.start_chain(true)
    BenchWorkloads::Scenario::Calls.s0(ctx, 0, n)
  end
  chains += 1_000
  # The same number of chains for every variant, so RSS compares like with like.
  break if chains >= 28_000
end
build_seconds = now - build_began
GC.start
result = { rss_kb: rss_kb, retained: ctx.retained.size, build_seconds: build_seconds,
           allocations: GC.stat(:total_allocated_objects) - allocated_before }
if collector
  # The allocation samples of the build, and every frame and method named
  # for the first time (later flushes find methods' blocks in a cache).
  began = now
  collector.flush
  result[:first_flush_seconds] = now - began
  result[:live_samples] = collector.live_heap_samples_count
  result[:collector_bytes] = ObjectSpace.memsize_of(collector)
  longest = 0.0
  ticking = true
  ticker = Thread.new do
    last = now
    while ticking
      sleep 0.001
      t = now
      longest = t - last if t - last > longest
      last = t
    end
  end
  sleep 0.05
  longest = 0.0
  began = now
  data = collector.flush(**options.fetch(variant))
  result[:flush_seconds] = now - began
  sleep 0.005
  ticking = false
  ticker.join
  result[:longest_gap_seconds] = longest
  result[:rss_after_flush_kb] = rss_kb
  result[:profile_bytes] = data.pprof_data.bytesize
  result[:heap_samples] = data.heap_samples_count
  result[:folded_samples] = data.folded_samples_count
  result[:raw_bytes] = Zlib.gunzip(data.pprof_data).bytesize
end
puts JSON.generate(result)
