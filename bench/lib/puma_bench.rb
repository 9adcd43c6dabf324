# frozen_string_literal: true

require "socket"
require "tmpdir"
require "zlib"
require_relative "report"
require_relative "configs"

# (4) puma serving bench/lib/puma_app.ru on loopback, loaded by wrk; each
# configuration in a fresh puma process. Prints requests/s, p50/p99
# latency and the server's CPU time per request (medians over runs) and
# their ratios to "no profiler".
module PumaBench
  THREADS = 4
  CONNECTIONS = 8
  # wrk's own default (2 s) would drop the slowest configurations' requests
  # from the latencies (stackprof at interval 1 on the Rails-depth app).
  TIMEOUT_SECONDS = 30
  # Each app's path and wrk connections, as bench/run rails and puma use them.
  APPS = { "rails_app.ru" => ["/products?page=3", THREADS],
           "rails_ar_app.ru" => ["/orders?page=3", THREADS],
           "puma_app.ru" => ["/?page=3", CONNECTIONS] }.freeze

  module_function

  # Seconds wrk loads a server in a run (bench/run --seconds).
  def seconds
    Integer(ENV.fetch("BENCH_PUMA_SECONDS", "5"))
  end

  # "run N s; this gem with a FileFlusher writing every S s", for the tables.
  def setup_text
    interval = BenchConfigs.flush_interval
    every = interval == 1 ? "every second" : format("every %g s", interval)
    "#{seconds} s per run; this gem with a FileFlusher writing #{every}"
  end

  def run(runs, configs = BenchConfigs::DEFAULT)
    results = compare(runs, configs, "(4) puma", "puma_app.ru", "/?page=3") or return
    puts
    puts "(4) puma #{puma_version}, #{THREADS} threads, Rack app of bench/lib/puma_app.ru (40 records as JSON " \
         "and HTML per request); wrk, #{CONNECTIONS} connections, #{setup_text}"
    report(results, configs)
  end

  # Each configuration `runs` times, alternating, each in a fresh puma
  # serving `rackup` (in this directory) and loaded by wrk at `path`. Nil,
  # after saying so under `label`, when puma or wrk is not installed.
  def compare(runs, configs, label, rackup, path, connections: CONNECTIONS)
    missing = %w[puma wrk].find { |tool| !system("command -v #{tool} >/dev/null 2>&1") }
    if missing
      puts "\n#{label}: skipped, #{missing} is not installed (script/bootstrap --bench installs it)"
      return nil
    end
    BenchReport.alternate(configs, runs) { |config| measure(config, rackup, path, connections) }
  end

  # Requests/s, p50 and p99 per configuration, and their ratios to "no
  # profiler"; and the server's CPU time per request (every thread of the
  # puma process: the app's, the flusher's, the windows' timer), which a
  # saturated server's capacity follows, and which wrk's share of the two
  # cores moves less than it moves throughput.
  def report(results, configs)
    report_medians(results, configs)
    report_paired(results, configs)
  end

  def report_medians(results, configs)
    base = summarize(results["no profiler"])
    rows = configs.map do |config|
      s = summarize(results[config])
      shares = results[config].filter_map { |r| r[:window_share] }
      [config, format(s[:rps] < 10 ? "%.1f" : "%.0f", s[:rps]), BenchReport.ratio(s[:rps], base[:rps]),
       format("%.2f ms", s[:p50] * 1000), format("%.2f ms", s[:p99] * 1000), BenchReport.ratio(s[:p99], base[:p99]),
       format("%.2f ms", s[:cpu] * 1000), BenchReport.ratio(s[:cpu], base[:cpu]),
       shares.empty? ? "" : format("%.2f", BenchReport.median(shares))]
    end
    BenchReport.table(["configuration", "requests/s", "vs none", "p50", "p99", "p99 vs none", "CPU/request",
                       "CPU vs none", "sampled share"], rows)
    puts "(CPU/request: the puma process's user and system time over the requests wrk completed, " \
         "median over the runs)"
    return unless rows.any? { |row| row.last != "" }

    puts "(sampled share: with sampling windows, the share of allocations made while the hook was on, from the " \
         "profiles' comments; median over the runs of each run's mean over its profiles)"
  end

  # The same runs paired: each run's ratio to the "no profiler" server of
  # its own round, which moved with the machine as it did. With six runs
  # or more, the median ratio and a 95% confidence interval for it: a goal
  # such as "at least 0.97x" holds when the interval's low end is above it.
  def report_paired(results, configs)
    base = results["no profiler"]
    return if base.size < 6

    rows = (configs - ["no profiler"]).map do |config|
      runs = results[config].zip(base)
      [config, paired(runs) { |r, b| r[:rps] / b[:rps] }, paired(runs) { |r, b| r[:cpu] / b[:cpu] },
       paired(runs) { |r, b| r[:thread_cpu] / b[:thread_cpu] }]
    end
    puts
    BenchReport.table(["configuration", "requests/s vs none, paired", "CPU/request vs none, paired",
                       "request threads' CPU/request vs none, paired"], rows)
    puts "(each run's ratio to the server without a profiler in the same round; median of #{base.size} runs " \
         "[a 95% confidence interval for that median])"
  end

  def paired(runs, &ratio)
    ratios = runs.map(&ratio)
    low, high = BenchReport.median_interval(ratios)
    format("%.3fx [%.3f-%.3f]", BenchReport.median(ratios), low, high)
  end

  def summarize(list)
    %i[rps p50 p99 cpu].to_h { |key| [key, BenchReport.median(list.map { |r| r[key] })] }
  end

  def puma_version
    `puma --version 2>/dev/null`[/\d+\.\d+\.\d+/] || "?"
  end

  WARM_UP_SECONDS = 2

  def measure(config, rackup = "puma_app.ru", path = "/?page=3", connections = CONNECTIONS)
    serve(config, rackup) do |base_url, dir, pid|
      # Warm up: inline caches, and the collector's own warm-up (every
      # allocation hooked for its first 250,000: a fraction of the
      # Rails-depth app's first second), so that the run measures a server's
      # steady state.
      wrk(base_url + path, WARM_UP_SECONDS, connections)
      cpu_before = cpu_seconds(pid)
      threads_before = request_thread_seconds(pid)
      result = wrk(base_url + path, seconds, connections)
      requests = result.delete(:requests)
      result[:cpu] = (cpu_seconds(pid) - cpu_before) / requests
      result[:thread_cpu] = (request_thread_seconds(pid) - threads_before) / requests
      share = window_share(dir)
      share ? result.merge(window_share: share) : result
    end
  end

  # With sampling windows: the mean share of allocations sampled over the
  # profiles written so far (their comment says it; see Collector#flush).
  # A mean, not a median: a quiet second can hold few windows.
  def window_share(dir)
    shares = Dir.glob(File.join(dir, "mem-*.pprof")).filter_map do |file|
      Zlib.gunzip(File.binread(file))[/the hook saw ([\d.]+)% of this interval/n, 1]&.to_f&./(100)
    rescue Zlib::Error, SystemCallError
      nil # a file being replaced as we read
    end
    shares.sum / shares.size unless shares.empty?
  end

  # Starts puma on `rackup` with the profiler `config`, yields its URL
  # (http://127.0.0.1:PORT) once it accepts connections, then stops it.
  def serve(config, rackup, cpu: nil)
    Dir.mktmpdir("bench-puma") do |dir|
      port = free_port
      env = { "BENCH_PROFILER" => config, "BENCH_PROFILE_DIR" => dir,
              "RUBYLIB" => [File.join(BenchReport::ROOT, "lib"), ENV["RUBYLIB"]].compact.join(":") }
      app = File.join(__dir__, rackup)
      command = ["puma", "-q", "-e", "production", "-t", "#{THREADS}:#{THREADS}", "-b", "tcp://127.0.0.1:#{port}", app]
      command = ["taskset", "-c", cpu.to_s, *command] if cpu
      pid = Process.spawn(env, *command, out: File::NULL, err: File.join(dir, "puma.log"))
      begin
        wait_for(port, pid, dir)
        yield "http://127.0.0.1:#{port}", dir, pid
      ensure
        Process.kill("TERM", pid)
        Process.wait(pid)
      end
    end
  end

  # wrk on `url` for `seconds`; with `cpu`, one wrk thread on that CPU.
  def wrk(url, seconds, connections = CONNECTIONS, cpu: nil)
    out = IO.popen(wrk_command(url, seconds, connections, cpu: cpu), &:read)
    wrk_result(out, Process.last_status.success?)
  end

  # The wrk command line `wrk` runs (an argument list).
  def wrk_command(url, seconds, connections = CONNECTIONS, cpu: nil)
    pin = cpu ? ["taskset", "-c", cpu.to_s] : []
    [*pin, "wrk", "-t#{cpu ? 1 : 2}", "-c#{connections}", "-d#{seconds}s", "--timeout", "#{TIMEOUT_SECONDS}s",
     "--latency", url]
  end

  # Requests/s, p50 and p99 (s) and requests from wrk's output `out`.
  def wrk_result(out, succeeded)
    raise "wrk failed:\n#{out}" unless succeeded && out =~ %r{Requests/sec:\s+([\d.]+)}

    rps = Regexp.last_match(1).to_f
    requests = out[/(\d+) requests in/, 1].to_i
    raise "wrk completed no request:\n#{out}" unless requests.positive?

    { rps: rps, p50: latency(out, "50%"), p99: latency(out, "99%"), requests: requests }
  end

  CLOCK_TICKS = Integer(`getconf CLK_TCK 2>/dev/null`.strip.then { |t| t.empty? ? "100" : t })

  # User and system time of puma's request threads in process `pid` so far:
  # with Ruby's GVL, a server of one process serves about as fast as they run
  # a request, give or take the other threads that take the GVL (the
  # flusher's profile building) and the time they wait for it. The windows'
  # timer thread runs without it.
  def request_thread_seconds(pid)
    seconds = thread_seconds(pid)
    raise "no puma request thread (\"puma srv tp\") in process #{pid}" unless seconds.key?(:requests)

    seconds[:requests]
  end

  # Thread names (as Linux keeps them: 15 bytes) and what they are. (With a
  # FileFlusher the only memprofiler_pprof_rs Ruby thread is the flusher's.)
  THREAD_KINDS = { "memprofiler-win" => :timer, "memprofiler_ppr" => :flusher, "puma srv tp" => :requests }.freeze

  # User and system time so far of process `pid`'s threads, by kind
  # (THREAD_KINDS; :other for the rest), for the kinds it has.
  def thread_seconds(pid)
    Dir["/proc/#{pid}/task/*"].each_with_object({}) do |task, seconds|
      name = File.read("#{task}/comm").strip
      kind = THREAD_KINDS.find { |prefix, _| name.start_with?(prefix) }&.last || :other
      seconds[kind] = seconds.fetch(kind, 0.0) + cpu_ticks("#{task}/stat").fdiv(CLOCK_TICKS)
    rescue Errno::ENOENT, Errno::ESRCH
      next # a thread that ended as we read
    end
  end

  # User and system time of process `pid` so far (its threads included).
  def cpu_seconds(pid)
    cpu_ticks("/proc/#{pid}/stat").fdiv(CLOCK_TICKS)
  end

  # User and system clock ticks from a /proc stat file (a process's or a
  # thread's).
  def cpu_ticks(stat_path)
    stat = File.read(stat_path)
    # (The name before them, in parentheses, may hold ") " itself.)
    fields = stat[(stat.rindex(")") + 2)..].split
    Integer(fields[11]) + Integer(fields[12])
  end

  def latency(out, percentile)
    match = out.match(/^\s+#{Regexp.escape(percentile)}\s+([\d.]+)(us|ms|s)\b/)
    raise "no #{percentile} latency in wrk output:\n#{out}" unless match

    match[1].to_f * { "us" => 1e-6, "ms" => 1e-3, "s" => 1.0 }.fetch(match[2])
  end

  def free_port
    server = TCPServer.new("127.0.0.1", 0)
    server.addr[1]
  ensure
    server&.close
  end

  def wait_for(port, pid, dir)
    200.times do
      TCPSocket.new("127.0.0.1", port).close
      return
    rescue Errno::ECONNREFUSED
      raise "puma exited:\n#{File.read(File.join(dir, 'puma.log'))}" if Process.waitpid(pid, Process::WNOHANG)

      sleep 0.05
    end
    raise "puma did not start"
  end
end
