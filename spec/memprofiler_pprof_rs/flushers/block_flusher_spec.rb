# frozen_string_literal: true

RSpec.describe MemprofilerPprof::BlockFlusher do
  include FlusherSpecHelpers

  # An on_flush that hangs (a stuck upload), after saying it started.
  def hanging_callback(started)
    lambda do |_data|
      started << true
      sleep 30
    end
  end

  let(:collector) { FakeCollector.new }

  after { @flusher&.stop! }

  it "flushes every interval and hands each ProfileData to on_flush" do
    received = Queue.new
    @flusher = described_class.new(collector, interval: 0.05, on_flush: ->(data) { received << data })
    expect(@flusher.start!).to be(true)
    expect(@flusher.start!).to be(false) # already running
    eventually { received.size >= 3 }
    expect(@flusher.stop!).to be(true)
    expect(received.pop).to be_a(MemprofilerPprof::ProfileData)
    expect(@flusher.flush_count).to be >= 3
    expect(@flusher.error_count).to eq(0)
  end

  it "flushes a real collector" do
    real = MemprofilerPprof::Collector.new(sample_rate: 1.0)
    received = Queue.new
    @flusher = described_class.new(real, interval: 0.05, on_flush: ->(data) { received << data })
    real.start!
    @flusher.start!
    kept = Workload::Allocator.new.outer(100)
    eventually { received.size >= 2 }
    @flusher.stop!
    real.stop!
    profiles = Array.new(received.size) { parse_profile(received.pop) }
    expect(profiles.sum { |p| total_through(p, "Workload::Allocator#outer", "alloc_objects") }).to be >= 200
    expect(kept.size).to eq(100)
  end

  it "stop! returns within a second although the interval is 30 s, and can flush the last interval" do
    received = Queue.new
    @flusher = described_class.new(collector, interval: 30, on_flush: ->(data) { received << data })
    @flusher.start!
    sleep 0.05
    expect(elapsed { @flusher.stop!(flush: true) }).to be < 1.0
    expect(received.size).to eq(1)
    expect(@flusher.running?).to be(false)
    expect(@flusher.stop!).to be(false)
  end

  it "does not let a hung on_flush hang stop!: the thread is killed after stop_timeout" do
    logger = ListLogger.new
    started = Queue.new
    @flusher = described_class.new(collector, interval: 0.01, on_flush: hanging_callback(started), logger: logger,
                                              stop_timeout: 0.2)
    @flusher.start!
    started.pop
    expect(elapsed { @flusher.stop! }).to be < 1.0
    expect(logger.errors.pop).to match(/did not end within 0.2s; its thread was killed/)
    expect(Thread.list.map(&:name)).not_to include("memprofiler_pprof_rs BlockFlusher")
  end

  it "flushes on stop when built with flush_on_stop: true, and not otherwise" do
    with_option = described_class.new(collector, interval: 30, flush_on_stop: true)
    with_option.start!
    with_option.stop!
    without = described_class.new(collector, interval: 30)
    without.start!
    without.stop!
    expect(collector.flush_times.size).to eq(1)
  end

  it "counts the time a flush takes against the interval" do
    collector.delay = 0.15
    @flusher = described_class.new(collector, interval: 0.3)
    @flusher.start!
    eventually { collector.flush_times.size >= 4 }
    @flusher.stop!
    starts = Array.new(collector.flush_times.size) { collector.flush_times.pop }
    gaps = starts.each_cons(2).map { |a, b| b - a }.sort
    # Waiting the full interval after each flush would space them 0.45 s.
    expect(gaps[gaps.size / 2]).to be_within(0.08).of(0.3)
  end

  it "logs an on_flush that raises and keeps flushing" do
    logger = ListLogger.new
    calls = 0
    on_flush = lambda do |_data|
      calls += 1
      raise "upload failed #{calls}"
    end
    @flusher = described_class.new(collector, interval: 0.03, logger: logger, on_flush: on_flush)
    @flusher.start!
    eventually { logger.errors.size >= 3 }
    @flusher.stop!
    expect(logger.errors.pop).to match(/BlockFlusher: handling the flushed profile failed: RuntimeError: upload failed 1/)
    expect(@flusher.error_count).to be >= 3
    expect(@flusher.last_error).to be_a(RuntimeError)
    expect(@flusher.flush_count).to be >= 3
  end

  it "logs a failing flush and keeps trying" do
    logger = ListLogger.new
    collector.failure = IOError.new("disk on fire")
    @flusher = described_class.new(collector, interval: 0.03, logger: logger)
    @flusher.start!
    eventually { logger.errors.size >= 2 }
    collector.failure = nil
    eventually { @flusher.flush_count >= 1 }
    @flusher.stop!
    expect(logger.errors.pop).to match(/flush failed: IOError: disk on fire/)
  end

  it "survives an on_flush that raises a non-StandardError, and stop! does not re-raise it" do
    logger = ListLogger.new
    @flusher = described_class.new(collector, interval: 0.02, logger: logger,
                                              on_flush: ->(_) { raise LoadError, "cannot load such file -- uploader" })
    @flusher.start!
    eventually { logger.errors.size >= 2 }
    expect(@flusher.stop!).to be(true)
    expect(logger.errors.pop).to match(/LoadError: cannot load such file -- uploader/)
  end

  it "accepts a huge interval without its wait overflowing" do
    logger = ListLogger.new
    @flusher = described_class.new(collector, interval: 1e20, logger: logger)
    @flusher.start!
    sleep 0.05
    expect(@flusher.running?).to be(true)
    expect(elapsed { @flusher.stop!(flush: true) }).to be < 1.0
    expect(logger.errors).to be_empty
    expect(collector.flush_times.size).to eq(1)
  end

  it "bounds the final flush of stop!(flush: true) by stop_timeout too" do
    logger = ListLogger.new
    started = Queue.new
    @flusher = described_class.new(collector, interval: 0.01, on_flush: hanging_callback(started), logger: logger,
                                              stop_timeout: 0.2)
    @flusher.start!
    started.pop
    expect(elapsed { @flusher.stop!(flush: true) }).to be < 1.5
    messages = Array.new(logger.errors.size) { logger.errors.pop }.join("\n")
    expect(messages).to include("the flush under way did not end", "the final flush did not end")
  end

  it "never runs two flush loops after a stop! and start! from on_flush" do
    flusher = nil
    restarted = false
    on_flush = lambda do |_|
      next if restarted

      restarted = true
      flusher.stop!
      flusher.start!
    end
    flusher = described_class.new(collector, interval: 0.1, on_flush: on_flush)
    @flusher = flusher
    flusher.start!
    eventually { restarted }
    sleep 0.55
    flusher.stop!
    # One loop: about 1 + 5 flushes in ~0.65 s; two loops would make ~11.
    expect(collector.flush_times.size).to be_between(4, 8)
    expect(Thread.list.map(&:name).grep(/BlockFlusher/)).to be_empty
  end

  it "can be stopped, paused and unpaused from a signal trap handler" do
    code = <<~RUBY
      require "memprofiler_pprof_rs"
      collector = MemprofilerPprof::Collector.new(sample_rate: 1.0)
      collector.start!
      flushed = Queue.new
      flusher = MemprofilerPprof::BlockFlusher.new(collector, interval: 30, on_flush: ->(d) { flushed << d })
      flusher.start!
      results = Queue.new
      trap("USR1") do
        flusher.pause
        flusher.unpause
        results << flusher.stop!(flush: true)
        results << collector.flush.class
      end
      Process.kill("USR1", Process.pid)
      puts [results.pop, results.pop, flushed.size, flusher.running?].inspect
    RUBY
    out, err, status = run_ruby(code)
    expect(status).to be_success, err
    expect(out.strip).to eq("[true, MemprofilerPprof::ProfileData, 1, false]")
    expect(err).to eq("")
  end

  it "writes errors to $stderr without a logger" do
    collector.failure = RuntimeError.new("no logger here")
    @flusher = described_class.new(collector, interval: 30)
    expect { @flusher.run(flush: true) { nil } }.to output(/flush failed: RuntimeError: no logger here/).to_stderr
  end

  it "does not flush while paused, and catches up after unpause" do
    @flusher = described_class.new(collector, interval: 0.05)
    @flusher.start!
    @flusher.pause
    expect(@flusher.paused?).to be(true)
    count = collector.flush_times.size
    sleep 0.3
    expect(collector.flush_times.size).to be <= count + 1 # one may have been under way
    paused_count = collector.flush_times.size
    @flusher.unpause
    eventually { collector.flush_times.size > paused_count }
  end

  it "passes yield_gvl and proactively_yield_gvl to every flush" do
    @flusher = described_class.new(collector, interval: 30, yield_gvl: true, proactively_yield_gvl: true)
    @flusher.run(flush: true) { nil }
    expect(collector.flush_options).to eq([{ yield_gvl: true, proactively_yield_gvl: true }])
  end

  it "runs a block between start! and stop!, even when it raises" do
    @flusher = described_class.new(collector, interval: 30)
    expect(@flusher.run { @flusher.running? }).to be(true)
    expect(@flusher.running?).to be(false)
    expect { @flusher.run { raise "boom" } }.to raise_error("boom")
    expect(@flusher.running?).to be(false)
  end

  it "can be stopped from its own on_flush" do
    flusher = nil
    flusher = described_class.new(collector, interval: 0.02, on_flush: ->(_) { flusher.stop! })
    flusher.start!
    eventually { !flusher.running? }
    expect(flusher.flush_count).to eq(1)
  end

  it "makes the final flush of stop!(flush: true) called from its own on_flush, without waiting" do
    flusher = nil
    calls = 0
    on_flush = lambda do |_|
      calls += 1
      flusher.stop!(flush: true) if calls == 1
    end
    flusher = described_class.new(collector, interval: 0.02, on_flush: on_flush, stop_timeout: 5)
    flusher.start!
    eventually(timeout: 2) { calls == 2 }
    sleep 0.1
    expect(calls).to eq(2)
    expect(flusher.running?).to be(false)
    expect(flusher.error_count).to eq(0)
  end

  it "runs its thread at the given priority, with a name" do
    @flusher = described_class.new(collector, interval: 30, priority: -2)
    @flusher.start!
    thread = Thread.list.find { |t| t.name == "memprofiler_pprof_rs BlockFlusher" }
    expect(thread&.priority).to eq(-2)
  end

  it "restarts after its thread was killed from outside" do
    @flusher = described_class.new(collector, interval: 30)
    @flusher.start!
    Thread.list.find { |t| t.name == "memprofiler_pprof_rs BlockFlusher" }.kill.join
    expect(@flusher.start!).to be(true)
  end

  it "describes itself readably" do
    @flusher = described_class.new(collector, interval: 30)
    expect(@flusher.inspect).to eq("#<MemprofilerPprof::BlockFlusher interval=30s stopped flushes=0 errors=0>")
  end

  it "rejects wrong arguments at construction, naming the value" do
    # A value of the wrong kind is a TypeError, a usable kind out of range an
    # ArgumentError (MemprofilerPprof::Validation).
    expect { described_class.new(nil) }.to raise_error(TypeError, /collector must respond to #flush, got nil/)
    { 0 => ArgumentError, -1 => ArgumentError, "30" => TypeError, Float::NAN => ArgumentError,
      Float::INFINITY => ArgumentError, nil => TypeError }.each do |interval, error|
      expect { described_class.new(collector, interval: interval) }
        .to raise_error(error, /interval must be a positive number of seconds, got #{Regexp.escape(interval.inspect)}/)
    end
    expect { described_class.new(collector, logger: "log") }.to raise_error(TypeError, /logger.*"log"/)
    expect { described_class.new(collector, on_flush: 3) }.to raise_error(TypeError, /on_flush.*3/)
    expect { described_class.new(collector, stop_timeout: -1) }.to raise_error(ArgumentError, /stop_timeout.*-1/)
    expect { described_class.new(collector, priority: 1.5) }.to raise_error(TypeError, /priority.*1\.5/)
    expect { described_class.new(collector, yield_gvl: "yes") }.to raise_error(TypeError, /yield_gvl.*"yes"/)
    expect { described_class.new(collector, nonsense: 1) }.to raise_error(ArgumentError, /nonsense/)
    expect { described_class.new(collector).stop!(flush: 1) }.to raise_error(TypeError, /flush.*1/)
  end
end
