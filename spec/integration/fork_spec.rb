# frozen_string_literal: true

# Each scenario runs in a fresh Ruby process: forking the RSpec process
# itself would run RSpec's at_exit hooks in the children.
RSpec.describe "fork with a running FileFlusher" do
  # The scenario's common part: a collector and a FileFlusher writing to
  # DIR/mem-<pid>-<index>.pprof every 0.1 s, and work classes whose names
  # show up in the profiles.
  def scenario(dir, body)
    <<~RUBY
      require "memprofiler_pprof_rs"
      class ParentWork; def run; Array.new(2_000) { |i| "parent \#{i}" }; end; end
      class ChildWork; def run; Array.new(2_000) { |i| "child \#{i}" }; end; end
      def wait_for_files(flusher, count)
        200.times { break if flusher.written_paths.size >= count; sleep 0.02 }
      end
      collector = MemprofilerPprof::Collector.new(sample_rate: 1.0, max_allocation_samples: 1_000_000)
      collector.start!
      flusher = MemprofilerPprof::FileFlusher.new(collector, pattern: "#{dir}/mem-%{pid}-%{index}.pprof",
                                                  interval: 0.1)
      flusher.start!
      #{body}
    RUBY
  end

  def files_by_pid(dir)
    Dir["#{dir}/*.pprof"].group_by { |path| File.basename(path)[/mem-(\d+)-/, 1].to_i }
  end

  def allocated(paths, method_name)
    paths.sum { |path| total_through(parse_profile(File.binread(path)), method_name, "alloc_objects") }
  end

  include_context "in a temporary directory"

  it "lets parent and child each write their own files, with their own allocations" do
    body = <<~RUBY
      parent_kept = ParentWork.new.run
      reader, writer = IO.pipe
      pid = fork do
        child_kept = ChildWork.new.run
        wait_for_files(flusher, 2)
        flusher.stop!(flush: true)
        writer.puts(flusher.written_paths.size)
        exit!(0)
      end
      writer.close
      child_files = reader.read.to_i
      Process.wait(pid)
      wait_for_files(flusher, 2)
      flusher.stop!(flush: true)
      puts [pid, $?.exitstatus, child_files, flusher.written_paths.size, Thread.list.size].join(" ")
    RUBY
    out, err, status = run_ruby(scenario(@dir, body))
    expect(status).to be_success, err
    child_pid, child_status, child_files, parent_files, threads = out.split.map(&:to_i)
    expect(child_status).to eq(0)
    expect(child_files).to be >= 3 # timed flushes in the child, then the final one
    expect(parent_files).to be >= 3
    expect(threads).to eq(1) # the parent's flusher thread ended with stop!

    files = files_by_pid(@dir)
    expect(files.keys).to contain_exactly(child_pid, a_value > 0)
    parent_paths = files.reject { |pid, _| pid == child_pid }.values.first
    child_paths = files[child_pid]
    expect(child_paths.size).to eq(child_files)
    expect(allocated(child_paths, "ChildWork#run")).to be >= 2_000
    # The parent's samples from before the fork stay in the parent's profile.
    expect(allocated(child_paths, "ParentWork#run")).to eq(0)
    expect(allocated(parent_paths, "ParentWork#run")).to be >= 2_000
    expect(allocated(parent_paths, "ChildWork#run")).to eq(0)
  end

  {
    "Kernel#fork with a block" => "fork { child_body.call }",
    "Process.fork with a block" => "Process.fork { child_body.call }",
    "fork without a block" => "fork || (child_body.call; exit!(0))",
    "Process.daemon in a child" => "fork { Process.daemon(true, true); child_body.call }"
  }.each do |name, fork_call|
    it "restarts the flusher thread in the child after #{name}" do
      body = <<~RUBY
        parent_thread = Thread.list.find { |t| t.name == "memprofiler_pprof_rs FileFlusher" }
        report = "#{@dir}/report"
        child_body = lambda do
          ChildWork.new.run
          wait_for_files(flusher, 2)
          File.write(report + ".tmp", [Process.pid, flusher.written_paths.size, flusher.running?].join(" "))
          File.rename(report + ".tmp", report)
          exit!(0)
        end
        pid = #{fork_call}
        Process.wait(pid)
        500.times { break if File.exist?(report); sleep 0.01 }
        same_thread = Thread.list.find { |t| t.name == "memprofiler_pprof_rs FileFlusher" }.equal?(parent_thread)
        flusher.stop!
        puts [File.read(report), same_thread].join(" ")
      RUBY
      out, err, status = run_ruby(scenario(@dir, body))
      expect(status).to be_success, err
      child_pid, child_files, running, same_thread = out.split
      expect(child_files.to_i).to be >= 2
      expect(running).to eq("true")
      expect(same_thread).to eq("true") # the parent's flusher was not touched
      child_paths = files_by_pid(@dir)[child_pid.to_i]
      expect(child_paths.size).to be >= 2
      expect(allocated(child_paths, "ChildWork#run")).to be >= 2_000
    end
  end

  it "leaves a flusher stopped in the parent stopped in the child" do
    body = <<~RUBY
      flusher.stop!
      reader, writer = IO.pipe
      pid = fork { writer.puts(flusher.running?); exit!(0) }
      writer.close
      puts reader.read
      Process.wait(pid)
    RUBY
    out, err, status = run_ruby(scenario(@dir, body))
    expect(status).to be_success, err
    expect(out.strip).to eq("false")
  end
end

RSpec.describe MemprofilerPprof::Collector, "in a child forked while another thread flushes" do
  it "flushes normally in the child, even when the collector was not active at the fork" do
    code = <<~RUBY
      require "memprofiler_pprof_rs"
      collector = MemprofilerPprof::Collector.new(sample_rate: 1.0, max_heap_samples: 0)
      collector.profile { Array.new(1000) { Object.new } }
      started = false
      flusher = Thread.new { started = true; loop { collector.flush } }
      Thread.pass until started
      results = Array.new(5) do
        Thread.pass
        reader, writer = IO.pipe
        pid = fork do
          collector.start!
          Array.new(10) { Object.new }
          writer.puts(collector.flush.allocation_samples_count)
        rescue => e
          writer.puts(e.message)
        ensure
          exit!(0)
        end
        writer.close
        Process.wait(pid)
        reader.read.strip
      end
      flusher.kill
      puts results.join(",")
    RUBY
    out, err, status = run_ruby(code)
    expect(status).to be_success, err
    counts = out.strip.split(",")
    expect(counts.size).to eq(5)
    expect(counts).to all(match(/\A\d+\z/))
    expect(counts.map(&:to_i)).to all(be >= 10)
  end
end
