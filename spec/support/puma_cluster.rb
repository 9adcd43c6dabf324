# frozen_string_literal: true

require "net/http"
require "socket"

# spec/apps/puma_app under puma's cluster mode (2 workers, preload_app!),
# profiled through the Railtie: three phases of 100 requests to /leaky and
# to /clean, a flush interval apart, then a TERM (the workers write their
# last profile at exit). Used by spec/integration/puma_cluster_spec.rb and
# bench/puma_cluster_truth.rb.
module PumaCluster
  APP_DIR = File.expand_path("../apps/puma_app", __dir__)
  EXE = File.expand_path("../../exe/memprofiler_pprof_rs", __dir__)

  # What one worker's profiles say, beside what it kept.
  Worker = Struct.new(:pid, :files, :truth, :leak, :clean, :garbage_shares, :rse, :top_line, :app_top_line,
                      :processes, :missed_share, keyword_init: true)

  module_function

  def free_port
    server = TCPServer.new("127.0.0.1", 0)
    server.addr[1]
  ensure
    server&.close
  end

  # Serves the app with `env` (MEMPROFILER_PPROF_RS_* settings), runs the
  # phases and returns puma's log.
  def serve_three_phases(dir, env)
    port = free_port
    env = env.merge("PORT" => port.to_s, "PUMA_APP_TRUTH_DIR" => dir,
                    "MEMPROFILER_PPROF_RS_FILE_PATTERN" => File.join(dir, "heap-%{pid}-%{index}.pprof"),
                    "MEMPROFILER_PPROF_RS_FLUSH_INTERVAL" => "1")
    log = File.join(dir, "puma.log")
    pid = Process.spawn(env, "puma", "-C", "puma.rb", "config.ru", chdir: APP_DIR, out: log, err: %i[child out])
    begin
      wait_for_workers(pid, log)
      3.times do
        100.times do
          # A connection each, so that both workers take requests.
          %w[/leaky /clean].each do |path|
            code = Net::HTTP.get_response("127.0.0.1", path, port).code
            raise "GET #{path}: #{code}\n#{File.read(log)}" unless code == "200"
          end
        end
        sleep 1.2 # a flush between phases
      end
    ensure
      Process.kill("TERM", pid)
      Process.wait(pid)
    end
    File.read(log)
  end

  def wait_for_workers(pid, log)
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 60
    until File.read(log).scan(/- Worker \d \(PID: \d+\) booted/).size == 2
      raise "puma did not start:\n#{File.read(log)}" if Process.waitpid(pid, Process::WNOHANG)
      raise "puma did not start in 60 s:\n#{File.read(log)}" if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline

      sleep 0.1
    end
  end

  def master_pid(log)
    Integer(log[/Master PID: (\d+)/, 1])
  end

  # {pid => [its profiles, oldest first]}
  def profiles_by_pid(dir)
    Dir[File.join(dir, "heap-*.pprof")].group_by { |f| Integer(f[/heap-(\d+)-/, 1]) }
                                       .transform_values { |files| files.sort_by { |f| Integer(f[/-(\d+)\.pprof\z/, 1]) } }
  end

  # inuse_space of the samples whose stack goes through function `name`.
  def inuse_through(file, name)
    profile = MemprofilerPprof::PprofReader.parse(File.binread(file))
    profile.samples.select { |s| s.frames.any? { |f| f.name == name } }.sum { |s| s.value(profile, "inuse_space") }
  end

  # The share of the allocations in `files` that sampling windows missed
  # (the hook came on too late): their "(missed by sampling windows)" row.
  def missed_share(files)
    missed = total = 0.0
    files.each do |file|
      profile = MemprofilerPprof::PprofReader.parse(File.binread(file))
      profile.samples.each do |sample|
        value = sample.value(profile, "alloc_objects")
        total += value
        missed += value if sample.frames.first&.name == "(missed by sampling windows)"
      end
    end
    total.zero? ? 0.0 : missed / total
  end

  def workers(dir)
    profiles_by_pid(dir).map do |pid, files|
      last = MemprofilerPprof::Profile.read(files.last)
      leak = inuse_through(files.last, "LeakController#leaky")
      shares = files[0...-1].filter_map do |file|
        leaked = inuse_through(file, "LeakController#leaky")
        inuse_through(file, "LeakController#clean").fdiv(leaked) if leaked > 10_000_000
      end
      Worker.new(pid: pid, files: files, truth: Integer(File.read(File.join(dir, "truth-#{pid}"))), leak: leak,
                 clean: inuse_through(files.last, "LeakController#clean"), garbage_shares: shares,
                 rse: last.comments.join[/inuse_space ±([\d.]+)%/, 1].to_f / 100,
                 top_line: last.top(sample_index: "inuse_space", by: :line, limit: 1).lines.last.strip,
                 app_top_line: last.top(sample_index: "inuse_space", by: :line, limit: 1, focus: /config\.ru/)
                                   .lines.last.strip,
                 processes: last.processes, missed_share: missed_share(files))
    end
  end

  # The CLI's diff over every profile: [its output, each process's verdict].
  def diff(dir)
    out, err, status = Open3.capture3(RbConfig.ruby, EXE, "diff", *Dir[File.join(dir, "heap-*.pprof")])
    raise "diff failed: #{err}" unless status.success?

    [out, out.split(/^== /).drop(1).map { |section| section.lines.grep(/^Verdict:/).first.to_s.strip }]
  end
end
