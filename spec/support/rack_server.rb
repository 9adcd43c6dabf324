# frozen_string_literal: true

# A rackup file served by a real server in its own process
# (spec/fixtures/serve_rack.rb: WEBrick, which says why not puma).
module RackServer
  SERVE = File.expand_path("../fixtures/serve_rack.rb", __dir__)

  # Serves `config` (a path) from `dir` with `env`, yields its port once it
  # listens (within `timeout` seconds), and stops it after the block.
  def serve_rackup(config, dir:, env: {}, timeout: 30)
    log = File.join(dir, "server.log")
    pid = Process.spawn(env, RbConfig.ruby, SERVE, config, chdir: dir, out: log, err: [:child, :out])
    begin
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + timeout
      until (port = File.read(log)[%r{Listening on http://127\.0\.0\.1:(\d+)}, 1])
        raise "the server did not start:\n#{File.read(log)}" if Process.waitpid(pid, Process::WNOHANG)
        if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
          raise "the server did not start in #{timeout} s:\n#{File.read(log)}"
        end

        sleep 0.05
      end
      yield Integer(port)
    ensure
      begin
        Process.kill("TERM", pid)
        Process.wait(pid)
      rescue Errno::ESRCH, Errno::ECHILD
        nil
      end
    end
  end
end
