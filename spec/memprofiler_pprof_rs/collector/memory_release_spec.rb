# frozen_string_literal: true

require "json"
require "objspace"
require "weakref"

# A collector in a long-running process must not hold on to what no sample
# needs any more (stacks, frame names), and must not keep the app's code
# alive: a frame is held as a Ruby object only until a flush has named it.
RSpec.describe MemprofilerPprof::Collector, "releasing what no sample needs" do
  # [stored stacks, frames held as Ruby objects, frames held by name,
  #  classes held by name]
  def table_sizes(collector)
    collector.__send__(:_native_table_sizes)
  end

  # Methods compiled from a string, in a file name of their own.
  def generated_module(serial)
    mod = Module.new
    mod.module_eval(<<~RUBY, "(generated-#{serial}.rb)", 1)
      def self.make(n) = Array.new(n) { |i| "gen#{serial}-\#{i}" }
      def self.deeper(n) = make(n)
    RUBY
    mod
  end

  def unlimited
    { sample_rate: 1.0, max_allocation_samples: 1_000_000, max_heap_samples: 1_000_000 }
  end

  it "lets generated code be collected once flushed, while its objects' samples live on by name" do
    collector = described_class.new(**unlimited)
    collector.start!
    modules = Array.new(50) { |serial| generated_module(serial) }
    kept = modules.map { |mod| mod.deeper(20) }
    weak = modules.map { |mod| WeakRef.new(mod) }
    modules = nil
    GC.start # in use from now on (see Collector::INUSE_AS_OF)
    first = collector.flush
    _stacks, ruby_frames, named_frames = table_sizes(collector)
    3.times { GC.start }
    collected = weak.count { |ref| !ref.weakref_alive? }
    later = parse_profile(collector.flush)
    collector.stop!

    expect(modules).to be_nil
    expect(first.heap_samples_count).to be >= 50 * 20
    # The flush named every frame: the collector holds names, not methods
    # (the Ruby frames left are of what was allocated while it flushed).
    expect(named_frames).to be >= 100
    expect(ruby_frames).to be < named_frames / 2
    # Nothing else refers to the modules, so they go (a few may be pinned
    # by the conservative stack scan).
    expect(collected).to be >= 40
    # Their strings are still alive and still attributed to their methods.
    files = later.samples.flat_map { |s| s.frames.map(&:filename) }.uniq
    expect(files.grep(/\A\(generated-\d+\.rb\)\z/).size).to eq(50)
    expect(kept.size).to eq(50)
  end

  it "lets a class that holds its own sampled instance be collected once flushed" do
    # In a fresh process: this suite's own setup keeps anonymous classes
    # alive, profiler or not.
    code = <<~RUBY
      require "memprofiler_pprof_rs"
      require "weakref"
      # A memoized default instance: the class holds its instance, whose
      # sample holds the class (for its label) until a flush names it. Made
      # in a method, so no stale stack slot refers to them.
      def self_holding_classes(count)
        Array.new(count) { Class.new.tap { |k| k.instance_variable_set(:@default, k.new) } }.map { |k| WeakRef.new(k) }
      end
      c = MemprofilerPprof::Collector.new(sample_rate: 1.0, max_allocation_samples: 1_000_000,
                                          max_heap_samples: 1_000_000)
      c.start!
      weak = self_holding_classes(20)
      c.flush
      named = c.__send__(:_native_table_sizes)[3]
      3.times { GC.start }
      c.flush
      p [weak.count { |ref| !ref.weakref_alive? }, named, c.__send__(:_native_table_sizes)[3]]
    RUBY
    out, err, status = run_ruby(code)
    expect(status.exitstatus).to eq(0), err
    collected, named, named_after = JSON.parse(out)
    expect(collected).to be >= 15
    expect(named).to be >= 1
    expect(named_after).to be <= named
  end

  it "forgets stacks and frame names once their samples are freed and flushed" do
    collector = described_class.new(**unlimited)
    collector.start!
    kept = Array.new(50) { |serial| generated_module(serial).deeper(20) } # rubocop:disable Lint/UselessAssignment -- alive until the flush
    collector.flush
    stacks_alive, _, named_alive = table_sizes(collector)
    kept = nil
    3.times { GC.start }
    collector.flush
    last_data = collector.flush
    stacks_after, _, named_after = table_sizes(collector)
    collector.stop!
    last = parse_profile(last_data)

    expect(kept).to be_nil
    expect(stacks_alive).to be >= 50
    expect(named_alive).to be >= 100
    # The generated code is gone from the profile (the last module's array
    # may still be pinned by the conservative stack scan)...
    expect(last.samples.flat_map { |s| s.frames.map(&:filename) }.grep(/generated/).uniq.size).to be <= 1
    # ...nor in the collector: what is left is what the flushes and this
    # example allocated since (about 50 stacks and 40 names here).
    expect(stacks_after).to be < stacks_alive / 3
    expect(named_after).to be < named_alive / 2
  end

  it "keeps the collector's memory flat while code keeps being generated and retired" do
    collector = described_class.new(sample_rate: 0.1)
    collector.start!
    ring = Array.new(2_000)
    sizes = []
    60.times do |round|
      mod = generated_module(1000 + round)
      200.times { ring[rand(ring.size)] = mod.deeper(5) }
      next unless (round % 10) == 9

      GC.start
      collector.flush
      sizes << [ObjectSpace.memsize_of(collector), *table_sizes(collector)]
    end
    collector.stop!
    memsize = sizes.map(&:first)
    named = sizes.map(&:last)
    # Six measurements, one per ten generations: the last three are no
    # bigger than the first three (with slack for what happens to be alive).
    expect(memsize.last(3).max).to be <= memsize.first(3).max * 1.25
    expect(named.last(3).max).to be <= named.first(3).max * 1.5 + 20
  end
end
