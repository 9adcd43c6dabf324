# frozen_string_literal: true

# What inuse_* counts (Collector::INUSE_AS_OF): by default the sampled
# objects alive at the last completed GC, so that garbage not collected yet
# never reads as in use; with :flush, everything not freed at the flush.
module InuseAsOf
  # Ruby's GC scans the machine stack conservatively: a word there that
  # happens to point at a garbage String keeps it alive through a GC. A few
  # such Strings are alive, not an error; a garbage site read in full would be
  # thousands.
  STACK_KEPT = 5

  # count Strings, none kept
  def self.garbage(count) = count.times { |i| i.to_s }
  # count Strings and their Array, all kept
  def self.kept(count) = Array.new(count) { |i| i.to_s }
end

%i[exact light].each do |mode|
  RSpec.describe MemprofilerPprof::Collector, "inuse_as_of (mode: #{mode})" do
    let(:unlimited) { { mode: mode, sample_rate: 1.0, max_allocation_samples: 1_000_000, max_heap_samples: 1_000_000 } }

    def inuse(data, method, type = "inuse_objects")
      total_through(parse_profile(data), method, type)
    end

    it "counts in use what lived through the last completed GC: garbage reads 0, a kept object one GC later" do
      collector = described_class.new(**unlimited)
      expect(collector.inuse_as_of).to eq(:last_gc)
      collector.start!
      # 30,000 objects each: GCs run meanwhile and free the garbage made
      # before them; the rest is garbage not collected yet.
      InuseAsOf.garbage(30_000)
      kept = InuseAsOf.kept(30_000)
      before_gc = collector.flush
      GC.start
      after_gc = collector.flush
      collector.stop!
      expect(inuse(before_gc, "InuseAsOf.garbage")).to be <= InuseAsOf::STACK_KEPT
      # Those since the last GC are left out, and the profile says how many.
      left_out = Integer(parse_profile(before_gc).comments.join[/; (\d+) sampled since are left out/, 1])
      expect(left_out).to be_positive
      expect(inuse(before_gc, "InuseAsOf.kept")).to be < 30_000
      expect(total_through(parse_profile(before_gc), "InuseAsOf.garbage", "alloc_objects")).to be >= 30_000
      expect(inuse(after_gc, "InuseAsOf.garbage")).to be <= InuseAsOf::STACK_KEPT
      # (+ the Array, and a few first-call caches the VM keeps)
      expect(inuse(after_gc, "InuseAsOf.kept")).to be_between(30_001, 30_005)
      expect(parse_profile(before_gc).comments.grep(/\Ainuse_\*: sampled objects alive at the last completed GC/)).not_to be_empty
      expect(kept.size).to eq(30_000)
    end

    it "counts everything not freed at the flush with inuse_as_of: :flush, garbage included" do
      collector = described_class.new(**unlimited, inuse_as_of: :flush)
      collector.start!
      GC.start
      GC.disable # no GC frees the garbage before the flush
      begin
        InuseAsOf.garbage(3_000)
        kept = InuseAsOf.kept(3_000)
        data = collector.flush
      ensure
        GC.enable
      end
      collector.stop!
      expect(inuse(data, "InuseAsOf.garbage")).to be >= 3_000
      expect(inuse(data, "InuseAsOf.kept")).to be >= 3_000
      expect(parse_profile(data).comments).to include(/\Ainuse_\*: .* \(inuse_as_of: :flush\)\z/)
      expect(kept.size).to eq(3_000)
    end

    it "switches while running, and refuses anything else by name" do
      collector = described_class.new(**unlimited)
      collector.start!
      kept = InuseAsOf.kept(1_000)
      collector.inuse_as_of = :flush
      expect(inuse(collector.flush, "InuseAsOf.kept")).to be_between(1_001, 1_005)
      collector.stop!
      expect { collector.inuse_as_of = :now }
        .to raise_error(ArgumentError, "inuse_as_of must be one of [:last_gc, :flush], got :now")
      expect { described_class.new(inuse_as_of: "flush") }.to raise_error(ArgumentError, /got "flush"/)
      expect(kept.size).to eq(1_000)
    end

    it "makes Collector#profile's in-use what the block left alive" do
      collector = described_class.new(**unlimited)
      kept = nil
      data = collector.profile do
        InuseAsOf.garbage(5_000)
        kept = InuseAsOf.kept(5_000)
      end
      expect(inuse(data, "InuseAsOf.kept")).to be_between(5_001, 5_005)
      expect(inuse(data, "InuseAsOf.garbage")).to be <= InuseAsOf::STACK_KEPT
      expect(kept.size).to eq(5_000)
    end
  end
end
