# frozen_string_literal: true

require "objspace"

# Profile::Merger: profiles merged one at a time, each let go once added,
# within Profile.memory_limit (the CLI's `merge` reads its files this way).
RSpec.describe MemprofilerPprof::Profile::Merger do
  def profile_bytes(samples, sample_types: [%w[alloc_space bytes], %w[inuse_space bytes]])
    PprofWriter.build(sample_types: sample_types, samples: samples)
  end

  def profile(samples, **types)
    MemprofilerPprof::Profile.parse(profile_bytes(samples, **types))
  end

  def worker_samples(worker)
    [{ stack: [["Shop#checkout", "/app/shop.rb", 10, 1], ["Rack#call", "/app/rack.rb", 3, 1]], values: [100, 10] },
     { stack: [["Worker#job#{worker}", "/app/worker.rb", worker, 1]], values: [7, worker] }]
  end

  def big_name_profile(tag, megabytes)
    profile([{ stack: [["Big##{tag}#{'x' * (megabytes << 20)}", "/app/big.rb", 1, 1]], values: [1, 1] }])
  end

  around do |example|
    limit = MemprofilerPprof::Profile.memory_limit
    begin
      example.run
    ensure
      MemprofilerPprof::Profile.memory_limit = limit
    end
  end

  it "gives what Profile.merge gives, holding one input at a time" do
    merger = described_class.new
    expect(merger << profile(worker_samples(1))).to be(merger)
    merger.add(profile(worker_samples(2))).add(profile(worker_samples(3)))
    expect(merger.size).to eq(3)
    expect(merger.inspect).to eq("#<MemprofilerPprof::Profile::Merger 3 profiles>")
    merged = merger.finish
    expected = MemprofilerPprof::Profile.merge((1..3).map { |w| profile(worker_samples(w)) })
    expect(merged.totals).to eq(expected.totals)
    expect(merged.totals).to eq("alloc_space" => 321, "inuse_space" => 36)
    expect(merged.samples_count).to eq(4)
    expect(merged.comments.first).to eq("memprofiler_pprof_rs merge: 3 profiles")
    expect(merged.top(by: :function, sample_index: "alloc_space")).to include("Shop#checkout")
    expect(MemprofilerPprof::Profile.parse(merged.to_pprof).totals).to eq(merged.totals)
  end

  it "refuses what is not a profile of the same kind, and a second finish, clearly" do
    merger = described_class.new
    expect { merger << "heap.pprof" }.to raise_error(TypeError, 'Merger#add needs a Profile, got "heap.pprof"')
    expect { merger.finish }.to raise_error(ArgumentError, "merge needs at least one profile")
    merger << profile(worker_samples(1))
    cpu = profile([{ stack: [["f", "f.rb", 1, 1]], values: [5] }], sample_types: [%w[cpu nanoseconds]])
    expect { merger << cpu }
      .to raise_error(ArgumentError, %r{\Aprofile 2 has sample types cpu/nanoseconds but profile 1 has alloc_space/bytes})
    expect(merger.size).to eq(1)
    expect(merger.finish.samples_count).to eq(2)
    expect { merger.finish }.to raise_error(RuntimeError, "this merger has finished; start a new one")
    expect { merger << profile(worker_samples(2)) }.to raise_error(RuntimeError, /has finished/)
    expect(merger.inspect).to eq("#<MemprofilerPprof::Profile::Merger finished>")
  end

  it "refuses a profile past the memory limit without adding any of it" do
    GC.start
    merger = described_class.new
    merger << big_name_profile("a", 2)
    kept = big_name_profile("b", 12) # held while it is added
    # Room for half of what merging it takes (its name, twice).
    MemprofilerPprof::Profile.memory_limit = MemprofilerPprof::Profile.memory_held + (12 << 20)
    expect { merger << kept }
      .to raise_error(MemprofilerPprof::ProfileMemoryLimitError, /\Amerging this profile would take about [\d.]+ MB/)
    expect(merger.size).to eq(1)
    # Nothing of it was added: with room, the merger goes on.
    MemprofilerPprof::Profile.memory_limit += 32 << 20
    merger << kept
    expect(merger.size).to eq(2)
    merger << big_name_profile("c", 1)
    merged = merger.finish
    expect(merged.samples_count).to eq(3)
    expect(merged.totals).to eq("alloc_space" => 3, "inuse_space" => 3)
  end

  it "refuses a result it could not read back as soon as it knows, and from then on" do
    unreadable = described_class.new
    GC.start
    MemprofilerPprof::Profile.memory_limit = MemprofilerPprof::Profile.memory_held + (16 << 20)
    error = nil
    %w[d e f g h].each do |tag|
      unreadable << big_name_profile(tag, 2)
    rescue MemprofilerPprof::ProfileMemoryLimitError => e
      error = e
      break
    end
    expect(error.message)
      .to match(/\Athe merged profile would take more than [\d.]+ MB of memory to read back .*; merge fewer profiles\z/)
    size = unreadable.size
    expect { unreadable << big_name_profile("i", 1) }.to raise_error(MemprofilerPprof::ProfileMemoryLimitError, error.message)
    expect { unreadable.finish }.to raise_error(MemprofilerPprof::ProfileMemoryLimitError, error.message)
    expect(unreadable.size).to eq(size)
  end

  it "lets threads share one merger, and is safe under GC.stress", :slow do
    merger = described_class.new
    inputs = (1..40).map { |w| profile(worker_samples(w)) }
    inputs.each_slice(10).map { |slice| Thread.new { slice.each { |p| merger << p } } }.each(&:join)
    expect(merger.size).to eq(40)
    expect(merger.finish.totals).to eq("alloc_space" => 40 * 107, "inuse_space" => 40 * 10 + (1..40).sum)
    # In a fresh process: under GC.stress every allocation collects the
    # whole heap, and this suite's heap (Rails and all) made it 36 s.
    Dir.mktmpdir("merger-stress") do |dir|
      paths = (0...3).map do |w|
        File.join(dir, "w#{w}.pprof").tap { |path| File.binwrite(path, profile_bytes(worker_samples(w))) }
      end
      out, err, status = run_ruby(<<~RUBY, args: paths)
        require "memprofiler_pprof_rs"
        stressed = MemprofilerPprof::Profile::Merger.new
        GC.stress = true
        ARGV.each { |path| stressed << MemprofilerPprof::Profile.parse(File.binread(path)) }
        result = stressed.finish
        GC.stress = false
        p result.totals.sort
      RUBY
      expect(status.exitstatus).to eq(0), err
      expect(out).to eq("#{[['alloc_space', 321], ['inuse_space', 33]].inspect}\n")
    end
  end

  # Found in review: a fork while another thread was adding left the child
  # a lock nobody would release, and its first call hung for good.
  it "never hangs a child forked while another thread adds" do
    big = profile((0...50_000).map { |i| { stack: [["F#f#{i}", "/app/f.rb", i, 1]], values: [1, 1] } })
    merger = described_class.new
    adding = Thread.new { loop { merger << big } }
    sleep 0.05
    reader, writer = IO.pipe
    pid = fork do
      reader.close
      call = Thread.new do
        merger.size
      rescue RuntimeError => e
        e.message
      end
      writer.write(Marshal.dump(call.join(10) ? call.value : :hung))
      writer.close
      exit!(0)
    end
    writer.close
    result = Marshal.load(reader.read) # rubocop:disable Security/MarshalLoad
    Process.wait(pid)
    adding.kill.join
    expect(result).not_to eq(:hung)
    expect(result).to be_a(Integer).or eq("this merger was in use by another thread when the process forked; " \
                                          "start a new one")
    expect(merger.size).to be_positive
  end

  it "refuses a profile naming a sample type twice (its values could not be matched)" do
    twice = profile([{ stack: [["f", "f.rb", 1, 1]], values: [1, 2] }],
                    sample_types: [%w[alloc_space bytes], %w[alloc_space bytes]])
    merger = described_class.new
    expect { merger << twice }.to raise_error(ArgumentError, %r{has sample type alloc_space/bytes twice})
    expect { MemprofilerPprof::Profile.merge([twice]) }.to raise_error(ArgumentError, /twice/)
  end

  it "counts in ObjectSpace.memsize_of and Profile.memory_held, and gives it back" do
    GC.start
    before = MemprofilerPprof::Profile.memory_held
    merger = described_class.new
    merger << big_name_profile("m", 2)
    GC.start
    expect(ObjectSpace.memsize_of(merger)).to be > (4 << 20) # the name, twice
    expect(MemprofilerPprof::Profile.memory_held - before).to be >= ObjectSpace.memsize_of(merger) - 1024
    merger = nil # rubocop:disable Lint/UselessAssignment
    GC.start
    expect(MemprofilerPprof::Profile.memory_held).to eq(before)
  end
end
