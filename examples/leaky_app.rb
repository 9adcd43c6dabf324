# frozen_string_literal: true

# A small "web app" with a memory leak, profiled with memprofiler_pprof_rs.
#
#   ruby -Ilib examples/leaky_app.rb [OUTPUT_DIR]
#
# Each simulated request renders a page (lots of short-lived strings and
# arrays) and stores it in a cache keyed by the request id, which never
# repeats and is never evicted: the leak. Every interval the collector is
# flushed to OUTPUT_DIR/heap-PID-N.pprof.

require "memprofiler_pprof_rs"
require "fileutils"

class PageRenderer
  def render(request_id)
    rows = (1..20).map { |i| "<tr><td>#{request_id}</td><td>#{i * i}</td></tr>" }
    "<table>#{rows.join}</table>"
  end
end

class PageCache
  def initialize
    @pages = {}
  end

  # Never evicts anything: every distinct key stays forever.
  def fetch(key)
    @pages[key] ||= yield
  end

  def size
    @pages.size
  end
end

class App
  def initialize
    @renderer = PageRenderer.new
    @cache = PageCache.new
  end

  attr_reader :cache

  def handle(request_id)
    headers = { "content-type" => "text/html", "x-request-id" => request_id.to_s }
    body = @cache.fetch("page:#{request_id}") { @renderer.render(request_id) }
    [200, headers, [body]]
  end
end

out_dir = ARGV[0] || "tmp/demo"
FileUtils.mkdir_p(out_dir)

app = App.new
collector = MemprofilerPprof::Collector.new(sample_rate: 0.02)
collector.start!
request_id = 0
3.times do |interval|
  3_000.times { app.handle(request_id += 1) }
  GC.start # let the garbage die, so "in use" shows what really stays
  data = collector.flush
  path = File.join(out_dir, format("heap-%<pid>d-%<n>d.pprof", pid: Process.pid, n: interval))
  File.binwrite(path, data.pprof_data)
  puts "wrote #{path}: #{data}"
end
# What holds the biggest sites' memory: the chain of references from a GC
# root to a few of their sampled objects (walked in a forked child).
puts collector.retention_report(top: 2, per_site: 2)
collector.stop!
puts "cache holds #{app.cache.size} pages"
