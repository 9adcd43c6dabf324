# frozen_string_literal: true

# What light mode's liveness costs against exact mode's: ~50,000 live
# samples built at sample_rate 1.0 with caps lifted (bench/lib/flush_worker.rb),
# in fresh processes, alternating with "no profiler" and with mode :exact.
#
#   ruby -Ilib bench/liveness.rb [--runs N]
#
# Columns: the build's time per sample over no profiler's (every allocation
# is a sample), the flush's wall time, the collector's own bytes per live
# sample (ObjectSpace.memsize_of) and the process's RSS per live sample over
# no profiler's (Ruby's object id tables included).

require "json"
require "optparse"
require "rbconfig"
require_relative "lib/report"

runs = 5
OptionParser.new do |o|
  o.on("--runs N", Integer) { |n| runs = n }
end.parse!

worker = File.join(__dir__, "lib", "flush_worker.rb")
variants = { "none" => %w[none], "light" => %w[default light], "exact" => %w[default exact] }
results = BenchReport.alternate(variants.keys, runs) do |label|
  BenchReport.run_json(worker, *variants.fetch(label))
end

median = ->(label, key) { BenchReport.median(results[label].map { |r| r[key] }) }
base_build = median.call("none", :build_seconds)
base_rss = median.call("none", :rss_kb)
puts "Ruby #{RUBY_VERSION}, #{runs} runs each (medians)"
rows = %w[light exact].map do |label|
  live = median.call(label, :live_samples)
  per_sample_us = (median.call(label, :build_seconds) - base_build) / median.call(label, :allocations) * 1e6
  [label, live.round.to_s, format("%.2f µs", per_sample_us),
   format("%.0f ms", median.call(label, :flush_seconds) * 1000),
   (median.call(label, :collector_bytes) / live).round.to_s,
   ((median.call(label, :rss_kb) - base_rss) * 1024 / live).round.to_s]
end
BenchReport.table(["mode", "live samples", "per sample", "flush", "memsize B/sample", "RSS B/sample"], rows)
