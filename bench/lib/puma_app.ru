# frozen_string_literal: true

# (4) The Rack application bench/run puma serves: each request builds a page
# of 40 records (Hashes of Strings, Integers, Times), renders them as JSON
# and as an HTML table, about what a small Rails action allocates.
#
# BENCH_PROFILER names a configuration of bench/lib/configs.rb; when it is
# this gem, a FileFlusher writes a profile into BENCH_PROFILE_DIR every
# BENCH_FLUSH_INTERVAL seconds (bench/run --flush-interval; 1 unless given,
# a far shorter interval than production's).

require "json"
require "objspace"
require "memprofiler_pprof_rs"
require_relative "configs"

BenchConfigs.fetch(ENV.fetch("BENCH_PROFILER")).call
BenchConfigs.start_flusher

# A page of records, as JSON and as HTML.
class Catalog
  NAMES = %w[anvil bolt crate drill easel flange gasket hinge ingot jack].freeze

  def call(env)
    page = env["QUERY_STRING"].to_s[/page=(\d+)/, 1].to_i
    records = Array.new(40) { |i| record(page * 40 + i) }
    json = JSON.generate(records)
    rows = records.map { |r| "<tr><td>#{r[:id]}</td><td>#{escape(r[:name])}</td><td>#{format('%.2f', r[:price])}</td></tr>" }
    html = "<table>#{rows.join}</table>"
    [200, { "content-type" => "text/html", "x-json-bytes" => json.bytesize.to_s }, [html]]
  end

  private

  def record(id)
    { id: id, name: "#{NAMES[id % NAMES.size]}-#{id}", price: (id * 7919 % 10_000) / 100.0,
      tags: NAMES.sample(3, random: Random.new(id)), updated_at: Time.at(1_700_000_000 + id).utc.iso8601 }
  end

  def escape(text) = text.gsub("&", "&amp;").gsub("<", "&lt;")
end

use MemprofilerPprof::RackLabels if BenchConfigs.rack_labels
run Catalog.new
