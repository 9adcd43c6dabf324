# frozen_string_literal: true

require "zlib"

# The shape of every profile: what pprof tools (and Pyroscope) rely on.
RSpec.describe "profile shape" do
  let(:unlimited) { { max_allocation_samples: 10_000_000, max_heap_samples: 10_000_000 } }

  class ShapeWidget
    def initialize(payload)
      @payload = payload
    end
  end

  def labels_of(sample)
    sample.labels.to_h { |l| [l.key, l.str.empty? ? [l.num, l.num_unit] : l.str] }
  end

  it "labels every sample with its class, and live ones with their GC age" do
    collector = MemprofilerPprof::Collector.new(sample_rate: 1.0, **unlimited)
    collector.start!
    @widgets = Array.new(30) { |i| ShapeWidget.new("payload #{i}") }
    @anonymous = Array.new(5) { Class.new(ShapeWidget).new(nil) }
    GC.start
    GC.start
    data = collector.flush
    collector.stop!
    profile = parse_profile(data)

    expect(profile.samples).to all(satisfy { |s| labels_of(s).key?("class") })
    widget_samples = profile.samples.select { |s| labels_of(s)["class"] == "ShapeWidget" }
    expect(widget_samples.sum { |s| s.value(profile, "alloc_objects") }).to eq(30)
    live = widget_samples.select { |s| s.value(profile, "inuse_objects").positive? }
    expect(live.sum { |s| s.value(profile, "inuse_objects") }).to eq(30)
    expect(live.map { |s| labels_of(s)["gc_age"] }.uniq).to eq([[2, "collections"]])
    allocated_only = widget_samples - live
    expect(allocated_only.map { |s| labels_of(s)["gc_age"] }.uniq).to eq([nil])

    classes = profile.samples.map { |s| labels_of(s)["class"] }.uniq
    expect(classes).to include("String", "(anonymous subclass of ShapeWidget)")
    expect(classes.grep(/#<Class:/)).to be_empty
  end

  it "gives every sample a stack, without the main script's hidden second <main> frame" do
    code = <<~RUBY
      require "memprofiler_pprof_rs"
      collector = MemprofilerPprof::Collector.new(sample_rate: 1.0)
      data = collector.profile do
        Thread.new { "in a thread" * 2 }.join
        $kept = "at the top" * 2
      end
      $stdout.binmode
      $stdout.write(data.pprof_data)
    RUBY
    out, err, status = run_ruby(code)
    expect(status).to be_success, err
    stacks = stacks_of(parse_profile(out))
    expect(stacks).to all(satisfy { |frames| !frames.empty? })
    expect(stacks.map { |frames| frames.last(2) }).not_to include(["<main>", "<main>"])
    expect(stacks).to include(["String#*", "block in <main>", "MemprofilerPprof::Collector#profile", "<main>"])
    expect(stacks).to include(["String#*", "block (2 levels) in <main>"])
  end

  it "is read by go tool pprof: -tags, -tagfocus, every -sample_index, and -base" do
    collector = MemprofilerPprof::Collector.new(sample_rate: 1.0, **unlimited)
    collector.start!
    # (A GC after each: in-use counts what a GC has seen alive.)
    @first = Array.new(20) { |i| ShapeWidget.new(i.to_s) }
    GC.start
    first = collector.flush
    @second = Array.new(40) { |i| ShapeWidget.new(i.to_s) }
    GC.start
    second = collector.flush
    collector.stop!

    out, err, status = go_pprof(second, "-tags")
    expect(status.exitstatus).to eq(0), err
    expect(out).to include("class:", "ShapeWidget", "gc_age:")

    out, err, status = go_pprof(second, "-top", "-sample_index=inuse_objects", "-tagfocus=class=ShapeWidget")
    expect(status.exitstatus).to eq(0), err
    expect(out).to match(/accounting for 60,/)

    Dir.mktmpdir do |dir|
      base = File.join(dir, "base.pb.gz")
      File.binwrite(base, first.pprof_data)
      out, err, status = go_pprof(second, "-top", "-sample_index=inuse_objects",
                                  "-tagfocus=class=ShapeWidget", "-base=#{base}")
      expect(status.exitstatus).to eq(0), err
      # What grew between the flushes: the 40 new widgets.
      expect(out).to match(/accounting for 40,/)
    end
  end

  it "has no '-' in sample type names or label keys, and valid UTF-8 strings" do
    bad_name = "weird\xFF\xFEname".b
    klass = Class.new { define_method(:make) { "x" * 10 } }
    Object.const_set(:ShapeBadPath, klass) unless defined?(ShapeBadPath)
    eval("def shape_bad_path_method = ShapeBadPath.new.make", binding, "/tmp/#{bad_name.force_encoding('UTF-8')}.rb", 1)
    collector = MemprofilerPprof::Collector.new(sample_rate: 1.0)
    data = collector.profile { shape_bad_path_method }
    profile = parse_profile(data)
    expect(profile.sample_type_names.grep(/-/)).to be_empty
    expect(profile.samples.flat_map { |s| s.labels.map(&:key) }.grep(/-/)).to be_empty
    expect(profile.strings).to all(satisfy(&:valid_encoding?))
    expect(profile.strings.grep(/weird.*name/)).not_to be_empty
  end

  def shape_recurse(depth)
    depth.zero? ? "bottom of the stack" * 2 : shape_recurse(depth - 1)
  end

  it "ends stacks deeper than 1024 frames in a visible truncation frame" do
    collector = MemprofilerPprof::Collector.new(sample_rate: 1.0)
    data = collector.profile { @deep = shape_recurse(2_000) }
    profile = parse_profile(data)
    deep = profile.samples.find { |s| s.frames.first.name == "String#*" && s.frames[1].name.end_with?("shape_recurse") }
    expect(deep).not_to be_nil
    expect(deep.frames.size).to eq(1_025)
    expect(deep.frames.last.name).to eq("(truncated stack)")
    out, err, status = go_pprof(data, "-traces")
    expect(status.exitstatus).to eq(0), err
    expect(out).to include("(truncated stack)")
  end

  it "stays well under 1 MB with 50,000 live samples over thousands of stacks" do
    methods = Array.new(2_000) do |n|
      eval("->(x) { [x, #{n}] }", binding, "stacks_#{n}.rb", 1)
    end
    collector = MemprofilerPprof::Collector.new(sample_rate: 1.0, max_allocation_samples: 100_000,
                                                max_heap_samples: 100_000)
    collector.start!
    @kept = Array.new(50_000) { |i| methods[i % 2_000].call(i) }
    GC.start # in use from now on (see Collector::INUSE_AS_OF)
    data = collector.flush
    collector.stop!
    expect(data.heap_samples_count).to be >= 50_000
    expect(data.pprof_data.bytesize).to be < 1_000_000
    _out, err, status = go_pprof(data, "-top")
    expect(status.exitstatus).to eq(0), err
  end

  it "folds the smallest samples into (other) to respect max_profile_bytes, keeping the totals" do
    collector = MemprofilerPprof::Collector.new(sample_rate: 1.0, **unlimited)
    collector.start!
    # Many distinct stacks: 600 methods on their own lines, each keeping 20
    # objects, called through a chain 30 deep.
    holder = Module.new
    600.times do |i|
      holder.module_eval(<<~RUBY, "folding.rb", i * 10 + 1)
        def self.keep#{i}(depth) = depth.zero? ? Array.new(20) { |j| "\#{j}" } : keep#{i}(depth - 1)
      RUBY
    end
    @kept = Array.new(600) { |i| holder.public_send(:"keep#{i}", 30) }
    GC.start
    # The allocations of the setup, and the first call of each flush path
    # (its call sites' caches, T_IMEMO, stay alive).
    collector.flush
    collector.flush(max_profile_bytes: 1 << 30)
    # In mode :light an object stays pinned until the collector has its id,
    # which a flush asks for: what died meanwhile is collected only now.
    GC.start
    full = collector.flush
    limited = collector.flush(max_profile_bytes: 20_000)
    collector.stop!

    expect(full.folded_samples_count).to eq(0)
    expect(limited.folded_samples_count).to be_positive
    expect(Zlib.gunzip(limited.pprof_data).bytesize).to be <= 20_000
    full_profile = parse_profile(full)
    limited_profile = parse_profile(limited)
    # The second profile also holds what the first flush left alive: 13 objects
    # when this example runs alone, up to 25 seen in a whole suite's run (the
    # process's other threads). Folding that dropped values instead of adding
    # them up would lose far more: over 100 samples of up to 20 objects each.
    expect(limited.folded_samples_count).to be > 100
    expect(limited_profile.total("inuse_objects")).to be_within(50).of(full_profile.total("inuse_objects"))
    expect(stacks_of(limited_profile)).to include(["(other)"])
    expect(limited_profile.comments.join).to include("folded into one (other) sample")
    expect { collector.flush(max_profile_bytes: 0) }.to raise_error(ArgumentError, /max_profile_bytes.*0/)
  end
end
