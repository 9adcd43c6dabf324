# frozen_string_literal: true

# Each profile names the process it came from (a comment, so it survives
# renaming the file), and the CLI never silently mixes processes: a
# preforking server's master and workers write into one directory.
module ProcessIdentitySpec
  LEAK = [] # rubocop:disable Style/MutableConstant (the leak)
  def self.leak(count) = count.times { |i| LEAK << ("leak #{i}" * 20) }
end

RSpec.describe "The process a profile came from" do
  include_context "in a temporary directory"

  def cli(*args)
    exe = File.join(PROJECT_ROOT, "exe/memprofiler_pprof_rs")
    out, err, status = Open3.capture3(RbConfig.ruby, exe, *args, chdir: @dir)
    [out, err, status.exitstatus]
  end

  # Three profiles of a leaking parent, then three of its forked child,
  # written as heap-PID-N.pprof; returns [parent pid, child pid].
  def write_parent_and_child_profiles
    collector = MemprofilerPprof::Collector.new(sample_rate: 0.2, seed: 3)
    collector.start!
    leak_and_flush = lambda do
      3.times do |i|
        ProcessIdentitySpec.leak(3_000)
        GC.start
        collector.flush.write(File.join(@dir, "heap-#{Process.pid}-#{i}.pprof"))
      end
    end
    pid = fork do
      leak_and_flush.call
      exit!(0)
    end
    Process.wait(pid)
    leak_and_flush.call
    collector.stop!
    [Process.pid, pid]
  ensure
    ProcessIdentitySpec::LEAK.clear
  end

  it "is named by each flushed profile, and by a forked child's as that child" do
    parent, child = write_parent_and_child_profiles
    started = Time.now
    processes = Dir[File.join(@dir, "*.pprof")].sort.map { |file| MemprofilerPprof::Profile.read(file).processes }
    expect(processes.map(&:size)).to all(eq(1))
    by_pid = processes.flatten.group_by(&:pid)
    expect(by_pid.keys).to contain_exactly(parent, child)
    expect(by_pid[parent].uniq.size).to eq(1)
    expect(by_pid[child].uniq.size).to eq(1)
    parent_info = by_pid[parent].first
    child_info = by_pid[child].first
    expect(parent_info.forked_from).to be_nil
    expect(child_info.forked_from).to eq(parent)
    expect(child_info.program).to eq($PROGRAM_NAME)
    expect(child_info.started_at).to be > parent_info.started_at
    expect(child_info.started_at).to be_within(120).of(started)
    expect(child_info.to_s).to eq("pid #{child} (#{$PROGRAM_NAME}), forked from pid #{parent}")
    comment = MemprofilerPprof::Profile.read(File.join(@dir, "heap-#{child}-0.pprof")).comments.grep(/\Aprocess:/).first
    expect(comment).to start_with("process: pid #{child} (forked from pid #{parent}), started at unix time ")
  end

  it "makes diff give each process its own verdict, unless --across-processes" do
    parent, child = write_parent_and_child_profiles
    out, err, status = cli("diff", *Dir.children(@dir).sort)
    expect([err, status]).to eq(["", 0])
    expect(out.lines.first).to eq("These 6 profiles come from 2 processes: each process's profiles are compared " \
                                  "with each other (--across-processes compares them as one series).\n")
    expect(out).to include("== pid #{parent} (#{$PROGRAM_NAME}): 3 profiles ==")
    expect(out).to include("== pid #{child} (#{$PROGRAM_NAME}), forked from pid #{parent}: 3 profiles ==")
    verdicts = out.lines.grep(/^Verdict:/)
    expect(verdicts.size).to eq(2)
    expect(verdicts).to all(include("likely leak:", "ProcessIdentitySpec.leak"))

    out, err, status = cli("diff", "--across-processes", *Dir.children(@dir).sort)
    expect([err, status]).to eq(["", 0])
    expect(out).not_to include("processes")
    expect(out.lines.grep(/^Verdict:/).size).to eq(1)
  end

  it "makes diff say when a process has one profile, and top and flamegraph say a profile merges processes" do
    parent, child = write_parent_and_child_profiles
    out, err, status = cli("diff", "heap-#{parent}-2.pprof", "heap-#{child}-1.pprof", "heap-#{child}-2.pprof")
    expect([err, status]).to eq(["", 0])
    expect(out).to include("== pid #{parent} (#{$PROGRAM_NAME}): one profile (heap-#{parent}-2.pprof), " \
                           "nothing to compare it with ==")
    expect(out.lines.grep(/^Verdict:/).size).to eq(1)

    # One profile of each process: compared as one series, and said.
    out, err, status = cli("diff", "heap-#{parent}-2.pprof", "heap-#{child}-2.pprof")
    expect([err, status]).to eq(["", 0])
    expect(out.lines.first).to eq("Note: these 2 profiles come from 2 processes, one each: compared as one series.\n")
    expect(out.lines.grep(/^Verdict:/).size).to eq(1)

    _out, err, status = cli("merge", "heap-#{parent}-2.pprof", "heap-#{child}-2.pprof", "-o", "both.pprof")
    expect(status).to eq(0), err
    expect(MemprofilerPprof::Profile.read(File.join(@dir, "both.pprof")).processes.map(&:pid)).to eq([parent, child])
    note = "note: this profile merges 2 processes' profiles (pid #{parent}, pid #{child}): its values are their sums\n"
    out, err, status = cli("top", "both.pprof")
    expect([err, status]).to eq(["", 0])
    expect(out.lines.first).to eq(note)
    _out, err, status = cli("flamegraph", "both.pprof", "-o", "both.html")
    expect(status).to eq(0)
    expect(err.lines.first).to eq(note)
    out, _err, status = cli("top", "heap-#{child}-2.pprof")
    expect(status).to eq(0)
    expect(out).not_to include("note:")
  end
end
