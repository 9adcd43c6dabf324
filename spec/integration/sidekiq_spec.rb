# frozen_string_literal: true

require "socket"
require "tmpdir"

# SidekiqLabels in a real Sidekiq process (Debian's Sidekiq 6.4, with a
# Redis server of the spec's own on a free port), profiled by the wrapper:
# the profiles it writes every second name the leaking job by label.
# Host only, as for Rails (MEMPROFILER_SKIP_FRAMEWORKS=1 in the Debian roots).
RSpec.describe MemprofilerPprof::SidekiqLabels, :slow do
  before do
    skip "Sidekiq is not installed in this root (MEMPROFILER_SKIP_FRAMEWORKS=1)" if ENV["MEMPROFILER_SKIP_FRAMEWORKS"]
  end

  def free_port
    server = TCPServer.new("127.0.0.1", 0)
    server.addr[1]
  ensure
    server&.close
  end

  def wait_for(what, seconds)
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + seconds
    until (found = yield)
      raise "#{what} within #{seconds} s" if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline

      sleep 0.1
    end
    found
  end

  def stop(pid)
    Process.kill("TERM", pid)
    Process.wait(pid)
  rescue Errno::ESRCH, Errno::ECHILD
    nil
  end

  it "labels each job with its class and queue" do
    seen = []
    described_class.new.call(nil, { "class" => "ActiveJob::QueueAdapters::SidekiqAdapter::JobWrapper",
                                    "wrapped" => "ImportJob" }, "imports") { seen << MemprofilerPprof.labels }
    described_class.new.call(nil, { "class" => "SendMailJob" }, "default") { seen << MemprofilerPprof.labels }
    expect(seen).to eq([{ "job" => "ImportJob", "queue" => "imports" }, { "job" => "SendMailJob", "queue" => "default" }])
    expect(MemprofilerPprof.labels).to eq({})
  end

  it "names the leaking job in inuse_space in a real Sidekiq process's profiles" do
    Dir.mktmpdir("sidekiq") do |dir|
      port = free_port
      redis = Process.spawn("redis-server", "--port", port.to_s, "--bind", "127.0.0.1", "--save", "",
                            "--appendonly", "no", out: File::NULL, err: File::NULL)
      sidekiq = nil
      begin
        wait_for("Redis answers", 20) do
          TCPSocket.new("127.0.0.1", port).close || true
        rescue StandardError
          false
        end
        url = "redis://127.0.0.1:#{port}/0"
        env = { "REDIS_URL" => url, "MEMPROFILER_PPROF_RS_FILE_PATTERN" => File.join(dir, "heap-%{index}.pprof"),
                "MEMPROFILER_PPROF_RS_FLUSH_INTERVAL" => "1", "MEMPROFILER_PPROF_RS_SAMPLE_RATE" => "0.2",
                "MEMPROFILER_PPROF_RS_SEED" => "5" }
        wrapper = File.join(PROJECT_ROOT, "exe/memprofiler_pprof_rs_profile")
        log = File.join(dir, "sidekiq.log")
        jobs_file = File.join(SPEC_ROOT, "apps/sidekiq_app/jobs.rb")
        sidekiq = Process.spawn(env, RbConfig.ruby, wrapper, "sidekiq", "-r", jobs_file,
                                "-q", "imports", "-q", "default", "-c", "2", "-t", "2",
                                chdir: dir, out: log, err: [:child, :out])
        _out, err, status = run_ruby(<<~RUBY, env: { "REDIS_URL" => url })
          require "sidekiq"
          require "sidekiq/api"
          Redis.silence_deprecations = true
          3.times do |round|
            120.times do |i|
              id = round * 120 + i
              Sidekiq::Client.push("class" => "ImportRowsJob", "queue" => "imports", "args" => [id])
              Sidekiq::Client.push("class" => "SendMailJob", "queue" => "default", "args" => [id])
            end
            sleep 1.2
          end
          sleep 0.1 until Sidekiq::Queue.new("imports").size.zero? && Sidekiq::Queue.new("default").size.zero? &&
                          Sidekiq::Workers.new.size.zero?
        RUBY
        expect(status).to be_success, err
        wait_for("4 profiles", 30) do
          found = Dir[File.join(dir, "heap-*.pprof")].sort_by { |f| f[/(\d+)\.pprof\z/, 1].to_i }
          found.size >= 4 && found
        end
        sleep 1.5 # one more, after the last job
        files = Dir[File.join(dir, "heap-*.pprof")].sort_by { |f| f[/(\d+)\.pprof\z/, 1].to_i }
        profile = parse_profile(File.binread(files.last))
        jobs = sums_by_label(profile, "job", "inuse_space")
        expect(jobs["ImportRowsJob"]).to be > 100_000
        # SendMailJob's garbage counts until a GC frees it (in-use is as of
        # the flush), so it is not 0; it does not grow, though.
        expect(jobs["ImportRowsJob"]).to be > 2 * jobs.fetch("SendMailJob", 0)
        exe = File.join(PROJECT_ROOT, "exe/memprofiler_pprof_rs")
        out, err, status = Open3.capture3(RbConfig.ruby, "-I", File.join(PROJECT_ROOT, "lib"), exe,
                                          "diff", *files, "--by", "job")
        expect(status).to be_success, err
        expect(out).to match(/^By job: ImportRowsJob grew/), out
        puts out.lines.grep(/^(By job|Verdict)/)
        expect(sums_by_label(profile, "queue", "inuse_space")["imports"]).to eq(jobs["ImportRowsJob"])
        allocated = files.map { |f| sums_by_label(parse_profile(File.binread(f)), "job", "alloc_objects") }
        expect(allocated.sum { |sums| sums["SendMailJob"] }).to be > 1_000
      ensure
        stop(sidekiq) if sidekiq
        stop(redis)
      end
    end
  end
end
