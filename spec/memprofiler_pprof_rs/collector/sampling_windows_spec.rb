# frozen_string_literal: true

# window_probability below 1.0: the NEWOBJ hook is on only in short
# windows of allocations placed at random, one per block of the allocation
# sequence (crates/sampler/src/windows/). Each sample weighs 1 / its window's
# probability, so estimates are unbiased, and each profile says how close
# it is (ProfileData#relative_standard_errors): the truth must lie within
# its error bars.
#
# script/rspec-lanes: alone
# (Whether windows are armed in time depends on the windows' timer thread
# finding a core free: beside another busy lane, 4.5% of one example's
# allocations went unhooked, against its bound of 4%.)
RSpec.describe MemprofilerPprof::Collector, "sampling windows" do
  let(:allocator) { Workload::Allocator.new }
  let(:unlimited) { { max_allocation_samples: 10_000_000, max_heap_samples: 10_000_000 } }

  # `estimate` within 4 of the profile's reported standard errors of
  # `truth` (or `floor`, if wider), and the error reported is a real one.
  # For alloc_objects, what windows missed (the hook came on too late: a
  # busy machine) is one sample of unknown site, counted with the loop's
  # site here, where the loop's site is nearly all of the allocations.
  def expect_within_reported_error(estimate, truth, data, type, floor: 0.03, context: nil)
    rse = data.relative_standard_errors.fetch(type)
    expect(rse).to be_a(Float), "#{type}: no error reported (#{context})"
    expect(rse).to be_between(0.0, 0.5), "#{type}: error #{rse} (#{context})"
    missed = type == :alloc_objects ? missed_allocations(data) : 0
    tolerance = [floor, 4 * rse].max
    expect(estimate + missed).to be_within(truth * tolerance).of(truth),
                                 "#{type}: #{estimate} (+#{missed} missed) vs #{truth}, reported error #{rse} (#{context})"
  end

  def missed_allocations(data)
    total_through(parse_profile(data), "(missed by sampling windows)", "alloc_objects")
  end

  # Starts `collector` and makes `iterations` temporaries with a minor GC
  # every 10,000 (windows go on across GCs); returns the allocations made.
  def start_and_allocate(collector, iterations)
    allocator.temporary(0)
    collector.start!
    before = GC.stat(:total_allocated_objects)
    iterations.times do |i|
      allocator.temporary(i)
      GC.start(full_mark: false) if (i % 10_000).zero?
    end
    GC.stat(:total_allocated_objects) - before
  end

  # 2.6M allocations at q 0.25: about 650 windows of 1,000, with a minor GC
  # every 50,000 iterations (at least 50 GC cycles) that windows must not
  # mind. Sample rate 0.04 in windows of a quarter of the allocations
  # samples as many objects as 0.01 does without windows.
  [1, 2, 3].each do |seed|
    it "estimates allocations within 3% and a retained set within 10% (or 4 std. errors) at q 0.25 (seed #{seed})" do
      collector = described_class.new(mode: :light, sample_rate: 0.04, window_probability: 0.25, window_warm_up: 0,
                                      seed: seed, **unlimited)
      allocator.temporary(0)
      allocator.retained(0)
      collector.start!
      gcs = GC.count
      before = GC.stat(:total_allocated_objects)
      kept = []
      2_500_000.times do |i|
        allocator.temporary(i)
        kept << allocator.retained(i) if (i % 25).zero?
        GC.start(full_mark: false) if (i % 50_000).zero?
      end
      truth = GC.stat(:total_allocated_objects) - before
      cycles = GC.count - gcs
      GC.start
      data = collector.flush
      collector.stop!
      profile = parse_profile(data)
      temporaries = total_through(profile, "Workload::Allocator#temporary", "alloc_objects")
      retained = total_through(profile, "Workload::Allocator#retained", "inuse_objects", leaf: "Workload::Allocator#retained")
      # (Said on failure: the run's shape, which depends on the heap the
      # spec order left.)
      shape = "cycles #{cycles}, coverage #{data.window_coverage}, live samples #{data.heap_samples_count}"
      expect(cycles).to be >= 50
      expect(data.window_coverage).to be_between(0.05, 0.6), shape
      expect(truth).to be >= 2_600_000
      # (The loop's temporaries are nearly all of its allocations, and the
      # retained set all of what is alive.)
      expect_within_reported_error(temporaries, 2_500_000, data, :alloc_objects, context: shape)
      expect_within_reported_error(retained, kept.size, data, :inuse_objects, floor: 0.10, context: shape)
      expect(profile.comments.join).to include("sampling windows")
    end
  end

  # Two biases of the estimates scaled at flush (before 0.4), when a window
  # was a whole GC cycle: an interval with no window read 0 while one with
  # a window read the exact total, so short intervals summed low; and every
  # live sample was multiplied by a ratio of all the run's windows, so data
  # kept from the warm-up swung with windows long after it was made.
  it "samples every short interval, each within its reported error, and they sum to the truth" do
    collector = described_class.new(mode: :light, sample_rate: 0.2, window_probability: 0.5, window_warm_up: 0,
                                    seed: 12, **unlimited)
    collector.start!
    # 200 intervals of 10,000 allocations: about 5 windows each. (Read
    # after the loop: reading allocates, and would be most of the next
    # interval, whose reported error is its total's.)
    flushed = Array.new(200) do |interval|
      GC.start(full_mark: false) if (interval % 20).zero?
      10_000.times { |i| allocator.temporary(i) }
      collector.flush
    end
    collector.stop!
    estimates = flushed.each_with_index.map do |data, interval|
      estimate = total_through(parse_profile(data), "Workload::Allocator#temporary", "alloc_objects")
      expect(estimate).to be_positive
      expect_within_reported_error(estimate, 10_000, data, :alloc_objects, floor: 0.1, context: "interval #{interval}")
      estimate
    end
    expect(estimates.sum).to be_within(2_000_000 * 0.03).of(2_000_000)
  end

  [21, 22, 23].each do |seed|
    it "keeps what the warm-up sampled at its weight, whatever windows came after (seed #{seed})" do
      collector = described_class.new(mode: :light, sample_rate: 0.1, window_probability: 0.05,
                                      window_warm_up: 300_000, seed: seed, **unlimited)
      collector.start!
      boot = Array.new(100_000) { |i| allocator.retained(i) }
      # 2M allocations past the warm-up, about 100 windows at q 0.05.
      200.times do
        GC.start(full_mark: false)
        10_000.times { |i| allocator.temporary(i) }
      end
      GC.start
      data = collector.flush
      collector.stop!
      kept = total_through(parse_profile(data), "Workload::Allocator#retained", "inuse_objects",
                           leaf: "Workload::Allocator#retained")
      # 10,000 samples at 0.1, each weighing 10: ~1% standard error. The
      # in-use error also takes in the share of allocations windows missed
      # (on a busy machine polls come late), added in quadrature.
      expect(kept).to be_within(boot.size * 0.05).of(boot.size)
      missed = parse_profile(data).comments.join[/windows missed ([\d.]+)% of the allocations/, 1].to_f / 100
      expect(missed).to be < 0.25
      expect(data.relative_standard_errors[:inuse_objects]).to be < Math.hypot(0.05, missed)
    end
  end

  # A long C call (String#split here) lets no job run, so a hook that was
  # off when it began stays off: its windows are missed, and the objects
  # it made are never tracked. In-use must not then claim a narrow error.
  it "widens the in-use error by what windows missed in long C calls" do
    collector = described_class.new(mode: :light, sample_rate: 0.04, window_probability: 0.25, window_warm_up: 0,
                                    seed: 31, **unlimited)
    csv = (["abcdefg"] * 200_000).join(",")
    collector.start!
    kept = nil
    3.times do
      sleep 0.005 # (a poll: the hook goes off between windows)
      kept = csv.split(",")
    end
    GC.start
    data = collector.flush
    collector.stop!
    comments = parse_profile(data).comments.join
    share = comments[/windows missed ([\d.]+)% of the allocations/, 1]
    expect(share).not_to be_nil, comments
    expect(Float(share)).to be > 30
    expect(missed_allocations(data)).to be_positive
    rse = data.relative_standard_errors[:inuse_objects]
    # (nil: no live sample at all, "unknown" rather than a number.)
    expect(rse).to(be_nil.or(be >= Float(share) / 100), "in-use error #{rse} with #{share}% missed")
    expect(kept.size).to eq(200_000)
  end

  # window_budget: q chosen at each GC from the allocation rate so far.
  it "keeps the hook on, and counts exact, in a process under its budget" do
    collector = described_class.new(sample_rate: 1.0, window_budget: 1_000_000_000, **unlimited)
    collector.start!
    20.times do |round|
      1_000.times { |i| allocator.temporary(i) }
      GC.start(full_mark: false) if round.even?
    end
    data = collector.flush
    collector.stop!
    expect(data.window_coverage).to eq(1.0)
    expect(total_through(parse_profile(data), "Workload::Allocator#temporary", "alloc_objects")).to eq(20_000)
  end

  it "over its budget samples a share of allocations and still estimates within its reported error" do
    # A tight loop allocates millions a second: q is the budget over the
    # rate (and the hook's lead-in), 0.001 to 0.2 depending on the
    # machine's load; a machine ten times slower would still be over
    # budget. The seed fixes where windows fall, not q, which follows the
    # clock, so each estimate is held to the error its profile reports.
    collector = described_class.new(mode: :light, sample_rate: 0.4, window_budget: 50_000, window_warm_up: 0, seed: 5,
                                    **unlimited)
    allocator.temporary(0)
    allocator.retained(0)
    collector.start!
    kept = []
    2_500_000.times do |i|
      allocator.temporary(i)
      kept << allocator.retained(i) if (i % 25).zero?
      GC.start(full_mark: false) if (i % 10_000).zero?
    end
    GC.start
    data = collector.flush
    collector.stop!
    profile = parse_profile(data)
    expect(data.window_coverage).to be_between(0.001, 0.9)
    context = "coverage #{data.window_coverage}, live samples #{data.heap_samples_count}"
    temporaries = total_through(profile, "Workload::Allocator#temporary", "alloc_objects")
    expect_within_reported_error(temporaries, 2_500_000, data, :alloc_objects, context: context)
    retained = total_through(profile, "Workload::Allocator#retained", "inuse_objects", leaf: "Workload::Allocator#retained")
    expect_within_reported_error(retained, kept.size, data, :inuse_objects, floor: 0.10, context: context)
    expect(profile.comments.join).to include("allocations a second")
  end

  # The defaults (mode :light's automatic budget): 100,000 hooked
  # allocations a second, every allocation hooked for the first 250,000.
  it "at the defaults takes a window budget after a warm-up, except at sample_rate 1.0 or with a probability" do
    defaults = described_class.new
    expect([defaults.mode, defaults.window_budget, defaults.window_warm_up, defaults.window_probability])
      .to eq([:light, 100_000, 250_000, 1.0])
    expect(MemprofilerPprof::DEFAULTS).to include(mode: :light, window_budget: 100_000, window_warm_up: 250_000)
    light = described_class.new(mode: :light)
    expect([light.window_budget, light.window_warm_up]).to eq([100_000, 250_000])
    expect(described_class.new(mode: :light, sample_rate: 1.0).window_budget).to be_nil
    expect(described_class.new(mode: :light, window_probability: 0.5).window_budget).to be_nil
    expect(described_class.new(mode: :exact, window_budget: 10).window_budget).to eq(10)
    expect { described_class.new(window_warm_up: -1) }.to raise_error(ArgumentError, /window_warm_up.*-1/)
    expect { described_class.new(window_warm_up: 1.5) }.to raise_error(TypeError, /window_warm_up/)
    collector = described_class.new(mode: :light)
    # The automatic budget gives way to a probability or mode :exact, and
    # comes back; a budget given as a number does not give way.
    collector.window_probability = 0.5
    expect([collector.window_budget, collector.window_probability]).to eq([nil, 0.5])
    collector.window_probability = 1.0
    expect(collector.window_budget).to eq(100_000)
    collector.mode = :exact
    expect(collector.window_budget).to be_nil
    collector.mode = :light
    expect(collector.window_budget).to eq(100_000)
    collector.window_budget = 20_000
    expect { collector.window_probability = 0.5 }.to raise_error(ArgumentError, /exclude each other/)
    collector.window_budget = :auto
    expect(collector.window_budget).to eq(100_000)
    collector.start!
    expect { collector.window_probability = 0.5 }.to raise_error(RuntimeError, /stopped/)
    expect { collector.window_warm_up = 0 }.to raise_error(RuntimeError, /stopped/)
    collector.stop!
    collector.window_warm_up = 0
    expect(collector.window_warm_up).to eq(0)
  end

  it "in mode :light, hooks every allocation of a profile inside the warm-up: the estimates of no windows" do
    collector = described_class.new(mode: :light, sample_rate: 0.1, seed: 8, **unlimited)
    truth = start_and_allocate(collector, 150_000)
    expect(collector.window_coverage).to eq(1.0)
    data = collector.flush
    collector.stop!
    expect(truth).to be < 250_000
    expect(data.window_coverage).to eq(1.0)
    estimate = total_through(parse_profile(data), "Workload::Allocator#temporary", "alloc_objects")
    # ~15,000 samples (~150,000 allocations at 0.1): 0.8% standard error.
    expect(estimate).to be_within(truth * 0.03).of(truth)
    expect(parse_profile(data).comments.join).to include("after the first 250000 allocations since start")
  end

  it "in mode :light, past the warm-up samples a share of allocations and estimates within its reported error" do
    collector = described_class.new(mode: :light, sample_rate: 0.2, seed: 6, **unlimited)
    truth = start_and_allocate(collector, 1_500_000)
    collector.stop! # (so that the share read now is the flush's)
    so_far = collector.window_coverage
    data = collector.flush
    warm_share = 250_000.0 / truth
    expect(so_far).to eq(data.window_coverage)
    expect(data.window_coverage).to be_between(warm_share, 0.99), "coverage #{data.window_coverage}, truth #{truth}"
    estimate = total_through(parse_profile(data), "Workload::Allocator#temporary", "alloc_objects")
    # The spread comes from the windows past the warm-up, which stand for
    # the rest of the run.
    expect_within_reported_error(estimate, truth, data, :alloc_objects,
                                 context: "coverage #{data.window_coverage}, truth #{truth}")
  end

  it "counts in a flush after stop! only what was allocated before it" do
    collector = described_class.new(mode: :light, sample_rate: 0.5, window_probability: 0.5, window_warm_up: 0, seed: 2,
                                    **unlimited)
    collector.start!
    200_000.times do |i|
      allocator.temporary(i)
      GC.start(full_mark: false) if (i % 5_000).zero?
    end
    collector.stop!
    # Unsampled allocations after the stop must not inflate (or dilute)
    # what was sampled before it.
    Array.new(500_000) { |i| i.to_s }
    data = collector.flush
    temporaries = total_through(parse_profile(data), "Workload::Allocator#temporary", "alloc_objects")
    expect_within_reported_error(temporaries, 200_000, data, :alloc_objects, floor: 0.05)
  end

  it "takes window_budget only while stopped, not with window_probability, and names a bad one" do
    collector = described_class.new(window_budget: 50_000)
    expect(collector.window_budget).to eq(50_000)
    expect { collector.window_probability = 0.5 }.to raise_error(ArgumentError, /window_probability 0\.5 and window_budget/)
    collector.start!
    expect { collector.window_budget = 10 }.to raise_error(RuntimeError, /stopped/)
    expect { collector.window_probability = 1.0 }.to raise_error(RuntimeError, /stopped/)
    collector.stop!
    expect { collector.window_budget = 0 }.to raise_error(ArgumentError, /window_budget.*got 0/)
    expect { collector.window_budget = 1.5 }.to raise_error(TypeError, /window_budget/)
    expect { described_class.new(window_budget: 10, window_probability: 0.5) }
      .to raise_error(ArgumentError, /exclude each other/)
    collector.window_budget = nil
    collector.window_probability = 0.5
    expect([collector.window_probability, collector.window_budget]).to eq([0.5, nil])
  end

  it "says in its comment what the block under way has not counted yet, in plain single-spaced prose" do
    collector = described_class.new(mode: :light, sample_rate: 0.1, window_probability: 0.01, window_warm_up: 0, seed: 1)
    collector.start!
    20_000.times { |i| allocator.temporary(i) }
    data = collector.flush
    collector.stop!
    windows = parse_profile(data).comments.grep(/\Asampling windows:/).first
    expect(windows).to include("of this interval's allocations (").and include("are not counted yet")
    # Inside windows of q 0.01 it samples at 0.1 / 0.01, held to 0.1: a
    # sample weighs 1 / (0.1 x 0.01).
    expect(windows).to include("x probability), up to 1000 allocations this interval (more where the sample caps")
    expect(windows).not_to match(/ {2}|\n/)
  end

  it "reports full coverage and no comment without windows" do
    data = described_class.new(sample_rate: 0.5, window_budget: nil).profile { Array.new(1_000) { |i| i.to_s } }
    expect(data.window_coverage).to eq(1.0)
    expect(parse_profile(data).comments.join).not_to include("sampling windows")
    # ~500 samples at 0.5: about 3% (Bernoulli sampling alone).
    expect(data.relative_standard_errors[:alloc_objects]).to be_between(0.01, 0.06)
    expect(data.effective_samples[:alloc_objects]).to be_between(250, 2_000)
    expect(data.relative_standard_errors).to be_frozen
    top = MemprofilerPprof::Profile.parse(data).top(sample_index: "alloc_objects")
    expect(top).to match(/^Estimate: total within ±\d+\.\d% \(one relative standard error; \d+ effective samples\)$/)
  end

  it "takes spread figures in a ProfileData only as numbers or nil, by sample type" do
    data = MemprofilerPprof::ProfileData.new(pprof_data: "x".b, relative_standard_errors: { inuse_space: 0.1 })
    expect(data.relative_standard_errors).to eq(alloc_objects: nil, alloc_space: nil, inuse_objects: nil,
                                                inuse_space: 0.1)
    expect(MemprofilerPprof::ProfileData.new(pprof_data: "x".b).effective_samples.values).to all(be_nil)
    expect { MemprofilerPprof::ProfileData.new(pprof_data: "x".b, effective_samples: { cpu: 1.0 }) }
      .to raise_error(ArgumentError, /effective_samples: unknown sample type :cpu/)
    expect { MemprofilerPprof::ProfileData.new(pprof_data: "x".b, relative_standard_errors: { alloc_space: -1 }) }
      .to raise_error(TypeError, /relative_standard_errors must be non-negative numbers or nil, got -1/)
    expect { MemprofilerPprof::ProfileData.new(pprof_data: "x".b, relative_standard_errors: [0.1]) }
      .to raise_error(TypeError, /relative_standard_errors/)
  end

  it "calls an interval's allocations unknown, not 0, when no window hooked any of them" do
    profile_with_seed = lambda do |seed|
      collector = described_class.new(mode: :light, sample_rate: 0.5, window_probability: 0.05, window_warm_up: 0,
                                      seed: seed)
      collector.profile { Array.new(1_000) { |i| i.to_s } }
    end
    data = (1..64).lazy.map(&profile_with_seed).find { |d| d.window_coverage.zero? }
    expect(data).not_to be_nil
    expect(data.relative_standard_errors.values_at(:alloc_objects, :alloc_space)).to eq([nil, nil])
    expect(data.effective_samples[:alloc_objects]).to be_nil
    top = MemprofilerPprof::Profile.parse(data).top(sample_index: "alloc_objects")
    expect(top).to include("Estimate: unknown: sampling windows hooked none of this interval's allocations")
  end

  it "keeps sampling across windows in threads and a forked child" do
    skip "fork unsupported" unless Process.respond_to?(:fork)
    collector = described_class.new(mode: :light, sample_rate: 0.1, window_probability: 0.5, window_warm_up: 0, seed: 4)
    collector.start!
    # Minor GCs every 10,000 allocations, which windows must not mind.
    work = lambda do |count, offset|
      count.times do |i|
        allocator.temporary(i + offset)
        GC.start(full_mark: false) if (i % 10_000).zero?
      end
    end
    threads = Array.new(3) { |t| Thread.new { work.call(100_000, t) } }
    threads.each(&:join)
    reader, writer = IO.pipe
    pid = fork do
      reader.close
      work.call(200_000, 0)
      writer.puts collector.flush.allocation_samples_count
      writer.close
      exit!(0)
    end
    writer.close
    child_samples = reader.read.to_i
    Process.wait(pid)
    data = collector.flush
    collector.stop!
    expect(child_samples).to be_positive
    expect(data.allocation_samples_count).to be_positive
    expect(collector.internal_error_count).to eq(0)
  end

  # A server's thread pool: each request goes to the pool thread that waited
  # longest, and the process idles between requests. Ruby flags a postponed
  # job on the thread that ran last, which then waits for its turn while
  # the others run: the job that arms the hook must not wait with it (7-10%
  # of the allocations went unhooked, 0.2-1.2% now).
  it "arms its windows in time when requests rotate over a thread pool with idle time between them" do
    collector = described_class.new(mode: :light, sample_rate: 0.1, window_probability: 0.1, window_warm_up: 0, seed: 3,
                                    **unlimited)
    requests = 600
    per_request = 2_000
    collector.start!
    queue = Queue.new
    done = Queue.new
    pool = Array.new(16) do
      Thread.new do
        while (count = queue.pop)
          count.times { |i| allocator.temporary(i) }
          done << true
        end
      end
    end
    requests.times do
      queue << per_request
      done.pop
      sleep 0.002
    end
    queue.close
    pool.each(&:join)
    data = collector.flush
    collector.stop!
    truth = requests * per_request
    estimate = total_through(parse_profile(data), "Workload::Allocator#temporary", "alloc_objects")
    expect(missed_allocations(data)).to be < 0.04 * truth
    expect_within_reported_error(estimate, truth, data, :alloc_objects, floor: 0.1)
  end

  it "polls from a thread of its own, in a forked child too, and exits cleanly with it running" do
    skip "needs /proc and fork" unless File.directory?("/proc/self/task") && Process.respond_to?(:fork)
    code = <<~'RUBY'
      require "memprofiler_pprof_rs"
      threads = -> { Dir["/proc/self/task/*/comm"].map { |f| File.read(f).strip } }
      busy = ->(seconds) { t = Time.now; (Array.new(1_000) { |i| i.to_s }) while Time.now - t < seconds }
      collector = MemprofilerPprof::Collector.new(window_warm_up: 0).tap(&:start!)
      busy.call(0.3)
      parent = threads.call.include?("memprofiler-win")
      reader, writer = IO.pipe
      pid = fork do
        busy.call(0.3)
        writer.puts(threads.call.include?("memprofiler-win") && collector.flush.allocation_samples_count.positive?)
        exit!(0)
      end
      writer.close
      child = reader.read.strip
      Process.wait(pid)
      windows = MemprofilerPprof::PprofReader.parse(collector.flush.pprof_data).comments.join[/(\d+) windows/, 1].to_i
      # (About 25 windows a second at the default budget, fewer where
      # allocations are cheaper, as on Ruby 3.4.)
      puts [parent, child, windows >= 3].inspect
      # Exits with the collector running and the thread polling.
    RUBY
    out, err, status = run_ruby(code)
    expect(status.success?).to be(true), err
    expect(out.strip).to eq("[true, \"true\", true]")
  end

  # A job that a stopped collector ran asks for no next poll: the timer
  # thread must then sleep, not trigger it again and again.
  it "leaves its timer thread asleep once the collector is stopped" do
    skip "needs /proc" unless File.directory?("/proc/self/task")
    code = <<~'RUBY'
      require "memprofiler_pprof_rs"
      wakeups = lambda do
        task = Dir["/proc/self/task/*"].find { |t| File.read("#{t}/comm").start_with?("memprofiler-win") }
        File.read("#{task}/status")[/^voluntary_ctxt_switches:\s+(\d+)/, 1].to_i
      end
      collector = MemprofilerPprof::Collector.new(window_warm_up: 0).tap(&:start!)
      t = Time.now
      (Array.new(1_000) { |i| i.to_s }) while Time.now - t < 0.3
      collector.stop!
      sleep 0.3
      before = wakeups.call
      sleep 1
      puts wakeups.call - before
    RUBY
    out, err, status = run_ruby(code)
    expect(status.success?).to be(true), err
    expect(Integer(out)).to be <= 3
  end

  it "takes window_probability only while stopped, and names a bad one" do
    collector = described_class.new(window_probability: 0.5, window_warm_up: 0)
    expect(collector.window_probability).to eq(0.5)
    collector.start!
    expect { collector.window_probability = 0.2 }.to raise_error(RuntimeError, /stopped/)
    collector.stop!
    expect { collector.window_probability = 0.0 }.to raise_error(ArgumentError, /window_probability.*0\.0/)
    expect { collector.window_probability = 1.5 }.to raise_error(ArgumentError, /window_probability.*1\.5/)
    expect { collector.window_probability = "0.5" }.to raise_error(TypeError, /window_probability/)
  end
end
