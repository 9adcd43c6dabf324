# frozen_string_literal: true

require_relative "report"

# (5) Flush cost with 50,000 live samples (see flush_worker.rb).
module FlushBench
  VARIANTS = {
    "flush (defaults)" => "default",
    "flush(yield_gvl: false, proactively_yield_gvl: false)" => "plain",
    "flush(yield_gvl: true, proactively_yield_gvl: false)" => "yield_gvl",
    "flush(max_profile_bytes: 10**9) (met)" => "limit_met",
    "PyroscopeFlusher's limits" => "pyroscope",
    "flush(max_profile_bytes: 500_000) (folded)" => "bytes_folded"
  }.freeze

  module_function

  def run(runs)
    worker = File.join(__dir__, "flush_worker.rb")
    results = BenchReport.alternate(VARIANTS.keys + ["no profiler"], runs) do |label|
      BenchReport.run_json(worker, VARIANTS.fetch(label, "none"))
    end
    base_rss = BenchReport.median(results["no profiler"].map { |r| r[:rss_kb] })
    puts
    puts "(5) flush of ~50,000 live samples (sample_rate 1.0, caps lifted) over ~#{stacks_note}; " \
         "GVL hold = longest gap seen by a thread ticking every 1 ms, minus 1 ms; first flush = the one " \
         "before, of the build's allocations, which names every frame and method for the first time"
    rows = VARIANTS.keys.map do |label|
      list = results[label]
      m = ->(key) { BenchReport.median(list.map { |r| r[key] }) }
      live = m.call(:live_samples)
      [label, live.round.to_s, format("%.0f ms", m.call(:flush_seconds) * 1000),
       format("%.0f ms", m.call(:first_flush_seconds) * 1000),
       format("%.1f ms", [m.call(:longest_gap_seconds) - 0.001, 0].max * 1000),
       format("%.0f KB", m.call(:profile_bytes) / 1024.0),
       format("%.0f KB", m.call(:raw_bytes) / 1024.0),
       m.call(:folded_samples).round.to_s,
       (m.call(:collector_bytes) / live).round.to_s,
       ((m.call(:rss_kb) - base_rss) * 1024 / live).round.to_s]
    end
    BenchReport.table(["flush", "live samples", "wall", "first flush", "GVL hold", "profile", "raw", "folded", "memsize B/sample",
                       "RSS B/sample"], rows)
  end

  def stacks_note = "4,000 call paths of depth 1-100"
end
