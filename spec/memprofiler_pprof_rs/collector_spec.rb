# frozen_string_literal: true

require "objspace"

RSpec.describe MemprofilerPprof::Collector do
  let(:workload_file) { File.join(SPEC_ROOT, "fixtures/workload.rb") }

  # Frames of the sample stacks that pass through Workload, as
  # [name, basename, line] triples, leaf first.
  def workload_stacks(profile)
    profile.samples.map do |sample|
      sample.frames.map { |f| [f.name, File.basename(f.filename), f.line] }
    end
  end

  describe "lifecycle" do
    it "starts, reports running, and stops" do
      collector = described_class.new(sample_rate: 1.0)
      expect(collector.running?).to be(false)
      expect(collector.start!).to be(true)
      expect(collector.running?).to be(true)
      expect(collector.start!).to be(false) # already running: no-op
      expect(collector.stop!).to be(true)
      expect(collector.running?).to be(false)
      expect(collector.stop!).to be(false)
    end

    it "refuses to start under another GC than Ruby's default one, naming it" do
      allow(GC).to receive(:config).and_return({ implementation: "mmtk" })
      collector = described_class.new(sample_rate: 1.0)
      expect { collector.start! }.to raise_error(MemprofilerPprof::UnsupportedRuntimeError, /"mmtk" GC/)
      expect(collector.running?).to be(false)
    end

    it "samples nothing while stopped" do
      collector = described_class.new(sample_rate: 1.0)
      Workload::Allocator.new.outer(50)
      data = collector.flush
      expect(data.allocation_samples_count).to eq(0)
      expect(parse_profile(data).samples).to be_empty
    end

    it "profile { } returns the flush and leaves the hooks off" do
      collector = described_class.new(sample_rate: 1.0)
      data = collector.profile { Workload::Allocator.new.outer(20) }
      expect(data).to be_a(MemprofilerPprof::ProfileData)
      expect(data.allocation_samples_count).to be >= 20
      expect(collector.running?).to be(false)
    end

    it "profile without a block is an ArgumentError" do
      expect { described_class.new.profile }.to raise_error(ArgumentError, /needs a block/)
    end

    it "profile stops the hooks even when the block raises" do
      collector = described_class.new(sample_rate: 1.0)
      expect { collector.profile { raise IOError, "boom" } }.to raise_error(IOError, "boom")
      expect(collector.running?).to be(false)
    end
  end

  describe "profiles of a known workload" do
    let(:collector) { described_class.new(sample_rate: 1.0) }
    let(:data) { collector.profile { @result = Workload::Allocator.new.outer(10) } }
    let(:profile) { parse_profile(data) }

    it "returns gzipped pprof as a binary String" do
      expect(data.pprof_data.encoding).to eq(Encoding::BINARY)
      expect(data.pprof_data.byteslice(0, 2).bytes).to eq([0x1f, 0x8b])
      expect(profile.sample_type_names).to eq(%w[alloc_objects alloc_space inuse_objects inuse_space])
      expect(profile.default_sample_type).to eq("inuse_space")
    end

    it "records real Ruby stacks: methods in call order, with files and lines" do
      leaf_stacks = workload_stacks(profile).select { |stack| stack.first.first == "String#*" }
      expect(leaf_stacks).not_to be_empty
      stack = leaf_stacks.first
      names = stack.map(&:first)
      # Leaf first: String#* (C), called by leaf, called (via map/times) by middle, by outer.
      expect(names.first(2)).to eq(["String#*", "Workload::Allocator#leaf"])
      outer_index = names.index("Workload::Allocator#outer")
      expect(outer_index).to be > names.index("Workload::Allocator#leaf")
      expect(names[0...outer_index]).to include("Integer#times", "Workload::Allocator#middle")
      # Files and lines of the fixture.
      expect(stack[1]).to eq(["Workload::Allocator#leaf", "workload.rb", 16])
      expect(stack[outer_index]).to eq(["Workload::Allocator#outer", "workload.rb", 8])
      # A C method is shown at its caller's file and line, as in Ruby backtraces.
      expect(stack[0]).to eq(["String#*", "workload.rb", 16])
      expect(stack.map { |f| f[1] }).to include(File.basename(__FILE__))
    end

    it "counts every allocation of the leaf method at sample_rate 1.0" do
      leaf_samples = profile.samples.select { |s| s.frames.first&.name == "String#*" }
      # 10 calls, each `"..." * 8` allocates one String in String#*.
      expect(leaf_samples.sum { |s| s.value(profile, "alloc_objects") }).to eq(10)
      expect(data.heap_samples_count).to be >= 10
    end

    it "reads back with go tool pprof for every sample type" do
      %w[alloc_objects alloc_space inuse_objects inuse_space].each do |index|
        out, err, status = go_pprof(data, "-top", "-sample_index=#{index}")
        expect(status.exitstatus).to eq(0), "go tool pprof -sample_index=#{index} failed: #{err}"
        expect(out).to include("Workload::Allocator#leaf")
        expect(err).not_to match(/warning|error/i)
      end
    end

    it "reads back with go tool pprof -traces, showing the stack" do
      out, err, status = go_pprof(data, "-traces")
      expect(status.exitstatus).to eq(0), err
      expect(out).to include("String#*", "Workload::Allocator#leaf", "Workload::Allocator#outer")
    end
  end

  describe "sizes" do
    it "attributes the bytes of big strings to the method that allocated them" do
      collector = described_class.new(sample_rate: 1.0)
      data = collector.profile { @kept = Workload::Allocator.big_strings(20, 50_000) }
      profile = parse_profile(data)
      alloc_space = total_through(profile, "Workload::Allocator.big_strings", "alloc_space", leaf: "String#*")
      inuse_space = total_through(profile, "Workload::Allocator.big_strings", "inuse_space", leaf: "String#*")
      expect(alloc_space).to be_between(20 * 50_000, 20 * 50_000 * 1.1)
      expect(inuse_space).to eq(alloc_space)
    end
  end

  describe "live objects" do
    it "keeps retained objects across flushes and forgets freed ones" do
      collector = described_class.new(sample_rate: 1.0)
      collector.start!
      retained = Workload::Allocator.big_strings(5, 10_000)
      Workload::Allocator.big_strings(50, 10_000) # garbage
      GC.start
      first_data = collector.flush
      second_data = collector.flush
      first = parse_profile(first_data)
      second = parse_profile(second_data)
      expect(big_strings_alive(first)).to eq(5)
      expect(big_strings_alive(second)).to eq(5) # still alive: in every flush
      # Allocations, unlike live objects, are each interval's own: the big
      # Strings are in the first profile only. (Comparing the two totals
      # failed when run alone: the second interval holds the first flush's
      # own Ruby objects, ~70, as many as the first's.)
      allocated = ->(profile) { total_through(profile, "Workload::Allocator.big_strings", "alloc_objects", leaf: "String#*") }
      expect(allocated.call(first)).to eq(55)
      expect(allocated.call(second)).to eq(0)
      retained.clear
      retained = nil # rubocop:disable Lint/UselessAssignment -- drops the last reference before GC.start
      GC.start
      third = parse_profile(collector.flush)
      expect(big_strings_alive(third)).to eq(0)
    ensure
      collector.stop!
    end
  end

  describe "ProfileData" do
    it "has counts, rate, times and a readable inspect" do
      collector = described_class.new(sample_rate: 1.0)
      data = collector.profile { Workload::Allocator.new.outer(5) }
      expect(data.sample_rate).to eq(1.0)
      expect(data.dropped_samples_count).to eq(0)
      expect(data.finished_at).to be >= data.started_at
      expect(data.flush_duration_nsecs).to be > 0
      expect(data.longest_gvl_hold_nsecs).to be_between(1, data.flush_duration_nsecs)
      expect(data.inspect).to match(/allocation samples/)
      expect(data.inspect).not_to include("\x1f".b.force_encoding(Encoding::UTF_8))
    end
  end

  describe "caps" do
    it "respects max_allocation_samples and counts drops" do
      collector = described_class.new(sample_rate: 1.0, max_allocation_samples: 10)
      data = collector.profile { Workload::Allocator.new.outer(100) }
      expect(data.allocation_samples_count).to eq(10)
      expect(data.dropped_samples_allocation_bufsize).to be > 90
    end
  end

  describe "arguments" do
    it "has the C gem's defaults" do
      collector = described_class.new
      expect(collector.sample_rate).to eq(0.01)
      expect(collector.max_allocation_samples).to eq(10_000)
      expect(collector.max_heap_samples).to eq(50_000)
      expect(collector.bt_method).to eq(:cfp)
    end

    it "has working setters" do
      collector = described_class.new
      collector.sample_rate = 0.5
      collector.max_allocation_samples = 7
      collector.max_heap_samples = 9
      expect([collector.sample_rate, collector.max_allocation_samples, collector.max_heap_samples]).to eq([0.5, 7, 9])
    end

    it "rejects bad values with errors naming them" do
      expect { described_class.new(sample_rate: 1.5) }.to raise_error(ArgumentError, /sample_rate.*1\.5/)
      expect { described_class.new(sample_rate: -0.1) }.to raise_error(ArgumentError, /-0\.1/)
      expect { described_class.new(sample_rate: Float::NAN) }.to raise_error(ArgumentError, /NaN/)
      expect { described_class.new(sample_rate: "0.1") }.to raise_error(TypeError, /"0\.1"/)
      expect { described_class.new(sample_rate: nil) }.to raise_error(TypeError, /nil/)
      expect { described_class.new(max_allocation_samples: -1) }.to raise_error(ArgumentError, /max_allocation_samples.*-1/)
      expect { described_class.new(max_heap_samples: 1.5) }.to raise_error(TypeError, /max_heap_samples.*1\.5/)
      expect { described_class.new(bt_method: :nope) }.to raise_error(ArgumentError, /:nope/)
      expect { described_class.new(no_such_option: 1) }.to raise_error(ArgumentError, /no_such_option/)
      expect { described_class.new.flush(yield_gvl: "yes") }.to raise_error(TypeError, /yield_gvl/)
    end

    it "refuses to be copied" do
      collector = described_class.new(sample_rate: 0.5)
      expect { collector.dup }.to raise_error(TypeError, /can't be copied/)
      expect { collector.clone }.to raise_error(TypeError, /can't be copied/)
    end

    it "native methods check types themselves" do
      collector = described_class.new
      expect { collector.send(:_native_set_sample_rate, "x") }.to raise_error(TypeError, /sample_rate/)
      expect { collector.send(:_native_set_sample_rate, 3.0) }.to raise_error(ArgumentError, /3\.0/)
      expect { collector.send(:_native_set_max_heap_samples, -5) }.to raise_error(ArgumentError, /-5/)
      expect { collector.send(:_native_set_max_heap_samples, 2**70) }
        .to raise_error(ArgumentError, /max_heap_samples.*#{2**70}/)
      expect { collector.send(:_native_set_max_heap_samples, "5") }.to raise_error(TypeError, /max_heap_samples.*"5"/)
      expect { described_class.instance_method(:running?).bind_call(Object.new) }.to raise_error(TypeError)
    end
  end

  describe "memory accounting" do
    it "reports its own memory to ObjectSpace.memsize_of" do
      collector = described_class.new(sample_rate: 1.0)
      empty = ObjectSpace.memsize_of(collector)
      collector.start!
      kept = Array.new(2_000) { |i| "retained #{i}" }
      collector.stop!
      expect(kept.size).to eq(2_000)
      expect(ObjectSpace.memsize_of(collector)).to be > empty
    end
  end

  describe "GC interaction" do
    it "survives GC.compact with sampled objects moving, keeping them tracked" do
      skip "GC.compact unsupported here" unless GC.respond_to?(:compact)
      collector = described_class.new(sample_rate: 1.0)
      collector.start!
      kept = Workload::Allocator.big_strings(200, 100)
      GC.start
      GC.compact
      kept_after = parse_profile(collector.flush)
      expect(big_strings_alive(kept_after)).to eq(200)
      expect(kept.map(&:bytesize).uniq).to eq([100])
      kept = nil # rubocop:disable Lint/UselessAssignment -- drops the last reference before GC.start
      GC.start
      after_free = parse_profile(collector.flush)
      expect(big_strings_alive(after_free)).to eq(0)
    ensure
      collector&.stop!
    end

    it "switches the hooks off when a running collector is garbage collected, and at exit" do
      code = <<~RUBY
        require "memprofiler_pprof_rs"
        active_hooks = -> { TracePoint.stat.values.first.first }
        def start_unreferenced = 3.times { MemprofilerPprof::Collector.new(sample_rate: 1.0, mode: :exact).start! }
        start_unreferenced
        while_running = active_hooks.call
        5.times { GC.start; 20_000.times { |i| "s\#{i}" } }
        after_gc = active_hooks.call
        running = MemprofilerPprof::Collector.new(sample_rate: 0.5, mode: :exact)
        running.start!
        10_000.times { |i| [i.to_s] }
        puts [while_running, after_gc, active_hooks.call].inspect
      RUBY
      out, err, status = run_ruby(code)
      expect(status.exitstatus).to eq(0), err
      # (mode :exact: both hooks, always on.)
      # 3 collectors x (NEWOBJ + FREEOBJ); none once collected; 2 for the one
      # still running when the process exits (cleanly).
      expect(out).to eq("[6, 0, 2]\n")
    end

    it "survives GC.stress during a short profile" do
      code = <<~RUBY
        require "memprofiler_pprof_rs"
        c = MemprofilerPprof::Collector.new(sample_rate: 1.0)
        c.start!
        GC.stress = true
        200.times { |i| "x\#{i}" * 3 }
        GC.stress = false
        d = c.flush
        c.stop!
        puts d.allocation_samples_count >= 200
      RUBY
      out, err, status = run_ruby(code)
      expect(status.exitstatus).to eq(0), err
      expect(out).to eq("true\n")
    end
  end

  describe "sampling rate" do
    it "samples about sample_rate of the allocations and scales the estimate" do
      collector = described_class.new(sample_rate: 0.1, max_allocation_samples: 100_000)
      data = collector.profile { 200_000.times { |i| i.to_s } }
      profile = parse_profile(data)
      expect(data.allocation_samples_count).to be_between(17_000, 23_000)
      # Each sample stands for 10 allocations.
      expect(profile.total("alloc_objects")).to be_within(30_000).of(200_000)
    end
  end
end

RSpec.describe MemprofilerPprof::Collector, "state between runs" do
  let(:unlimited) { { max_allocation_samples: 10_000_000, max_heap_samples: 10_000_000 } }

  it "start! clears samples and drop counters of an earlier run" do
    collector = described_class.new(sample_rate: 1.0, max_allocation_samples: 5)
    # The first flush in a process also samples the call caches Ruby creates
    # the first time each of flush's call sites runs; get those out of the way.
    collector.profile { nil }
    collector.start!
    kept = Array.new(50) { |i| i.to_s }
    collector.stop!
    live_before = collector.live_heap_samples_count
    collector.start!
    data = collector.flush # nothing allocated since start!
    collector.stop!
    expect(live_before).to be >= 50 # the allocation cap does not limit live tracking
    expect(data.dropped_samples_allocation_bufsize).to eq(0)
    # Only the few objects flush itself allocates before reading the samples.
    expect(data.heap_samples_count).to be < 5
    expect(kept.size).to eq(50)
  end

  it "flush resets the drop counters" do
    collector = described_class.new(sample_rate: 1.0, max_allocation_samples: 100)
    collector.start!
    Array.new(500) { |i| i.to_s }
    first = collector.flush
    second = collector.flush
    collector.stop!
    expect(first.dropped_samples_allocation_bufsize).to be > 0
    expect(second.dropped_samples_allocation_bufsize).to eq(0)
  end

  it "applies a new sample_rate while running" do
    collector = described_class.new(sample_rate: 1.0, **unlimited)
    collector.start!
    allocator = Workload::Allocator.new
    5_000.times { |i| allocator.two_objects(i) }
    full = collector.flush
    collector.sample_rate = 0.0
    5_000.times { |i| allocator.two_objects(i) }
    none = collector.flush
    collector.stop!
    through = ->(data) { total_through(parse_profile(data), "Workload::Allocator#two_objects", "alloc_objects") }
    expect(through.call(full)).to eq(10_000)
    expect(through.call(none)).to eq(0)
    expect(none.sample_rate).to eq(0.0)
  end

  it "lets go soon of what a stopped collector's last flush held" do
    collector = described_class.new(sample_rate: 1.0, **unlimited)
    makers = Array.new(1_500) do |n|
      eval(<<~RUBY, binding, "stopped_#{n}.rb", 1)
        ->(i) { "stopped-#{n}-\#{i}" * 2 }
      RUBY
    end
    collector.start!
    collector.flush
    makers.each { |maker| maker.call(1) }
    collector.stop!
    GC.start
    data = collector.flush
    held = collector.__send__(:_native_table_sizes)
    # Nothing samples any more, yet the postponed job comes back (woken by
    # the windows' timer) until the stacks are gone, and with them the Ruby
    # frames that kept code alive. (Waited for, up to a bound.)
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 10
    sizes = held
    while sizes.first(2).any? { |n| n >= 100 } && Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
      Thread.pass
      sizes = collector.__send__(:_native_table_sizes)
    end
    expect(data.allocation_samples_count).to be >= 3_000
    expect(held.first).to be >= 400 # more than the flush's end removes
    expect(sizes.first(2)).to all(be < 100)
  end

  it "releases stacks and frames nobody refers to, so memory stays bounded" do
    collector = described_class.new(sample_rate: 1.0, **unlimited)
    methods = Array.new(300) do |n|
      eval(<<~RUBY, binding, "generated_#{n}.rb", 1)
        ->(i) { "generated-#{n}-\#{i}" * 2 }
      RUBY
    end
    collector.start!
    collector.flush
    baseline = ObjectSpace.memsize_of(collector)
    garbage = methods.flat_map { |m| Array.new(20) { |i| m.call(i) } } # rubocop:disable Lint/UselessAssignment -- alive until measured
    grown = ObjectSpace.memsize_of(collector)
    stacks_grown = collector.__send__(:_native_table_sizes).first
    garbage = nil
    GC.start
    collector.flush
    collector.flush
    settled = ObjectSpace.memsize_of(collector)
    stacks_settled = collector.__send__(:_native_table_sizes).first
    collector.stop!
    expect(garbage).to be_nil
    expect(grown).to be > baseline + 300 * 64
    # The stored stacks are gone (what is left is what the flushes
    # allocated)...
    expect(stacks_grown).to be >= 300
    expect(stacks_settled).to be < stacks_grown / 3
    # ...while the tables' capacity may stay allocated: memsize_of counts
    # capacity, so it need not fall, but it must not grow past the peak by
    # more than the flushes' own bookkeeping.
    expect(settled).to be < grown * 1.1
  end
end
