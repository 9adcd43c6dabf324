# frozen_string_literal: true

require File.join(SPEC_ROOT, "fixtures/frame_names")

# rb_profile_frames reports a frame running a block (or a rescue clause)
# of a method as the method itself on every Ruby (3.1 to 4.0); the gem
# tells them apart by line (crates/sampler/src/block_frames.rs). And Ruby's own
# methods written in Ruby (Integer#times since 3.3) read as C methods do,
# at their caller's file and line. These hold on every Ruby in CI.
RSpec.describe "frame names" do
  fixture = File.join(SPEC_ROOT, "fixtures/frame_names.rb")

  # The stack of the first sample whose leaf is String#* and which passes
  # through a frame matching `through`: [name, "file:line"] pairs, leaf
  # first, down to the spec's own frames (excluded).
  def stack_of(profile, through)
    sample = profile.samples.find do |s|
      s.frames.first&.name == "String#*" && s.frames.any? { |f| f.name.match?(through) }
    end
    raise "no String#* sample through #{through}: #{stacks_of(profile).uniq.first(5)}" unless sample

    sample.frames.map { |f| [f.name, "#{File.basename(f.filename)}:#{f.line}"] }
          .take_while { |_, place| !place.start_with?(File.basename(__FILE__)) }
  end

  def profile_of(&block)
    collector = MemprofilerPprof::Collector.new(sample_rate: 1.0)
    parse_profile(collector.profile(&block))
  end

  let(:blocks) { FrameNames::Blocks.new }

  it "names a block written over several lines, at its lines" do
    stack = stack_of(profile_of { blocks.multi_line(3) }, /multi_line/)
    expect(stack).to eq([
                          ["String#*", "frame_names.rb:9"],
                          ["block in FrameNames::Blocks#multi_line", "frame_names.rb:9"],
                          ["Integer#times", "frame_names.rb:8"],
                          ["FrameNames::Blocks#multi_line", "frame_names.rb:8"]
                        ])
  end

  it "tells a one-line block from the method calling it on the same line" do
    stack = stack_of(profile_of { blocks.one_line([1, 2]) }, /one_line/)
    expect(stack).to eq([
                          ["String#*", "frame_names.rb:13"],
                          ["block in FrameNames::Blocks#one_line", "frame_names.rb:13"],
                          ["Array#map", "frame_names.rb:13"],
                          ["FrameNames::Blocks#one_line", "frame_names.rb:13"]
                        ])
  end

  it "names nested one-line blocks by level" do
    stack = stack_of(profile_of { blocks.nested(2) }, /nested/)
    ours = stack.map(&:first).grep(/FrameNames/)
    expect(ours).to eq(["block (2 levels) in FrameNames::Blocks#nested",
                        "block in FrameNames::Blocks#nested",
                        "FrameNames::Blocks#nested"])
    expect(stack.map(&:last).uniq).to eq(["frame_names.rb:16"])
  end

  it "names a rescue clause" do
    stack = stack_of(profile_of { blocks.rescued }, /rescued/)
    expect(stack.map(&:first)).to eq(["String#*", "rescue in FrameNames::Blocks#rescued",
                                      "FrameNames::Blocks#rescued"])
    expect(stack.first(2).map(&:last)).to eq(["frame_names.rb:22", "frame_names.rb:22"])
  end

  it "names blocks of singleton methods and of methods from an included module" do
    stack = stack_of(profile_of { FrameNames::Blocks.on_class(2) }, /on_class/)
    expect(stack.map(&:first)).to include("block in FrameNames::Blocks.on_class", "FrameNames::Blocks.on_class")
    stack = stack_of(profile_of { FrameNames::WithMixin.new.mixed(2) }, /mixed/)
    expect(stack.map(&:first)).to include("block in FrameNames::Mixin#mixed", "FrameNames::Mixin#mixed")
  end

  it "alternates method and block through recursion on a one-line block" do
    stack = stack_of(profile_of { blocks.walk(2) }, /walk/)
    ours = stack.map(&:first).grep(/walk/)
    expect(ours).to eq(["FrameNames::Blocks#walk", "block in FrameNames::Blocks#walk"] * 2 +
                       ["FrameNames::Blocks#walk"])
  end

  it "names a stored proc called after its method returned as a block" do
    later = blocks.proc_for_later
    stack = stack_of(profile_of { later.call }, /later/)
    expect(stack.first(2)).to eq([["String#*", "frame_names.rb:33"],
                                  ["block in FrameNames::Blocks#proc_for_later", "frame_names.rb:33"]])
  end

  describe "blocks with no frame between them and their method, clauses, prepend" do
    let(:direct) { FrameNames::Direct.new }

    def ours(stack) = stack.map(&:first).grep(/FrameNames/)

    it "names a proc called by its own method (Proc#call pushes no frame)" do
      stack = stack_of(profile_of { direct.proc_called_here }, /proc_called_here/)
      expect(ours(stack)).to eq(["block in FrameNames::Direct#proc_called_here",
                                 "FrameNames::Direct#proc_called_here"])
    end

    it "names a block yielded to by a recursive call of its own method" do
      stack = stack_of(profile_of { direct.yield_to_itself(1) }, /yield_to_itself/)
      expect(ours(stack)).to eq(["block in FrameNames::Direct#yield_to_itself",
                                 "FrameNames::Direct#yield_to_itself", "FrameNames::Direct#yield_to_itself"])
    end

    it "names a block in an ensure clause on the normal path and after a raise" do
      stack = stack_of(profile_of { direct.ensured(false) }, /ensured/)
      expect(ours(stack)).to eq(["block in FrameNames::Direct#ensured", "FrameNames::Direct#ensured"])
      profile = profile_of do
        direct.ensured(true)
      rescue ArgumentError
        nil
      end
      # Ruby names a block in a clause after the method alone, as here.
      expect(ours(stack_of(profile, /ensure in/))).to eq(["block in FrameNames::Direct#ensured",
                                                          "ensure in FrameNames::Direct#ensured",
                                                          "FrameNames::Direct#ensured"])
    end

    it "names a block in a rescue clause" do
      stack = stack_of(profile_of { direct.rescued_with_block }, /rescued_with_block/)
      expect(ours(stack)).to eq(["block in FrameNames::Direct#rescued_with_block",
                                 "rescue in FrameNames::Direct#rescued_with_block",
                                 "FrameNames::Direct#rescued_with_block"])
    end

    it "finds a method behind a prepended module" do
      stack = stack_of(profile_of { direct.behind_prepend(2) }, /behind_prepend/)
      expect(ours(stack)).to eq(["block in FrameNames::Direct#behind_prepend", "FrameNames::Direct#behind_prepend",
                                 "FrameNames::Instrumented#behind_prepend"])
    end
  end

  it "keeps the method's name for blocks of a method it cannot find by name (an anonymous class)" do
    stack = stack_of(profile_of { FrameNames::ANONYMOUS.first.new.anonymous_block(2) }, /anonymous_block/)
    names = stack.map(&:first).grep(/anonymous_block/)
    expect(names.size).to eq(2)
    expect(names).to all(end_with("#anonymous_block"))
    expect(names.grep(/block in/)).to be_empty
  end

  it "shows Ruby's own methods written in Ruby as C methods: at the caller's file and line" do
    profile = profile_of { blocks.multi_line(2) }
    expect(profile.strings.grep(/<internal:/)).to be_empty
    times = profile.samples.flat_map(&:frames).select { |f| f.name == "Integer#times" }
    expect(times).not_to be_empty
    expect(times.map { |f| [File.basename(f.filename), f.line] }.uniq).to eq([["frame_names.rb", 8]])
  end

  it "describes a method by class, name and place, and only when all three match" do
    expect(MemprofilerPprof::MethodBlocks.describe("FrameNames::Blocks", "multi_line", false, fixture, 7))
      .to eq([["block in ", 8, 10, nil, "block"]])
    expect(MemprofilerPprof::MethodBlocks.describe("FrameNames::Blocks", "rescued", false, fixture, 19))
      .to eq([["rescue in ", 21, 22, nil, "rescue"]])
    # Not the method at that place (moved, redefined), not found, no blocks: nil.
    expect(MemprofilerPprof::MethodBlocks.describe("FrameNames::Blocks", "multi_line", false, fixture, 8)).to be_nil
    expect(MemprofilerPprof::MethodBlocks.describe("FrameNames::Nope", "multi_line", false, fixture, 7)).to be_nil
    expect(MemprofilerPprof::MethodBlocks.describe("#<Class:0x1>", "x", false, fixture, 7)).to be_nil
    expect(MemprofilerPprof::MethodBlocks.describe("FrameNames::Blocks", "walk", false, fixture, 29))
      .to eq([["block in ", 29, 29, nil, "block"]])
  end

  it "lets through what is the program's (an Interrupt), and rescues the rest" do
    allow(RubyVM::InstructionSequence).to receive(:of).and_raise(Interrupt)
    expect { MemprofilerPprof::MethodBlocks.describe("FrameNames::Blocks", "multi_line", false, fixture, 7) }
      .to raise_error(Interrupt)
    allow(RubyVM::InstructionSequence).to receive(:of).and_raise(TypeError)
    expect(MemprofilerPprof::MethodBlocks.describe("FrameNames::Blocks", "multi_line", false, fixture, 7)).to be_nil
  end

  it "never loads code to describe a method (a pending autoload stays pending)" do
    mod = Module.new
    stub_const("FrameNamesAutoload", mod)
    mod.autoload(:NotLoaded, "/nonexistent/never_loaded.rb")
    expect(MemprofilerPprof::MethodBlocks.describe("FrameNamesAutoload::NotLoaded", "x", false, fixture, 1)).to be_nil
    expect(mod.autoload?(:NotLoaded)).to eq("/nonexistent/never_loaded.rb")
  end
end
