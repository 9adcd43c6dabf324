# frozen_string_literal: true

# How a full live map (max_heap_samples) changes in-use estimates at the
# default windows.
#
#   ruby bench/live_map.rb                        # caps 300, 1,000 and 4,000; 30 seeds each
#   ruby bench/live_map.rb --caps 300 --seeds 10
#   ruby bench/live_map.rb --exact                # mode: :exact, window_budget: nil instead
#
# Each run is a fresh process: a 0.1 s loop of 400,000 iterations, each
# allocating a short-lived String, and every 100th keeping one more
# ("kept #{i}": 4,000 kept in all), profiled at sample_rate 0.1 with the
# default windows; GC.start, then one flush. A small cap fills the live map
# with the loop's garbage over and over, so it is thinned many times while
# warm-up samples (weight 10) and window samples (weight in the hundreds)
# are mixed in it. The table gives the kept Strings' inuse_objects over
# the truth (4,000) across seeds, and the samples thinned out.

require "English"
require "optparse"
require "rbconfig"

options = { caps: [300, 1_000, 4_000], seeds: 30, worker: nil, exact: false }
OptionParser.new do |o|
  o.banner = "usage: ruby bench/live_map.rb [options]"
  o.on("--caps A,B", Array, "max_heap_samples to try (default 300,1000,4000)") do |v|
    options[:caps] = v.map { |c| Integer(c) }
  end
  o.on("--seeds N", Integer, "fresh processes per cap (default 30)") { |v| options[:seeds] = v }
  o.on("--exact", "mode :exact without windows instead of the defaults") { options[:exact] = true }
  o.on("--worker CAP,SEED", Array) { |v| options[:worker] = v.map { |c| Integer(c) } }
end.parse!

KEPT = 4_000

def kept_string(index) = "kept #{index}"

# One run: prints the estimate, the Strings kept and the samples thinned out.
def run_worker(cap, seed, exact)
  $LOAD_PATH.unshift(File.expand_path("../lib", __dir__))
  require "memprofiler_pprof_rs"
  mode = exact ? { mode: :exact, window_budget: nil } : {}
  collector = MemprofilerPprof::Collector.new(sample_rate: 0.1, max_heap_samples: cap,
                                              max_allocation_samples: 10, seed: seed, **mode)
  collector.start!
  kept = []
  (KEPT * 100).times do |i|
    i.to_s
    kept << kept_string(i) if (i % 100).zero?
  end
  GC.start
  data = collector.flush
  collector.stop!
  profile = MemprofilerPprof::PprofReader.parse(data.pprof_data)
  inuse = profile.sample_type_names.index("inuse_objects")
  estimate = profile.samples.select { |s| s.frames.first&.name == "Object#kept_string" }
                    .sum { |s| s.values[inuse] }
  puts [estimate, kept.size, data.dropped_samples_heap_bufsize].join(" ")
end

if options[:worker]
  run_worker(*options[:worker], options[:exact])
  exit
end

def quantile(sorted, q) = sorted[((sorted.size - 1) * q).round]

puts "| max_heap_samples | runs | mean | sd | p10-p90 | min-max | thinned out (median) |"
puts "|---|---|---|---|---|---|---|"
options[:caps].each do |cap|
  rows = Array.new(options[:seeds]) do |seed|
    args = ["--worker", "#{cap},#{seed + 1}", *("--exact" if options[:exact])]
    out = IO.popen([RbConfig.ruby, __FILE__, *args], &:read)
    abort "worker failed: cap #{cap} seed #{seed + 1}" unless $CHILD_STATUS.success?
    out.split.map(&:to_f)
  end
  ratios = rows.map { |row| row.first / KEPT }.sort
  mean = ratios.sum / ratios.size
  sd = Math.sqrt(ratios.sum { |r| (r - mean)**2 } / [ratios.size - 1, 1].max)
  thinned = rows.map(&:last).sort
  puts format("| %d | %d | %.2f | %.2f | %.2f-%.2f | %.2f-%.2f | %d |", cap, ratios.size, mean, sd,
              quantile(ratios, 0.1), quantile(ratios, 0.9), ratios.first, ratios.last, quantile(thinned, 0.5))
end
