# frozen_string_literal: true

# Whether a short profile's reported error covers its real error: the
# in-use total's relative standard error (ProfileData#relative_standard_errors)
# against the known truth, over many seeds, at the default windows.
#
#   ruby bench/short_profile_errors.rb                      # lengths 1 and 5, 40 seeds each
#   ruby bench/short_profile_errors.rb --lengths 1 --seeds 100
#   ruby bench/short_profile_errors.rb --warm-up-edge --seeds 40
#
# Each run is a fresh process: a loop of LENGTH x 400,000 iterations, each
# allocating a short-lived String, and every 100th keeping one more
# (LENGTH x 4,000 kept), profiled at sample_rate 0.1 with the default
# windows; GC.start, then one flush. At length 1 (about 0.1 s) the warm-up
# takes 250,000 allocations sampled in full and the rest falls to two or
# three windows, which catch a few kept Strings each, or none. The table
# gives, per length, how many runs had the truth within 2 and 2.5 reported
# standard errors (z = (estimate / truth - 1) / RSE), the largest |z|, the
# real spread (root mean square of estimate / truth - 1) and the mean
# reported RSE.
#
# --warm-up-edge instead keeps LENGTH x 200,000 Strings, each made beside a
# short-lived one (three allocations), so that they straddle the warm-up's
# end (250,000 allocations), then flushes: in some runs no window has come
# yet after the warm-up, and what was kept after it is what the errors
# must own up to.

require "English"
require "json"
require "optparse"
require "rbconfig"

options = { lengths: [1, 5], seeds: 40, worker: nil, edge: false }
OptionParser.new do |o|
  o.banner = "usage: ruby bench/short_profile_errors.rb [options]"
  o.on("--lengths A,B", Array, "loop lengths, in units of 400,000 iterations (default 1,5)") do |v|
    options[:lengths] = v.map { |length| Float(length) }
  end
  o.on("--seeds N", Integer, "fresh processes per length (default 40)") { |v| options[:seeds] = v }
  o.on("--warm-up-edge", "keep Strings on both sides of the warm-up's end instead") { options[:edge] = true }
  o.on("--worker LENGTH,SEED,EDGE", Array) do |v|
    options[:worker] = [Float(v[0]), Integer(v[1]), v[2] == "edge"]
  end
end.parse!

def kept_string(index) = "kept #{index}"

def junk = +"junk"

# The loop: every 100th String kept, or (edge) every other allocation kept.
def keep_strings(length, edge)
  if edge
    Array.new((length * 200_000).to_i) { |i| junk && kept_string(i) }
  else
    (length * 400_000).to_i.times.filter_map do |i|
      i.to_s
      kept_string(i) if (i % 100).zero?
    end
  end
end

# One run: prints the in-use total, the truth and the reported RSE.
def run_worker(length, seed, edge)
  $LOAD_PATH.unshift(File.expand_path("../lib", __dir__))
  require "memprofiler_pprof_rs"
  collector = MemprofilerPprof::Collector.new(sample_rate: 0.1, max_allocation_samples: 10, seed: seed)
  collector.start!
  kept = keep_strings(length, edge)
  GC.start
  data = collector.flush
  collector.stop!
  profile = MemprofilerPprof::PprofReader.parse(data.pprof_data)
  inuse = profile.sample_type_names.index("inuse_objects")
  total = profile.samples.sum { |s| s.values[inuse] }
  puts JSON.generate(total: total, truth: kept.size, rse: data.relative_standard_errors[:inuse_objects])
end

if options[:worker]
  run_worker(*options[:worker])
  exit
end

puts "| length | runs | within 2 RSE | within 2.5 RSE | largest \\|z\\| | real spread | mean RSE |"
puts "|---|---|---|---|---|---|---|"
options[:lengths].each do |length|
  rows = Array.new(options[:seeds]) do |seed|
    worker = "#{length},#{seed + 1},#{options[:edge] ? 'edge' : 'kept'}"
    out = IO.popen([RbConfig.ruby, __FILE__, "--worker", worker], &:read)
    abort "worker failed: length #{length} seed #{seed + 1}" unless $CHILD_STATUS.success?
    JSON.parse(out)
  end
  errors = rows.map { |row| (row["total"].to_f / row["truth"]) - 1 }
  # A profile without samples says "unknown": infinitely wide, never wrong.
  zs = rows.zip(errors).map do |row, error|
    rse = row["rse"]
    if rse.nil?
      0.0
    elsif rse.positive?
      (error / rse).abs
    else
      error.zero? ? 0.0 : Float::INFINITY
    end
  end
  spread = Math.sqrt(errors.sum { |e| e * e } / errors.size)
  mean_rse = rows.sum { |row| row["rse"] || 0.0 } / rows.size
  puts format("| %g | %d | %d | %d | %.1f | %.3f | %.3f |", length, rows.size, zs.count { |z| z <= 2 },
              zs.count { |z| z <= 2.5 }, zs.max, spread, mean_rse)
end
