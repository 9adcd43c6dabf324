# frozen_string_literal: true

# How long a flush stops the program's other threads, and whether the
# collector's memory stays flat between flushes, when sampled stacks are
# many and distinct (issue 36): 300 methods that call each other at random
# to depth 20-60 and allocate a 64-byte String at the bottom, called in a
# loop, flushed every few seconds. Each configuration runs in a fresh
# process.
#
#   ruby -Ilib bench/pause.rb [--seconds 60] [--flush-every 5] [--only NAME]
#
# Per configuration: the longest GVL hold of any flush
# (ProfileData#longest_gvl_hold_nsecs), the longest flush, and the
# process's RSS after the first flush, after the first minute (or half the
# run, if shorter) and at the end. "retains" configurations keep the last
# 100,000 Strings alive ("retains 1M": a million, made at the start), so
# that live samples pile up.

require "optparse"
require "rbconfig"

CONFIGS = {
  "exact 0.01" => "sample_rate: 0.01, mode: :exact",
  "defaults 0.01" => "sample_rate: 0.01",
  "defaults 0.2" => "sample_rate: 0.2",
  "no windows 0.2" => "sample_rate: 0.2, window_budget: nil",
  "no windows 1.0" => "sample_rate: 1.0, window_budget: nil",
  "no windows 0.2, retains, caps 1M" =>
    "sample_rate: 0.2, window_budget: nil, max_heap_samples: 1_000_000, max_allocation_samples: 1_000_000",
  "no windows 1.0, retains, caps 1M" =>
    "sample_rate: 1.0, window_budget: nil, max_heap_samples: 1_000_000, max_allocation_samples: 1_000_000",
  "no windows 1.0, retains 1M, caps 1M" =>
    "sample_rate: 1.0, window_budget: nil, max_heap_samples: 1_000_000, max_allocation_samples: 1_000_000",
  "defaults 0.01, retains 1M" => "sample_rate: 0.01",
  "defaults 0.01, retains 1M, flush thread" => "sample_rate: 0.01",
  "exact 1.0, retains 1M, caps 1M" =>
    "sample_rate: 1.0, mode: :exact, max_heap_samples: 1_000_000, max_allocation_samples: 1_000_000"
}.freeze

# How many of the last Strings a configuration keeps alive.
def retained(name)
  return 1_000_000 if name.include?("retains 1M")

  name.include?("retains") ? 100_000 : 0
end

def worker(options, seconds, flush_every, retains, flush_thread)
  require "memprofiler_pprof_rs"
  srand(1)
  methods = 300
  methods.times do |i|
    # One source per method (define_method's blocks would share one
    # iseq, and so one frame).
    eval(<<~RUBY, binding, "app/m#{i}.rb", 1) # rubocop:disable Security/Eval
      def m#{i}(depth)
        depth <= 0 ? "x" * 64 : send(:"m\#{rand(#{methods})}", depth - 1)
      end
    RUBY
  end
  rss = -> { File.read("/proc/self/status")[/VmRSS:\s+(\d+)/, 1].to_i / 1024.0 }
  now = -> { Process.clock_gettime(Process::CLOCK_MONOTONIC) }
  collector = MemprofilerPprof::Collector.new(**eval("{#{options}}")) # rubocop:disable Security/Eval
  ring = retains.positive? ? Array.new(retains) : nil
  slot = 0
  collector.start!
  # A million live samples from the start (the loop alone takes minutes
  # to keep that many).
  ring.fill { "y" * 64 } if retains >= 1_000_000
  began = now.call
  next_flush = began + flush_every
  flushes = []
  flush = lambda do
    data = collector.flush
    flushes << { at: now.call - began, rss: rss.call, hold: data.longest_gvl_hold_nsecs / 1e6,
                 flush: data.flush_duration_nsecs / 1e6, live: data.heap_samples_count }
  end
  # "flush thread": flushed from a thread of its own (as FileFlusher does)
  # while the main thread allocates.
  flusher = if flush_thread
              Thread.new do
                loop do
                  sleep(flush_every)
                  flush.call
                end
              end
            end
  while now.call - began < seconds
    200.times do
      string = send(:"m#{rand(methods)}", rand(20..60))
      if ring
        ring[slot] = string
        slot = (slot + 1) % ring.size
      end
    end
    next if flusher || now.call < next_flush

    flush.call
    next_flush = now.call + flush_every
  end
  flusher&.kill&.join
  collector.stop!
  flushes
end

def summary(name, flushes, seconds)
  minute = [60.0, seconds / 2.0].min
  after_minute = flushes.find { |f| f[:at] >= minute } || flushes.last
  last = flushes.last
  format("%-36s %8.1f %9.1f %7d %9.0f %9.0f %9.0f %+7.0f%%", name, flushes.map { |f| f[:hold] }.max,
         flushes.map { |f| f[:flush] }.max, flushes.map { |f| f[:live] }.max, flushes.first[:rss],
         after_minute[:rss], last[:rss], 100.0 * (last[:rss] - after_minute[:rss]) / after_minute[:rss])
end

if ARGV.first == "--worker"
  _, options, seconds, flush_every, retains, flush_thread = ARGV
  Marshal.dump(worker(options, Float(seconds), Float(flush_every), Integer(retains), flush_thread == "1"), $stdout)
  exit
end

seconds = 60.0
flush_every = 5.0
only = []
OptionParser.new do |opts|
  opts.on("--seconds N", Float) { |n| seconds = n }
  opts.on("--flush-every N", Float) { |n| flush_every = n }
  opts.on("--only NAME") { |name| only << name }
end.parse!

puts "bench/pause.rb: #{RUBY_DESCRIPTION}; #{seconds.round} s per configuration, a flush every #{flush_every} s"
puts format("%-36s %8s %9s %7s %9s %9s %9s %8s", "configuration", "hold ms", "flush ms", "live",
            "RSS 1st", format("RSS %ds", [60, seconds / 2].min), "RSS end", "growth")
CONFIGS.each do |name, collector_options|
  next unless only.empty? || only.include?(name)

  retains = retained(name).to_s
  out = IO.popen([RbConfig.ruby, "-I", File.expand_path("../lib", __dir__), __FILE__, "--worker", collector_options,
                  seconds.to_s, flush_every.to_s, retains, name.include?("flush thread") ? "1" : "0"], &:read)
  raise "#{name}: the worker failed" unless $?.success? # rubocop:disable Style/SpecialGlobalVars

  puts summary(name, Marshal.load(out), seconds) # rubocop:disable Security/MarshalLoad
end
