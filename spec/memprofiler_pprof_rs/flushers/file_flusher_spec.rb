# frozen_string_literal: true

require "fileutils"
require "pathname"

# Two phases of work whose allocations must land in different files.
module FlushPhases
  class First
    def run
      Array.new(500) { |i| "first #{i}" }
    end
  end

  class Second
    def run
      Array.new(500) { |i| "second #{i}" }
    end
  end
end

RSpec.describe MemprofilerPprof::FileFlusher do
  include FlusherSpecHelpers

  let(:collector) { MemprofilerPprof::Collector.new(sample_rate: 1.0, max_allocation_samples: 1_000_000) }

  around do |example|
    Dir.mktmpdir("file-flusher-spec") do |dir|
      @dir = dir
      example.run
    ensure
      @flusher&.stop!
      collector.stop!
    end
  end

  # The block's value and how many objects it allocated (GC.stat).
  def allocations_of
    before = GC.stat(:total_allocated_objects)
    value = yield
    [value, GC.stat(:total_allocated_objects) - before]
  end

  def profiles_in(paths)
    paths.map { |path| parse_profile(File.binread(path)) }
  end

  it "writes each flush to its own file, holding only that interval's allocations" do
    @flusher = described_class.new(collector, pattern: "#{@dir}/mem-%{pid}-%{index}.pprof", interval: 0.5)
    collector.start!
    @flusher.start!
    first, first_truth = allocations_of { FlushPhases::First.new.run }
    GC.start # in use from now on (see Collector::INUSE_AS_OF)
    eventually { @flusher.flush_count >= 1 }
    second, second_truth = allocations_of { FlushPhases::Second.new.run }
    @flusher.stop!(flush: true)

    paths = @flusher.written_paths
    expect(paths).to eq(["#{@dir}/mem-#{Process.pid}-0.pprof", "#{@dir}/mem-#{Process.pid}-1.pprof"])
    expect(Dir.children(@dir).sort).to eq(%W[mem-#{Process.pid}-0.pprof mem-#{Process.pid}-1.pprof])
    one, two = profiles_in(paths)
    # (GC.stat also counts the call site's first-call cache objects, which
    # are allocated outside #run: a few.)
    expect(first_truth).to be > 500
    expect(total_through(one, "FlushPhases::First#run", "alloc_objects")).to be_within(10).of(first_truth)
    expect(total_through(one, "FlushPhases::Second#run", "alloc_objects")).to eq(0)
    expect(total_through(two, "FlushPhases::Second#run", "alloc_objects")).to be_within(10).of(second_truth)
    expect(total_through(two, "FlushPhases::First#run", "alloc_objects")).to eq(0)
    # What is still alive shows in every file.
    expect(total_through(two, "FlushPhases::First#run", "inuse_objects")).to be >= 500
    expect([first.size, second.size]).to eq([500, 500])
  end

  it "fills in every pattern key and creates missing directories" do
    pattern = "#{@dir}/a/%{pid}/b-%{unixtime}-%{isotime}-%<index>03d.pprof"
    @flusher = described_class.new(collector, pattern: pattern, interval: 30)
    before = Time.now.to_i
    @flusher.run(flush: true) { nil }
    @flusher.run(flush: true) { nil }
    paths = @flusher.written_paths
    expect(paths.size).to eq(2)
    expect(paths[0]).to match(%r{\A#{@dir}/a/#{Process.pid}/b-(\d+)-\d{8}T\d{6}\.\d{3}Z-000\.pprof\z})
    expect(paths[1]).to end_with("-001.pprof")
    expect(paths[0][/b-(\d+)-/, 1].to_i).to be_between(before, Time.now.to_i)
    expect(@flusher.last_path).to eq(paths[1])
    profiles_in(paths) # both readable by go tool pprof
  end

  it "never overwrites: a name already taken gets a numbered suffix" do
    @flusher = described_class.new(collector, pattern: "#{@dir}/latest.pprof", interval: 30)
    3.times { @flusher.run(flush: true) { nil } }
    expect(Dir.children(@dir).sort).to eq(%w[latest-1.pprof latest-2.pprof latest.pprof])
  end

  it "never overwrites another process's file of the same name" do
    code = <<~RUBY
      require "memprofiler_pprof_rs"
      collector = MemprofilerPprof::Collector.new
      flusher = MemprofilerPprof::FileFlusher.new(collector, pattern: ARGV[0] + "/same-%{index}.pprof", interval: 30)
      pids = Array.new(4) do
        fork do
          100.times { flusher.run(flush: true) { nil } }
          exit!(flusher.error_count.zero? ? 0 : 1)
        end
      end
      statuses = pids.map { |pid| Process.wait2(pid).last.exitstatus }
      puts statuses.inspect
    RUBY
    out, err, status = run_ruby(code, args: [@dir])
    expect(status).to be_success, err
    expect(out.strip).to eq("[0, 0, 0, 0]")
    expect(Dir.children(@dir).grep(/\.pprof\z/).size).to eq(400)
    expect(Dir.children(@dir).grep(/\.tmp\z/)).to be_empty
  end

  it "puts a collision suffix before a profile extension, or at the end" do
    @flusher = described_class.new(collector, pattern: "#{@dir}/p-%{isotime}", interval: 30)
    allow(@flusher).to receive(:path_for).and_return("#{@dir}/p-20260101T000000.123Z")
    2.times { @flusher.run(flush: true) { nil } }
    expect(Dir.children(@dir).sort).to eq(%w[p-20260101T000000.123Z p-20260101T000000.123Z-1])
  end

  it "with keep: n deletes its oldest files beyond n, and nobody else's" do
    File.write("#{@dir}/someone-else.pprof", "x")
    @flusher = described_class.new(collector, pattern: "#{@dir}/mem-%{index}.pprof", interval: 30, keep: 2)
    4.times { @flusher.run(flush: true) { nil } }
    expect(Dir.children(@dir).sort).to eq(%w[mem-2.pprof mem-3.pprof someone-else.pprof])
    expect(@flusher.written_paths).to eq(["#{@dir}/mem-2.pprof", "#{@dir}/mem-3.pprof"])
  end

  it "resolves a relative pattern when built, so a later chdir does not move the files" do
    Dir.chdir(@dir) do
      @flusher = described_class.new(collector, pattern: "profiles/mem.pprof", interval: 30)
    end
    expect(@flusher.pattern).to eq(File.join(File.realpath(@dir), "profiles/mem.pprof"))
    Dir.chdir("/") { @flusher.run(flush: true) { nil } }
    expect(File.exist?(File.join(@dir, "profiles/mem.pprof"))).to be(true)
  end

  it "keeps a literal % in the working directory's name" do
    odd = File.join(@dir, "100%{pid}")
    FileUtils.mkdir_p(odd)
    Dir.chdir(odd) { @flusher = described_class.new(collector, pattern: "mem-%{index}.pprof", interval: 30) }
    @flusher.run(flush: true) { nil }
    expect(Dir.children(odd)).to eq(["mem-0.pprof"])
  end

  it "rejects bad patterns and options at construction" do
    expect { described_class.new(collector, pattern: "#{@dir}/%{host}.pprof") }
      .to raise_error(ArgumentError, /unknown key %\{host\} in pattern .*known keys: %\{pid\}, %\{isotime\}/)
    expect { described_class.new(collector, pattern: "mem-%d.pprof") }
      .to raise_error(ArgumentError, /bad pattern "mem-%d.pprof"/)
    expect { described_class.new(collector, pattern: "mem-%{pid") }.to raise_error(ArgumentError, /bad pattern/)
    expect { described_class.new(collector, pattern: "mem-%s.pprof") }
      .to raise_error(ArgumentError, /"%s" is not a named key/)
    expect(described_class.new(collector, pattern: "#{@dir}/100%%-%<index>04d.pprof").path_for(index: 7))
      .to eq("#{@dir}/100%-0007.pprof")
    expect { described_class.new(collector, pattern: 42) }
      .to raise_error(TypeError, /pattern must be a String or Pathname, got 42/)
    expect { described_class.new(collector, pattern: "dir/") }.to raise_error(ArgumentError, /must name a file/)
    expect { described_class.new(collector, keep: 0) }.to raise_error(ArgumentError, /keep.*0/)
    expect { described_class.new(collector, interval: "1") }.to raise_error(TypeError, /interval/)
    expect(described_class.new(collector, pattern: Pathname.new("#{@dir}/p.pprof")).pattern).to eq("#{@dir}/p.pprof")
  end

  # Issue 36, item 9: MEMPROFILER_PPROF_RS_FILE_MODE=777 wrote profiles
  # anybody could replace.
  it "refuses a mode that lets group or others write, naming it, and keeps the others" do
    [0o777, 0o666, 0o660, 0o620, 0o602, 0o622].each do |mode|
      shown = format("0o%o", mode)
      expect { described_class.new(collector, pattern: "#{@dir}/m.pprof", mode: mode) }
        .to raise_error(ArgumentError, "mode must not let group or others write the file " \
                                       "(e.g. 0o600, 0o640 or 0o644), got #{shown}")
      data = collector.profile { Array.new(3) { |i| "x#{i}" } }
      expect { data.write("#{@dir}/w.pprof", mode: mode) }.to raise_error(ArgumentError, /got #{shown}\z/)
      expect(File.exist?("#{@dir}/w.pprof")).to be(false)
    end
    [0o600, 0o640, 0o644, 0o604, 0o400, 0o700].each do |mode|
      flusher = described_class.new(collector, pattern: "#{@dir}/ok-#{mode.to_s(8)}.pprof", mode: mode)
      expect(File.stat(flusher.write(collector.flush)).mode & 0o777).to eq(mode)
    end
  end

  it "logs a write that fails and keeps going" do
    blocker = File.join(@dir, "not-a-dir")
    File.write(blocker, "")
    logger = ListLogger.new
    @flusher = described_class.new(collector, pattern: "#{blocker}/mem.pprof", interval: 30, logger: logger)
    @flusher.run(flush: true) { nil }
    expect(logger.errors.pop).to match(/FileFlusher: handling the flushed profile failed: Errno::EEXIST|Errno::ENOTDIR/)
  end
end
