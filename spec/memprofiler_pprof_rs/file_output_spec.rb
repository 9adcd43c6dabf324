# frozen_string_literal: true

require "etc"

# Where profiles are written (FileOutput.write, used by ProfileData#write,
# FileFlusher, the wrapper and the CLI's -o) and what the machine around
# the process can do to a write: issue 36's file size limit and planted
# symlinks. The app never dies of the profiler; a refusal names the file.
RSpec.describe MemprofilerPprof::FileOutput do
  root = PROJECT_ROOT

  include_context "in a temporary directory"

  def path(name) = File.join(@dir, name)

  def leftovers(directory)
    Dir.exist?(directory) ? Dir.children(directory).grep(/\.tmp\z/) : []
  end

  # Found in review (issue 36): its callers checked the mode, write did not.
  it "refuses a mode that lets group or others write, or is no mode, whoever calls it" do
    [0o666, 0o620, 0o1777, -1, "600", nil].each do |mode|
      expect { described_class.write(path("m.pprof"), "data", mode: mode) }
        .to raise_error(mode.is_a?(Integer) ? ArgumentError : TypeError, /mode/)
    end
    expect(File.exist?(path("m.pprof"))).to be(false)
    expect(File.stat(described_class.write(path("m.pprof"), "data", mode: 0o640)).mode & 0o777).to eq(0o640)
  end

  describe "a file size limit (RLIMIT_FSIZE, ulimit -f)" do
    limit = 1024
    let(:hard_limit) { Process.getrlimit(:FSIZE)[1] }

    before { skip "no RLIMIT_FSIZE here" unless defined?(Process::RLIMIT_FSIZE) }

    it "makes a profile over it a logged error naming the file and the limit, not a SIGXFSZ death" do
      script = <<~RUBY
        require "memprofiler_pprof_rs"
        require "logger"
        pattern = ARGV.fetch(0)
        collector = MemprofilerPprof::Collector.new(sample_rate: 1.0).tap(&:start!)
        flusher = MemprofilerPprof::FileFlusher.new(collector, pattern: pattern, interval: 3600,
                                                               logger: Logger.new($stdout))
        flusher.start!
        KEPT = Array.new(3_000) { |i| "kept \#{i}" }
        flusher.stop!(flush: true)
        puts "flusher errors=\#{flusher.error_count} written=\#{flusher.written_paths.size}"
        data = collector.flush
        puts "profile bytes=\#{data.pprof_data.bytesize}"
        begin
          data.write(File.join(File.dirname(pattern), "direct.pprof"))
        rescue SystemCallError => e
          puts "direct write raised \#{e.class}: \#{e.message}"
        end
        # Raised (up to the hard limit): the same flusher writes again.
        Process.setrlimit(:FSIZE, Process.getrlimit(:FSIZE)[1])
        puts "then wrote \#{flusher.write(data)}"
      RUBY
      pattern = path("profiles/mem-%{index}.pprof")
      out, err, status = Open3.capture3(RbConfig.ruby, "-I", File.join(root, "lib"), "-e", script, pattern,
                                        rlimit_fsize: [limit, hard_limit])
      expect(status.signaled?).to be(false), "killed by signal #{status.termsig}: #{out}#{err}"
      expect(status.exitstatus).to eq(0), out + err
      expect(out[/profile bytes=(\d+)/, 1].to_i).to be > limit
      expect(out).to include("flusher errors=1 written=0")
      first = path("profiles/mem-0.pprof")
      expect(out).to match(/ERROR .*FileFlusher: handling the flushed profile failed: Errno::EFBIG: /)
      expect(out).to match(/Errno::EFBIG: .*#{Regexp.escape(first)}: \d+ bytes is more than .* of #{limit} bytes/)
      expect(out).to match(/direct write raised Errno::EFBIG: .*direct\.pprof.*limit.* #{limit} bytes/)
      expect(out).to include("then wrote #{first}")
      expect(Dir.children(path("profiles"))).to eq(["mem-0.pprof"])
      expect(leftovers(path("profiles"))).to be_empty
    end

    it "keeps an app run under the wrapper alive: its exit flush is logged, not fatal" do
      app = path("app.rb")
      File.write(app, <<~RUBY)
        KEPT = Array.new(3_000) { |i| "kept \#{i}" }
        puts "app done"
      RUBY
      env = { "MEMPROFILER_PPROF_RS_FILE_PATTERN" => path("profiles/mem-%{pid}-%{index}.pprof"),
              "MEMPROFILER_PPROF_RS_SAMPLE_RATE" => "1", "RUBYOPT" => nil, "RUBYLIB" => nil }
      out, err, status = Open3.capture3(env, File.join(root, "exe", "memprofiler_pprof_rs_profile"),
                                        RbConfig.ruby, app, chdir: @dir, rlimit_fsize: [limit, hard_limit])
      expect(status.signaled?).to be(false), "killed by signal #{status.termsig}: #{err}"
      expect(status.exitstatus).to eq(0), err
      expect(out).to eq("app done\n")
      expect(err).to match(/FileFlusher: .*Errno::EFBIG: .*mem-\d+-0\.pprof.* #{limit} bytes/)
      expect(Dir.glob(path("profiles/*"))).to be_empty
      expect(leftovers(path("profiles"))).to be_empty
    end

    it "makes the CLI's -o over it a one-line error, not a SIGXFSZ death" do
      data = MemprofilerPprof::Collector.new(sample_rate: 1.0).profile { Array.new(3_000) { |i| "kept #{i}" } }
      input = data.write(path("in.pprof"))
      expect(File.size(input)).to be > limit
      _out, err, status = Open3.capture3(RbConfig.ruby, File.join(root, "exe", "memprofiler_pprof_rs"),
                                         "merge", "in.pprof", "-o", "merged.pprof",
                                         chdir: @dir, rlimit_fsize: [limit, hard_limit])
      expect(status.signaled?).to be(false), "killed by signal #{status.termsig}: #{err}"
      expect(status.exitstatus).to eq(1), err
      expect(err.lines.size).to eq(1), err
      expect(err).to match(/merged\.pprof: \d+ bytes is more than .*file size limit .* of #{limit} bytes/)
      expect(Dir.children(@dir)).to eq(["in.pprof"])
    end
  end

  describe "symlinks on the way to the file" do
    let(:data) { MemprofilerPprof::Collector.new(sample_rate: 1.0).profile { Array.new(10) { "x" * 10 } } }
    let(:nobody) { Etc.getpwnam("nobody").uid }

    # /tmp/NAME -> a root-only directory, the symlink owned by nobody (as if
    # nobody had planted it): [the directory, the symlink].
    def plant_symlink(name)
      target = path("root-only")
      Dir.mkdir(target, 0o700)
      planted = path(name)
      File.symlink(target, planted)
      File.lchown(nobody, nil, planted)
      [target, planted]
    end
    let(:logged) { [] }
    let(:logger) do
      lines = logged
      Object.new.tap { |l| l.define_singleton_method(:error) { |text| lines << text } }
    end

    it "refuses a symlink another user owns anywhere in the directory's path, naming it and its owner" do
      skip "needs root to give a symlink to another user" unless Process.euid.zero?

      # /tmp/X -> /root-only/dir, planted by nobody: the target is root's,
      # so the directory's own owner check passes.
      target, planted = plant_symlink("planted")
      refusal = /#{Regexp.escape(planted)} is a symlink owned by uid #{nobody} \(nobody\)/
      expect { data.write(File.join(planted, "heap.pprof")) }.to raise_error(Errno::EACCES, refusal)
      # Deeper: no directory is made in the target first.
      expect { data.write(File.join(planted, "sub/dir/heap.pprof")) }.to raise_error(Errno::EACCES, refusal)
      # Reached through a symlink of this user's: the next hop is checked too.
      File.symlink("planted", path("mine"))
      expect { data.write(path("mine/heap.pprof")) }.to raise_error(Errno::EACCES, refusal)
      # A FileFlusher logs it and writes nothing.
      collector = MemprofilerPprof::Collector.new(sample_rate: 1.0).tap(&:start!)
      flusher = MemprofilerPprof::FileFlusher.new(collector, pattern: File.join(planted, "mem-%{index}.pprof"),
                                                             logger: logger)
      flusher.stop!(flush: true) if flusher.start!
      expect(flusher.error_count).to eq(1)
      expect(logged.join).to match(refusal)
      expect(Dir.children(target)).to be_empty
    ensure
      collector&.stop!
    end

    it "keeps the wrapper, run as root, from writing through a planted directory symlink" do
      skip "needs root to give a symlink to another user" unless Process.euid.zero?

      target, planted = plant_symlink("X")
      env = { "MEMPROFILER_PPROF_RS_FILE_PATTERN" => "#{planted}/mem-%{pid}.pprof", "RUBYOPT" => nil, "RUBYLIB" => nil }
      out, err, status = Open3.capture3(env, File.join(root, "exe", "memprofiler_pprof_rs_profile"),
                                        RbConfig.ruby, "-e", "puts :ran", chdir: @dir)
      expect(status.exitstatus).to eq(0), err
      expect(out).to eq("ran\n")
      expect(err).to match(/FileFlusher: .*Errno::EACCES: .*#{Regexp.escape(planted)} is a symlink owned by uid #{nobody}/)
      expect(Dir.children(target)).to be_empty
    end

    it "never writes through a symlink planted at the temporary file's name" do
      victim = path("victim")
      File.write(victim, "precious")
      # The first temporary name is made predictable and planted.
      planted = path(".mem-0.pprof.#{'01' * 8}.tmp")
      File.symlink(victim, planted)
      calls = 0
      allow(Random).to receive(:urandom).and_wrap_original do |original, size|
        (calls += 1) == 1 ? "\x01".b * size : original.call(size)
      end
      flusher = MemprofilerPprof::FileFlusher.new(MemprofilerPprof::Collector.new, pattern: path("mem-%{index}.pprof"))
      # Another temporary name is used; the profile keeps its own name
      # (a taken temporary name is not a taken profile name).
      expect(flusher.write(data)).to eq(path("mem-0.pprof"))
      expect(calls).to eq(2)
      expect(File.read(victim)).to eq("precious")
      expect(File.readlink(planted)).to eq(victim)
      expect(File.binread(path("mem-0.pprof"))).to eq(data.pprof_data)
      expect(leftovers(@dir)).to eq([File.basename(planted)])
    end

    it "accepts a symlink of this process's user or root's (macOS's /tmp, a deploy's current -> releases/N)" do
      Dir.mkdir(path("releases"))
      Dir.mkdir(path("releases/1"))
      File.symlink("releases/1", path("current"))
      written = data.write(path("current/tmp/profiles/heap.pprof"))
      expect(File.binread(path("releases/1/tmp/profiles/heap.pprof"))).to eq(data.pprof_data)
      expect(written).to eq(path("current/tmp/profiles/heap.pprof"))
      next unless Process.euid.zero?

      # The same for a user who is not root: their own symlink to their own
      # directory, through root's symlink (like /tmp -> private/tmp).
      Dir.mkdir(path("private"))
      Dir.mkdir(path("private/tmp"), 0o1777)
      File.symlink("private/tmp", path("tmp"))
      Dir.mkdir(path("private/tmp/app"))
      File.chown(nobody, nil, path("private/tmp/app"))
      File.symlink("app", path("private/tmp/current"))
      File.lchown(nobody, nil, path("private/tmp/current"))
      allow(Process).to receive(:euid).and_return(nobody)
      expect(data.write(path("tmp/current/heap.pprof"))).to eq(path("tmp/current/heap.pprof"))
      expect(File.binread(path("private/tmp/app/heap.pprof"))).to eq(data.pprof_data)
    end
  end
end
