# frozen_string_literal: true

require "objspace"

# Sampled profiles estimate the true totals: every sample counts for
# 1 / sample_rate objects. Checked against ground truth computed in the same
# process, with fixed seeds so that the checks are deterministic.
module EstimateHelpers
  # Profiles `count` calls of Workload::Allocator#temporary; returns the true
  # number of allocations (GC.stat), the profile's estimate, and the flush.
  def profile_temporaries(collector, count)
    allocator = Workload::Allocator.new
    allocator.temporary(0) # warm up inline caches
    collector.start!
    before = GC.stat(:total_allocated_objects)
    count.times { |i| allocator.temporary(i) }
    truth = GC.stat(:total_allocated_objects) - before
    data = collector.flush
    collector.stop!
    [truth, total_through(parse_profile(data), "Workload::Allocator#temporary", "alloc_objects"), data]
  end
end

# Both modes (MemprofilerPprof::Collector::MODES) must estimate alike: they
# differ only in how deaths of sampled objects are found. Without sampling
# windows here (window_budget: nil): the defaults' windows are checked in
# sampling_windows_spec.rb, with tolerances that follow their coverage.
{ exact: { mode: :exact }, light: { mode: :light, window_budget: nil } }.each do |mode, mode_options|
  RSpec.describe "estimates at sample_rate 0.01 (mode: #{mode})" do
    include EstimateHelpers

    let(:unlimited) { { max_allocation_samples: 10_000_000, max_heap_samples: 10_000_000 } }
    let(:allocator) { Workload::Allocator.new }

    it "estimates the total allocation count within 3% over 2.5 million allocations" do
      collector = MemprofilerPprof::Collector.new(**mode_options, sample_rate: 0.01, seed: 20_261_129, **unlimited)
      truth, estimate, data = profile_temporaries(collector, 2_500_000)
      expect(truth).to be >= 2_500_000
      expect(estimate).to be_within(truth * 0.03).of(truth)
      expect(data.allocation_samples_count).to be_within(2_500).of(25_000)
    end

    it "gives the error of its leading functions, as Bernoulli sampling has it without windows" do
      collector = MemprofilerPprof::Collector.new(**mode_options, sample_rate: 0.01, seed: 11, **unlimited)
      allocator.temporary(0)
      allocator.retained(0)
      collector.start!
      250_000.times do |i|
        allocator.temporary(i)
        allocator.retained(i)
      end
      data = collector.flush
      collector.stop!
      profile = MemprofilerPprof::Profile.parse(data.pprof_data)
      errors = profile.function_errors.fetch("Workload::Allocator#temporary").fetch(:alloc_objects)
      # About 2,500 samples of its 250,000: sqrt(0.99 / 2,500), 2.0%.
      expect(errors[:cum]).to be_within(0.003).of(Math.sqrt(0.99 / 2_500))
      expect(errors[:flat]).to be_nil # (Integer#to_s allocates)
      estimate = total_through(parse_profile(data), "Workload::Allocator#temporary", "alloc_objects")
      expect(estimate).to be_within(3 * errors[:cum] * 250_000).of(250_000)
      go = MemprofilerPprof::Profile.read(File.join(SPEC_ROOT, "fixtures/other_tools/go_heap.pprof"))
      expect(go.function_errors).to eq({})
    end

    it "estimates 200,000 retained objects among millions of temporary ones within 5%" do
      collector = MemprofilerPprof::Collector.new(**mode_options, sample_rate: 0.01, seed: 7, **unlimited)
      collector.start!
      kept = []
      200_000.times do |i|
        kept << allocator.retained(i)
        10.times { |j| allocator.temporary(j) }
      end
      GC.start
      data = collector.flush
      collector.stop!
      profile = parse_profile(data)
      inuse = total_through(profile, "Workload::Allocator#retained", "inuse_objects")
      temporaries_alive = total_through(profile, "Workload::Allocator#temporary", "inuse_objects")
      expect(kept.size).to eq(200_000)
      expect(inuse).to be_within(10_000).of(200_000)
      expect(temporaries_alive).to be < 2_000 # garbage, collected
    end

    # Sampling is by count, so a method's alloc_space estimate has a relative
    # error of about 1/sqrt(its samples): 200,000 1 MB strings among a million
    # allocations give ~2,000 samples (about 2.2%), checked for several seeds.
    # In a process of its own: each 1 MB buffer counts towards Ruby's malloc
    # limit, so the loop runs ~5,900 GCs, and over the suite's heap they took
    # 15-21 s an example, against under 2 s in a fresh process.
    [1, 2, 3].each do |seed|
      it "estimates the bytes of 1 MB strings within 10% (seed #{seed})", :slow do
        Dir.mktmpdir("estimates") do |dir|
          path = File.join(dir, "megabytes.pprof")
          out, err, status = run_ruby(<<~RUBY, args: [path])
            require "objspace"
            require "memprofiler_pprof_rs"
            require #{File.join(SPEC_ROOT, 'fixtures/workload').inspect}
            collector = MemprofilerPprof::Collector.new(**#{mode_options.merge(unlimited).inspect}, sample_rate: 0.01,
                                                        seed: #{seed})
            allocator = Workload::Allocator.new
            allocator.megabyte
            collector.start!
            truth = 0
            200_000.times do |i|
              truth += ObjectSpace.memsize_of(allocator.megabyte)
              4.times { allocator.temporary(i) }
            end
            data = collector.flush
            collector.stop!
            File.binwrite(ARGV.fetch(0), data.pprof_data)
            puts truth
          RUBY
          expect(status).to be_success, err
          truth = Integer(out.lines.last)
          estimate = total_through(parse_profile(File.binread(path)), "Workload::Allocator#megabyte", "alloc_space")
          expect(truth).to be >= 200_000 * 1_000_000
          expect(estimate).to be_within(truth * 0.10).of(truth)
        end
      end
    end

    it "samples the same allocations again with the same seed" do
      runs = Array.new(2) do
        collector = MemprofilerPprof::Collector.new(**mode_options, sample_rate: 0.01, seed: 42, **unlimited)
        allocator.temporary(0)
        collector.start!
        20_000.times { |i| allocator.temporary(i) }
        data = collector.flush
        collector.stop!
        total_through(parse_profile(data), "Workload::Allocator#temporary", "alloc_objects")
      end
      expect(runs[0]).to be_positive
      expect(runs[1]).to eq(runs[0])
    end

    it "rejects a bad seed" do
      expect { MemprofilerPprof::Collector.new(seed: -1) }.to raise_error(ArgumentError, /seed.*-1/)
      expect { MemprofilerPprof::Collector.new(seed: "1") }.to raise_error(TypeError, /seed.*"1"/)
      expect { MemprofilerPprof::Collector.new(seed: 2**64) }.to raise_error(ArgumentError, /seed/)
    end
  end

  RSpec.describe "estimates when the caps are reached (mode: #{mode})" do
    include EstimateHelpers

    let(:allocator) { Workload::Allocator.new }

    it "shows an allocation spike late in the interval although the allocation list filled early" do
      collector = MemprofilerPprof::Collector.new(**mode_options, sample_rate: 1.0, max_allocation_samples: 1_000,
                                                                  max_heap_samples: 10_000_000, seed: 3)
      allocator.temporary(0)
      allocator.retained(0)
      collector.start!
      30_000.times { |i| allocator.temporary(i) } # fills the list within the first 1,000
      10_000.times { |i| allocator.retained(i) }  # the late spike: 2 objects a call
      data = collector.flush
      collector.stop!
      profile = parse_profile(data)
      expect(data.allocation_samples_count).to eq(1_000)
      expect(data.dropped_samples_allocation_bufsize).to be > 39_000
      late = total_through(profile, "Workload::Allocator#retained", "alloc_objects")
      early = total_through(profile, "Workload::Allocator#temporary", "alloc_objects")
      expect(late).to be_within(2_500).of(20_000)
      expect(early).to be_within(2_500).of(30_000)
    end

    it "keeps the allocation estimate within 3% at sample_rate 0.01 with the default caps reached" do
      collector = MemprofilerPprof::Collector.new(**mode_options, sample_rate: 0.01, seed: 99) # default 10,000 cap
      truth, estimate, data = profile_temporaries(collector, 2_500_000)
      expect(data.allocation_samples_count).to eq(10_000)
      expect(data.dropped_samples_allocation_bufsize).to be > 10_000
      expect(estimate).to be_within(truth * 0.03).of(truth)
    end

    it "keeps the allocation estimate within 7% at sample_rate 0.01 with a small allocation cap" do
      collector = MemprofilerPprof::Collector.new(**mode_options, sample_rate: 0.01, max_allocation_samples: 2_000,
                                                                  max_heap_samples: 10_000_000, seed: 11)
      truth, estimate, data = profile_temporaries(collector, 2_500_000)
      expect(data.allocation_samples_count).to eq(2_000)
      expect(estimate).to be_within(truth * 0.07).of(truth)
    end
  end
end
