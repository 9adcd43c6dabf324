# frozen_string_literal: true

require "etc"

# Where profiles are written (FileOutput.write, used by ProfileData#write,
# FileFlusher, the wrapper and the CLI's -o) and what the machine around
# the process can do to a write: issue 36's file size limit and planted
# symlinks. The app never dies of the profiler; a refusal names the file.
RSpec.describe MemprofilerPprof::FileOutput do
  root = File.expand_path("..", __dir__)

  around do |example|
    Dir.mktmpdir("file-output-spec") do |dir|
      @dir = dir
      example.run
    end
  end

  def path(name) = File.join(@dir, name)

  def leftovers(directory)
    Dir.exist?(directory) ? Dir.children(directory).grep(/\.tmp\z/) : []
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
end
