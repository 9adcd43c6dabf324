# frozen_string_literal: true

# One run of bench/truth's ground-truth workload in this (fresh) process:
#
#   ruby -Ilib bench/lib/truth_worker.rb server  CONFIG SEED INTERVAL DURATION DIR [IDLE_MS]
#   ruby -Ilib bench/lib/truth_worker.rb phased  CONFIG SEED DIR
#
# CONFIG is "defaults" (Collector.new(sample_rate: 0.01)), "exact"
# (mode: :exact, window_budget: nil) or "budget:N" (the defaults with
# window_budget: N). Each flush's profile is written to DIR
# beside a JSON line of what was really allocated and alive (what
# bench/truth compares the profile with); the line also goes to stdout.
# IDLE_MS: sleep that long after every 10th request, as a server waits
# for its next request (the allocations come in bursts after each wait).
#
# Every site allocates a known number of objects, one per call of a method
# that allocates exactly one, so each interval's truth per site is exact (a
# calibration at start checks that against GC.stat and refuses to run if a
# Ruby allocates more).

require "json"
require "memprofiler_pprof_rs"

module TruthWorkload
  # TRUTH_REQUEST_SCALE=K makes each request K times longer: every site
  # allocates K times as many in one run (the leak and the ring do not
  # scale), so a site's allocations come in runs longer than a window.
  REQUEST_SCALE = Integer(ENV.fetch("TRUTH_REQUEST_SCALE", "1"))
  # TRUTH_INTERRUPT_EVERY=N: every Nth flush has an exception raised into
  # it by another thread once it holds its lock, as Timeout would. It
  # returns no profile, so its interval's truth is added to the next one's
  # (whose profile must then count both).
  INTERRUPT_EVERY = Integer(ENV.fetch("TRUTH_INTERRUPT_EVERY", "0"))
  # TRUTH_LEAK_PER_REQUEST=N: each request leaks N Strings (a leak with N
  # times the samples, whose estimate is then read with less spread).
  LEAK_PER_REQUEST = Integer(ENV.fetch("TRUTH_LEAK_PER_REQUEST", "1"))

  Interrupted = Class.new(StandardError)
  # Allocations per request, by site: shares of 1,000 (times the scale).
  PER_REQUEST = {
    "site50" => 500, "site20" => 200, "site10" => 100, "site5" => 50,
    "site1" => 10, "site01" => 1, "other" => 120
  }.transform_values { |n| n * REQUEST_SCALE }.freeze
  # Every 100th request, this many more: 0.1% of allocations, in bursts.
  BURST = 100 * REQUEST_SCALE
  BURST_EVERY = 100
  # Medium-lived objects: each request puts RING_PER_REQUEST in a ring of
  # RING_SIZE, so each lives RING_SIZE / RING_PER_REQUEST requests.
  RING_SIZE = 30_000
  RING_PER_REQUEST = 18
  # Work between allocations that allocates nothing (integer arithmetic), so
  # that allocation is about half of a request's time, not all of it.
  WORK = 2_000 * REQUEST_SCALE
  # Kept from boot.
  BOOT_STRINGS = 200_000
  ALLOCATIONS_PER_REQUEST = PER_REQUEST.values.sum + LEAK_PER_REQUEST + RING_PER_REQUEST

  module_function

  # One method per site, so that each site is a function in the profile.
  def site50(n) = n.times { String.new }
  def site20(n) = n.times { Object.new }
  def site10(n) = n.times { String.new }
  def site5(n) = n.times { Object.new }
  def site1(n) = n.times { String.new }
  def site01(n) = n.times { Object.new }
  def other(n) = n.times { String.new }
  def bursty(n) = n.times { Object.new }
  def leak = "x" * 200
  def ring_entry = String.new
  def boot_data = Array.new(BOOT_STRINGS) { String.new }

  def work(n)
    sum = 0
    i = 0
    while i < n
      sum = (sum + (i * 7)) % 1_000_003
      i += 1
    end
    sum
  end

  class Server
    attr_reader :requests, :leaked, :ring, :allocated

    def initialize
      @requests = 0
      @leaked = []
      @ring = Array.new(RING_SIZE)
      @ring_at = 0
      @allocated = Hash.new(0)
    end

    def request
      TruthWorkload.work(WORK)
      PER_REQUEST.each do |site, n|
        TruthWorkload.public_send(site, n)
        @allocated[site] += n
      end
      if (@requests % BURST_EVERY).zero?
        TruthWorkload.bursty(BURST)
        @allocated["bursty"] += BURST
      end
      LEAK_PER_REQUEST.times { @leaked << TruthWorkload.leak }
      @allocated["leak"] += LEAK_PER_REQUEST
      RING_PER_REQUEST.times do
        @ring[@ring_at] = TruthWorkload.ring_entry
        @ring_at = (@ring_at + 1) % RING_SIZE
      end
      @allocated["ring_entry"] += RING_PER_REQUEST
      @requests += 1
    end

    def take_allocated
      taken = @allocated
      @allocated = Hash.new(0)
      taken
    end
  end

  def collector(config, seed)
    case config
    when "defaults" then MemprofilerPprof::Collector.new(sample_rate: 0.01, seed: seed)
    when "exact" then MemprofilerPprof::Collector.new(sample_rate: 0.01, mode: :exact, window_budget: nil, seed: seed)
    when /\Abudget:([1-9]\d*)\z/
      MemprofilerPprof::Collector.new(sample_rate: 0.01, window_budget: Integer(Regexp.last_match(1), 10), seed: seed)
    else raise ArgumentError, "unknown configuration #{config.inspect} (defaults, exact, budget:N)"
    end
  end

  def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)

  # Refuses to measure if a request allocates other than it says. (Ruby
  # makes a few internal objects of its own while a process warms up, such
  # as inline caches: a handful in a million is tolerated.)
  def calibrate
    server = Server.new
    200.times { server.request }
    before = GC.stat(:total_allocated_objects)
    1_000.times { server.request }
    made = GC.stat(:total_allocated_objects) - before
    expected = (1_000 * ALLOCATIONS_PER_REQUEST) + (1_000 / BURST_EVERY * BURST)
    return if (made - expected).between?(0, 10)

    abort "truth_worker: 1,000 requests allocated #{made} objects, not #{expected}: the truth would be wrong"
  end

  def write(dir, name, data, truth)
    File.binwrite(File.join(dir, "#{name}.pprof"), data.pprof_data)
    line = JSON.generate(truth.merge(profile: "#{name}.pprof", window_coverage: data.window_coverage,
                                     allocation_samples: data.allocation_samples_count,
                                     heap_samples: data.heap_samples_count))
    File.write(File.join(dir, "truth.jsonl"), "#{line}\n", mode: "a")
    puts line
  end

  # A flush with Interrupted raised into it: the profile, or nil when the
  # exception ended the flush inside its native part (anywhere else the run
  # could not tell what the profile holds, and stops).
  def interrupted_flush(collector)
    main = Thread.current
    lock = collector.__send__(:flush_lock)
    done = false
    result = nil
    begin
      Thread.handle_interrupt(Interrupted => :never) do
        attacker = Thread.new do
          Thread.pass until lock.locked? || done
          main.raise(Interrupted) unless done
        end
        result = begin
          Thread.handle_interrupt(Interrupted => :immediate) { collector.flush }
        rescue Interrupted => e
          e
        end
        done = true
        attacker.join
      end
    rescue Interrupted
      # (After the flush returned: its profile is whole.)
    end
    return result unless result.is_a?(Interrupted)
    return nil if result.backtrace.any? { |line| line.include?("_native_flush") }

    abort "truth_worker: the exception landed outside the native flush; run again"
  end

  # What was allocated in two intervals, as one.
  def add_truths(carried, allocated, all_allocations, seconds)
    return [allocated, all_allocations, seconds] unless carried

    [carried[0].merge(allocated) { |_, a, b| a + b }, carried[1] + all_allocations, carried[2] + seconds]
  end

  def server(config, seed, interval, duration, dir, idle_ms: 0.0)
    calibrate
    GC.start
    collector = collector(config, seed)
    server = Server.new
    collector.start!
    boot = boot_data
    started = interval_began = now
    gc_total = GC.stat(:total_allocated_objects)
    index = attempts = 0
    carried = nil
    while now - started < duration
      server.request
      sleep(idle_ms / 1000.0) if idle_ms.positive? && (server.requests % 10).zero?
      next if now - interval_began < interval

      allocated = server.take_allocated
      total = GC.stat(:total_allocated_objects)
      attempts += 1
      allocated, all_allocations, seconds = add_truths(carried, allocated, total - gc_total, now - interval_began)
      data = if INTERRUPT_EVERY.positive? && (attempts % INTERRUPT_EVERY).zero?
               interrupted_flush(collector)
             else
               collector.flush
             end
      unless data
        carried = [allocated, all_allocations, seconds]
        gc_total = GC.stat(:total_allocated_objects)
        interval_began = now
        next
      end
      carried = nil
      index += 1
      write(dir, format("interval-%03d", index), data,
            { kind: "server", config: config, seed: seed, interval: interval, index: index,
              seconds: seconds, all_allocations: all_allocations, allocated: allocated,
              alive: { "boot_data" => boot.size, "leak" => server.leaked.size, "ring_entry" => RING_SIZE },
              requests: server.requests })
      gc_total = GC.stat(:total_allocated_objects)
      interval_began = now
    end
    collector.stop!
  end

  # 1,000,000 allocations in an early phase, then 1,000,000 in a late one,
  # one flush at the end, with a small allocation list.
  def phase_early(n) = n.times { String.new }
  def phase_late(n) = n.times { Object.new }

  def phased(config, seed, dir)
    GC.start
    collector = collector(config, seed)
    collector.max_allocation_samples = 1_000
    collector.start!
    before = GC.stat(:total_allocated_objects)
    1_000.times { phase_early(1_000) }
    1_000.times { phase_late(1_000) }
    total = GC.stat(:total_allocated_objects) - before
    data = collector.flush
    collector.stop!
    write(dir, "phased", data,
          { kind: "phased", config: config, seed: seed, index: 1, all_allocations: total,
            allocated: { "phase_early" => 1_000_000, "phase_late" => 1_000_000 }, alive: {} })
  end
end

if $PROGRAM_NAME == __FILE__
  kind, config, seed, *rest = ARGV
  case kind
  when "server"
    interval, duration, dir, idle_ms = rest
    TruthWorkload.server(config, Integer(seed), Float(interval), Float(duration), dir, idle_ms: Float(idle_ms || 0))
  when "phased"
    TruthWorkload.phased(config, Integer(seed), rest.fetch(0))
  else
    abort "usage: truth_worker.rb server CONFIG SEED INTERVAL DURATION DIR [IDLE_MS] | phased CONFIG SEED DIR"
  end
end
