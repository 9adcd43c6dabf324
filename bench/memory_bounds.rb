# frozen_string_literal: true

# Does the collector's memory stay flat in a long-running process?
#
#   ruby bench/memory_bounds.rb                     # 10 minutes at 1M objects/s
#   ruby bench/memory_bounds.rb --duration 60 --csv curve.csv
#   ruby bench/memory_bounds.rb --mode light --window-probability 0.25
#
# A Collector with the default options (sample_rate 0.01, caps of 10,000
# allocation and 50,000 heap samples) profiles a process that allocates
# --rate objects per second, paced in 10 ms ticks, for --duration seconds:
# - the objects come from methods compiled at run time (a new module of
#   eval'd methods per --rate allocations, each dropped after five), so stacks, frames
#   and iseqs keep appearing and dying, as in an app that reloads code;
# - a rolling set of 50,000 objects stays alive (entries replaced at
#   random), so live samples die and are replaced all the time;
# - a thread flushes every --interval seconds, as a BlockFlusher would.
# Every interval it prints a row of the curve: RSS, the collector's own
# memory (ObjectSpace.memsize_of), live heap samples, the stacks and frames
# it holds (Ruby frames until a flush names them, then names; if it held on
# to frames no sample uses any more, these would grow with the retired
# code), iseqs alive in the whole VM, profile size.
# At the end it compares the rows after the warm-up (the first 60 s or fifth
# of the run), the peak of their second half against the peak of their
# first, and says whether it is flat: the collector's memory within +10%,
# RSS within +10% + 20 MB, frames held within +25%.
# Exit status 1 if not.

require "optparse"
require "objspace"
$LOAD_PATH.unshift(File.expand_path("../lib", __dir__))
require "memprofiler_pprof_rs"

options = { duration: 600.0, rate: 1_000_000, interval: 10.0, csv: nil, profile: true }
OptionParser.new do |o|
  o.banner = "usage: ruby bench/memory_bounds.rb [options]"
  o.on("--duration SECONDS", Float, "how long (default 600)") { |v| options[:duration] = v }
  o.on("--rate N", Integer, "objects allocated per second (default 1,000,000)") { |v| options[:rate] = v }
  o.on("--interval SECONDS", Float, "flush and report interval (default 10)") { |v| options[:interval] = v }
  o.on("--csv FILE", "also write the curve as CSV") { |v| options[:csv] = v }
  o.on("--mode MODE", %w[exact light], "the collector's mode (default light)") { |v| options[:mode] = v.to_sym }
  o.on("--window-probability Q", Float, "the collector's window_probability (default 1.0)") do |v|
    options[:window_probability] = v
  end
  o.on("--no-profiler", "the same run without the collector started (the app's own curve)") { options[:profile] = false }
end.parse!

def rss_mb
  File.foreach("/proc/self/status") { |l| return l.split[1].to_i / 1024.0 if l.start_with?("VmRSS:") }
  0.0
end

def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)

# Methods compiled at run time, a new generation every second.
class CodeGenerations
  KEEP = 5

  def initialize
    @generations = []
    @serial = 0
  end

  def current = @generations.last

  def next_generation!
    @serial += 1
    mod = Module.new
    # Ten methods, each with its own stack shape, in a file name of its own.
    source = (0...10).map do |m|
      "def self.make#{m}(n, depth = #{m}); " \
        "depth.zero? ? Array.new(n) { |i| \"g#{@serial}m#{m}-\#{i}\" } : make#{m}(n, depth - 1); end"
    end.join("\n")
    mod.module_eval(source, "(generation-#{@serial}.rb)", 1)
    @generations << mod
    @generations.shift while @generations.size > KEEP
  end
end

collector = MemprofilerPprof::Collector.new(mode: options.fetch(:mode, MemprofilerPprof::DEFAULTS[:mode]),
                                            window_probability: options.fetch(:window_probability, 1.0))
collector.start! if options[:profile]
code = CodeGenerations.new
code.next_generation!
retained = Array.new(50_000)
random = Random.new(42)
rows = []
rows_lock = Mutex.new
stop = false

