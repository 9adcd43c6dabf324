# frozen_string_literal: true

# Phases whose allocations must land in different uploads.
module PyroscopePhases
  def self.first = Array.new(300) { |i| "first #{i}" }
  def self.second = Array.new(300) { |i| "second #{i}" }
end

RSpec.describe MemprofilerPprof::PyroscopeFlusher do
  include FlusherSpecHelpers

  before(:all) { @server = FakePyroscope.new }
  after(:all) { @server.stop }
  before { @server.reset }

  # Uncapped: the in-process stand-in server's own allocations are sampled
  # too, and would otherwise fill max_heap_samples and thin the live set
  # (still unbiased, but no longer exact).
  let(:collector) do
    MemprofilerPprof::Collector.new(sample_rate: 1.0, max_allocation_samples: 1_000_000,
                                    max_heap_samples: 10_000_000)
  end
  let(:logger) { ListLogger.new }

  def flusher(**options)
    described_class.new(collector, server_address: @server.url, application_name: "shop", logger: logger,
                                   retry_base_delay: 0.01, **options)
  end

  def through(profile, name, type)
    total_through(profile, name, type)
  end

  it "sends each interval's allocations once (deltas) and what is alive in every upload (absolute)" do
    f = flusher(interval: 30)
    collector.start!
    # (A GC after each phase: in-use counts what a GC has seen alive.)
    first = f.run(flush: true) { PyroscopePhases.first.tap { GC.start } }
    second = f.run(flush: true) { PyroscopePhases.second.tap { GC.start } }
    f.run(flush: true) { nil }
    collector.stop!

    requests = @server.all_requests
    expect(requests.map(&:status)).to eq([200, 200, 200])
    expect(f.uploads_succeeded).to eq(3)
    one, two, three = requests.map { |r| r.profiles.first }
    expect(through(one, "PyroscopePhases.first", "alloc_objects")).to be >= 300
    expect(through(two, "PyroscopePhases.first", "alloc_objects")).to eq(0)
    expect(through(two, "PyroscopePhases.second", "alloc_objects")).to be >= 300
    expect(through(three, "PyroscopePhases.second", "alloc_objects")).to eq(0)
    firsts = [one, two, three].map { |p| through(p, "PyroscopePhases.first", "inuse_objects") }
    expect(firsts).to all(be >= 300)
    expect(through(three, "PyroscopePhases.second", "inuse_objects")).to be >= 300
    expect(requests.first.labels).to include(%w[__delta__ false], %w[service_name shop])
    expect([first.size, second.size]).to eq([300, 300])
  end

  it "keeps at most max_pending uploads waiting on a slow server, dropping the oldest and counting them" do
    6.times { @server.fail_next(200, delay: 0.4) }
    f = flusher(interval: 0.05, max_pending: 1, stop_timeout: 0.5)
    collector.start!
    f.start!
    eventually(timeout: 5) { f.dropped_uploads >= 2 }
    expect(elapsed { f.stop! }).to be < 2.0
    collector.stop!
    expect(f.dropped_uploads).to be >= 2
    expect(f.pending_uploads).to be <= 1
  end

  it "counts failed uploads to a server that is down, and never raises" do
    closed = TCPServer.new("127.0.0.1", 0)
    port = closed.addr[1]
    closed.close
    f = described_class.new(collector, server_address: "http://127.0.0.1:#{port}", application_name: "shop",
                                       logger: logger, retries: 1, retry_base_delay: 0.01, interval: 30)
    collector.start!
    f.run(flush: true) { nil }
    collector.stop!
    expect(f.uploads_failed).to eq(1)
    expect(f.uploads_succeeded).to eq(0)
    expect(logger.errors.pop).to match(/ECONNREFUSED|Connection refused/)
  end

  it "folds the smallest samples into (other) so an upload stays under max_profile_bytes" do
    holder = Module.new
    300.times do |i|
      holder.module_eval(<<~RUBY, "upload_folding.rb", i * 10 + 1)
        def self.keep#{i}(depth) = depth.zero? ? Array.new(10) { |j| "\#{j}" } : keep#{i}(depth - 1)
      RUBY
    end
    f = flusher(interval: 30, max_profile_bytes: 15_000)
    collector.start!
    kept = f.run(flush: true) { Array.new(300) { |i| holder.public_send(:"keep#{i}", 30) }.tap { GC.start } }
    collector.stop!
    request = @server.all_requests.last
    expect(request.status).to eq(200)
    profile = request.profiles.first
    expect(stacks_of(profile)).to include(["(other)"])
    expect(profile.total("inuse_objects")).to be >= 3_000
    expect(kept.size).to eq(300)
    expect { flusher(max_profile_bytes: -1) }.to raise_error(ArgumentError, /max_profile_bytes.*-1/)
  end

  it "sends the allocated class as each stack's leaf, not as a label (a series per class on Pyroscope)" do
    collector.start!
    flusher(interval: 30).run(flush: true) { PyroscopePhases.first }
    flusher(interval: 30, sample_labels: :keep).run(flush: true) { PyroscopePhases.second }
    flusher(interval: 30, sample_labels: :drop).run(flush: true) { PyroscopePhases.second }
    collector.stop!
    class_frame, keep, drop = @server.all_requests.map { |r| r.profiles.first }

    first = class_frame.samples.select { |s| s.frames.map(&:name).include?("PyroscopePhases.first") }
    expect(first.map { |s| s.frames.first.name }).to include("String")
    expect(class_frame.samples.map(&:labels)).to all(be_empty)
    expect(keep.samples.map { |s| s.labels.find { |l| l.key == "class" }&.str }).to all(be_a(String))
    expect(keep.samples.map { |s| s.frames.first.name }).not_to include("String")
    expect(drop.samples.map(&:labels)).to all(be_empty)
    expect(drop.samples.flat_map { |s| s.frames.map(&:name) }).not_to include("String", "Array")
    expect(through(drop, "PyroscopePhases.second", "alloc_objects")).to be >= 300
    expect(logger.errors).to be_empty # :keep chosen on the flusher is not warned about
    expect { flusher(sample_labels: :series) }.to raise_error(ArgumentError, /sample_labels.*:series/)
  end

  it "can be configured from PYROSCOPE_* variables (for an initializer)" do
    env = { "PYROSCOPE_SERVER_ADDRESS" => @server.url, "PYROSCOPE_APPLICATION_NAME" => "from_env",
            "PYROSCOPE_LABELS" => "env=staging", "PYROSCOPE_TENANT_ID" => "t1" }
    f = described_class.from_env(collector, env: env, logger: logger, interval: 30)
    expect(f.interval).to eq(30)
    collector.start!
    f.run(flush: true) { nil }
    collector.stop!
    request = @server.all_requests.last
    expect(request.labels).to include(%w[service_name from_env], %w[env staging])
    expect(request.headers["x-scope-orgid"]).to eq("t1")
    expect(f.sample_labels).to eq(:class_frame)
    keep = described_class.from_env(collector, env: env.merge("MEMPROFILER_PPROF_RS_PYROSCOPE_SAMPLE_LABELS" => "keep"))
    expect(keep.sample_labels).to eq(:keep)
    typo = described_class.from_env(collector, env: env.merge("MEMPROFILER_PPROF_RS_PYROSCOPE_SAMPLE_LABELS" => "labels"),
                                               logger: logger)
    expect(typo.sample_labels).to eq(:class_frame)
    expect(logger.errors.pop).to include("MEMPROFILER_PPROF_RS_PYROSCOPE_SAMPLE_LABELS=\"labels\"", "class_frame")
    expect(described_class.from_env(collector, env: {})).to be_nil
    expect(described_class.from_env(collector, env: { "PYROSCOPE_SERVER_ADDRESS" => "nope" }, logger: logger))
      .to be_nil
    expect(logger.errors.pop).to include("not sending profiles to Pyroscope: server_address")
  end

  it "hides credentials and rejects bad options at construction" do
    f = flusher(basic_auth_username: "1", basic_auth_password: "glc_secret")
    expect(f.inspect).not_to include("glc_secret")
    expect { flusher(max_pending: 0) }.to raise_error(ArgumentError, /max_pending.*0/)
    expect { flusher(labels: { "a-b" => 1 }) }.to raise_error(ArgumentError, /a-b/)
    expect { flusher(nonsense: true) }.to raise_error(ArgumentError, /nonsense/)
  end
end
