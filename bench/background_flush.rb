# frozen_string_literal: true

# How long a flush from a thread of its own (as FileFlusher runs it) takes
# while another thread keeps the CPU busy: each time the flush lets other
# threads run, the busy one may keep the GVL for a whole time slice (100 ms),
# so the number of yields sets the flush's wall time. 300,000 live samples,
# each mode in a fresh process.
#
#   ruby -Ilib bench/background_flush.rb [--live N] [--runs N]

require "optparse"
require "rbconfig"

live = 300_000
runs = 1
OptionParser.new do |o|
  o.on("--live N", Integer) { |n| live = n }
  o.on("--runs N", Integer) { |n| runs = n }
end.parse!

WORKER = <<~RUBY
  require "memprofiler_pprof_rs"
  collector = MemprofilerPprof::Collector.new(sample_rate: 1.0, mode: ARGV[0].to_sym,
                                              max_heap_samples: 1_000_000, max_allocation_samples: 10_000)
  collector.start!
  kept = Array.new(Integer(ARGV[1])) { |i| "kept \#{i}" }
  GC.start
  collector.stop!
  stop = false
  busy = Thread.new { x = 0; x += 1 until stop }
  began = Process.clock_gettime(Process::CLOCK_MONOTONIC)
  data = Thread.new { collector.flush }.value
  took = Process.clock_gettime(Process::CLOCK_MONOTONIC) - began
  stop = true
  busy.join
  printf("%-6s %9.2f %9.1f %9d\\n", ARGV[0], took, data.longest_gvl_hold_nsecs / 1e6, kept.size)
RUBY

puts "bench/background_flush.rb: #{RUBY_DESCRIPTION}; #{live} live samples"
puts format("%-6s %9s %9s %9s", "mode", "flush s", "hold ms", "live")
runs.times do
  %w[exact light].each do |mode|
    system(RbConfig.ruby, "-I#{File.expand_path('../lib', __dir__)}", "-e", WORKER, mode, live.to_s,
           exception: true)
  end
end