flusher = Thread.new do
  started = now
  next_flush = started + options[:interval]
  until stop
    sleep [next_flush - now, 0.05].min.clamp(0, nil)
    next if now < next_flush

    next_flush += options[:interval]
    flush_started = now
    data = collector.flush
    flush_ms = (now - flush_started) * 1000
    GC.start # so that iseqs counts what is alive, not what awaits sweeping
    iseqs = ObjectSpace.count_imemo_objects[:imemo_iseq] || 0
    stacks, frames, named = collector.__send__(:_native_table_sizes)
    row = {
      t: now - started, rss_mb: rss_mb, collector_kb: ObjectSpace.memsize_of(collector) / 1024.0,
      live_samples: collector.live_heap_samples_count, stacks: stacks, frames: frames, named: named, iseqs: iseqs,
      profile_kb: data.pprof_data.bytesize / 1024.0, flush_ms: flush_ms,
      allocations: data.allocation_samples_count
    }
    rows_lock.synchronize { rows << row }
    puts format("%6.0f s  rss %6.1f MB  collector %7.1f kB  live samples %6d  stacks %5d  frames: Ruby %4d " \
                "named %5d  VM iseqs %6d  profile %6.1f kB  flush %5.1f ms",
                row[:t], row[:rss_mb], row[:collector_kb], row[:live_samples], row[:stacks], row[:frames], row[:named],
                row[:iseqs], row[:profile_kb], row[:flush_ms])
    $stdout.flush
  end
end

puts "memory_bounds: #{RUBY_DESCRIPTION}"
puts format("%d objects/s for %.0f s, default Collector options, flush every %.0f s",
            options[:rate], options[:duration], options[:interval])
per_tick = options[:rate] / 100
started = now
tick = started
# A new generation per second's worth of allocations (not per wall-clock
# second), so how many generations are still alive does not depend on how
# fast this machine is.
next_generation = options[:rate]
allocated = 0
while now - started < options[:duration]
  mod = code.current
  # Every other allocation is one of the generated arrays' elements; the
  # arrays themselves, strings and hashes make up the rest.
  made = 0
  while made < per_tick
    batch = mod.public_send(:"make#{random.rand(10)}", 40) # 41 objects
    retained[random.rand(retained.size)] = batch
    retained[random.rand(retained.size)] = { k: "v" } # 2 objects
    made += 43
  end
  allocated += made
  if allocated >= next_generation
    code.next_generation!
    next_generation += options[:rate]
  end
  tick += 0.01
  behind = tick - now
  sleep behind if behind.positive?
end
elapsed = now - started
stop = true
flusher.join

rate = allocated / elapsed
puts format("allocated %d objects in %.0f s: %.2f M/s", allocated, elapsed, rate / 1e6)
warmup = [60.0, options[:duration] / 5].min
after = rows.select { |r| r[:t] >= warmup }
if after.size < 2
  puts "too short to judge flatness (need rows after the #{warmup.round} s warm-up)"
  exit 0
end
# Values swing with what happens to be alive at each flush, so compare the
# highest value of the second half of the run with that of the first half.
first, second = after.each_slice((after.size + 1) / 2).to_a
peak = ->(half, key) { half.map { |r| r[key] }.max.to_f }
collector_growth = peak.call(second, :collector_kb) / peak.call(first, :collector_kb) - 1
rss_growth_mb = peak.call(second, :rss_mb) - peak.call(first, :rss_mb)
# The generated methods are retired at a steady rate; if the collector held
# on to frames no sample uses, the frames it holds would grow with them.
held = ->(r) { r[:frames] + r[:named] }
frames_growth = second.map(&held).max.to_f / [first.map(&held).max, 1].max - 1
stack_range = after.map { |r| r[:stacks] }.minmax
frame_range = after.map(&held).minmax
flat = collector_growth <= 0.10 && rss_growth_mb <= peak.call(first, :rss_mb) * 0.10 + 20 && frames_growth <= 0.25
puts format("after the %.0f s warm-up, peak of the second half against the first: collector memory %.1f -> %.1f kB " \
            "(%+.1f%%), RSS %.1f -> %.1f MB (%+.1f MB), frames held (Ruby + named) %d -> %d (%+.0f%%); stacks held %d..%d, " \
            "frames held %d..%d: %s",
            warmup, peak.call(first, :collector_kb), peak.call(second, :collector_kb), collector_growth * 100,
            peak.call(first, :rss_mb), peak.call(second, :rss_mb), rss_growth_mb, first.map(&held).max, second.map(&held).max,
            frames_growth * 100, *stack_range, *frame_range, flat ? "FLAT" : "GROWING")
if options[:csv]
  lines = [rows.first.keys.join(",")] + rows.map { |r| r.values.map { |v| v.is_a?(Float) ? v.round(2) : v }.join(",") }
  File.write(options[:csv], "#{lines.join("\n")}\n")
  puts "curve written to #{options[:csv]}"
end
exit(flat ? 0 : 1)
