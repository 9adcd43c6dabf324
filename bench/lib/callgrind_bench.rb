# frozen_string_literal: true

require "json"
require "open3"
require "rbconfig"
require_relative "report"
require_relative "configs"

# (8) Instructions instead of seconds: each configuration runs a loop
# workload once under `valgrind --tool=callgrind`, which counts every
# instruction the process executes. The counts do not depend on what else
# the machine runs, so differences of a few percent, lost in wall-clock
# noise on a shared machine, show, and one run per configuration is enough.
# The counts are of the whole process (Ruby's start, the warm-up, the
# profiler's start and stop without reading out its results): the
# difference to "no profiler" is the profiler's.
module CallgrindBench
  TARGETS = %w[alloc deep rails rails-ar require].freeze
  # Iterations of each loop workload: callgrind runs Ruby ~50x slower, and
  # one run should stay under ~3 minutes (stackprof at interval 1, the
  # slowest, takes ~1 minute at these sizes).
  ITERATIONS = { "alloc" => 100_000, "deep" => 100_000 }.freeze
  # Requests of the Rails-depth app (rails_requests.rb): ~3 s each under
  # valgrind, after ~25 s of loading ActionPack.
  RAILS_REQUESTS = 40
  # crates/sampler/src/windows/mod.rs
  MAX_IN_WINDOW_RATE = 0.1
  LIB = File.join(BenchReport::ROOT, "lib")
  # The caches valgrind simulates with --cache-sim: a core's own, 32 KB of
  # first level for code and for data and 1 MB of second, as on AMD's Zen 4
  # (valgrind's two levels; left to itself here it takes the virtual
  # machine's reported third level, 320 MB direct-mapped, in which nearly
  # nothing misses).
  CACHES = %w[--cache-sim=yes --I1=32768,8,64 --D1=32768,8,64 --LL=1048576,8,64].freeze
  # What loading a profiler costs a process that never starts it.
  REQUIRES = {
    "ruby -e 0" => ["-e", "0"],
    "ruby -Ilib -e 'require \"memprofiler_pprof_rs\"'" => ["-I", LIB, "-e", 'require "memprofiler_pprof_rs"'],
    "ruby -e 'require \"stackprof\"'" => ["-e", 'require "stackprof"']
  }.freeze

  class << self
    # Also simulate the caches (CACHES; bench/run callgrind --cache-sim): the
    # Rails tables then give each configuration's first- and second-level
    # misses a request over no profiler's, what instruction counts leave out
    # (a profiler's code and data evict the app's).
    attr_accessor :cache_sim
  end

  module_function

  # `iterations`: { workload => count } replacing ITERATIONS (bench/run
  # --iterations): windows need a run long enough for many of them.
  # `at_full_speed`: for the Rails apps, also the windows the defaults
  # choose without valgrind (full_speed_windows.rb), fixed by allocation
  # counts.
  def run(targets, configs, iterations = {}, at_full_speed: false)
    unless system("command -v valgrind >/dev/null 2>&1")
      puts "\n(8) callgrind: skipped, valgrind is not installed (script/bootstrap --bench installs it)"
      return
    end
    targets.each do |target|
      case target
      when "require" then requires
      when "rails", "rails-ar"
        next unless app_installed?(target)

        configs_here = at_full_speed ? configs | full_speed_configs(target) : configs
        rails(configs_here, iterations.fetch(target, RAILS_REQUESTS), target)
      else loop_workload(target, configs, iterations.fetch(target, ITERATIONS[target]))
      end
      $stdout.flush
    end
  end

  def loop_workload(name, configs, iterations)
    worker = File.join(__dir__, "worker.rb")
    results = BenchReport.alternate(configs, 1) do |config|
      instructions, out = callgrind("-I", LIB, worker, name, config, iterations.to_s)
      result = JSON.parse(out.lines.last, symbolize_names: true)
      { instructions: instructions, allocated: result[:allocated], coverage: result[:window_coverage] }
    end
    base = results["no profiler"].first
    puts
    puts "(8) callgrind, #{name} workload at #{delimit(iterations)} iterations (#{delimit(base[:allocated])} " \
         "allocations): instructions of the whole process, one run each; \"per allocation\": the " \
         "instructions over \"no profiler\" divided by its allocations"
    rows = configs.map do |config|
      count = results[config].first[:instructions]
      over = count - base[:instructions]
      [config, millions(count), BenchReport.ratio(count.to_f, base[:instructions]),
       config == "no profiler" ? "" : format("%+.1f M", over / 1e6),
       config == "no profiler" ? "" : format("%.0f", over.to_f / base[:allocated]),
       (coverage = results[config].first[:coverage]) ? format("%.2f", coverage) : ""]
    end
    BenchReport.table(["configuration", "instructions", "vs none", "over none", "per allocation", "sampled share"],
                      rows)
    return unless rows.any? { |row| row.last != "" }

    puts "(sampled share: the share of allocations made in sampling windows (Collector#window_coverage, read " \
         "without a flush); a short run holds few windows and samples a share far from window_probability, so use " \
         "--iterations 1000000 for those rows; a budget follows the clock, which runs ~50 times slower under " \
         "valgrind)"
  end

  # A Rails app called in-process (rails_requests.rb), the profiler
  # started after its warm-up: what a request costs, without puma, wrk or
  # the machine's load. Windows need a few hundred requests to sample a
  # share near their probability (--iterations 200 holds ~100 of them).
  def rails(configs, requests, target = "rails")
    worker = File.join(__dir__, "rails_requests.rb")
    results = BenchReport.alternate(configs, 1) do |config|
      instructions, out, events = callgrind("-I", LIB, worker, config, requests.to_s, target, cache: cache_sim)
      { instructions: instructions, events: events, **JSON.parse(out.lines.last, symbolize_names: true) }
    end
    base = results["no profiler"].first
    # The same process without requests: what loading the app costs, so
    # that a request's own instructions are known.
    loading, = callgrind("-I", LIB, worker, "no profiler", "0", target)
    request = (base[:instructions] - loading).to_f / requests
    puts
    app = target == "rails" ? "the Rails-depth app (bench/lib/rails_app.ru)" : "the ActiveRecord app (bench/lib/rails_ar_app.ru)"
    puts "(8) callgrind, #{app} called in-process, #{requests} requests " \
         "(#{delimit(base[:allocated])} allocations) after a warm-up: instructions of the whole process, one run " \
         "each (#{millions(loading)} of them loading and warming up the app); \"per request\" and \"per " \
         "allocation\": the instructions over \"no profiler\" divided by them; \"request vs none\": a request's " \
         "instructions over no profiler's #{millions(request)}"
    rows = configs.map do |config|
      result = results[config].first
      over = result[:instructions] - base[:instructions]
      none = config == "no profiler"
      [config, millions(result[:instructions]), BenchReport.ratio(result[:instructions].to_f, base[:instructions]),
       none ? "" : format("%+.1f M", over / 1e6), none ? "" : format("%.2f M", over / 1e6 / requests),
       BenchReport.ratio(request + (over.to_f / requests), request),
       none ? "" : format("%.0f", over.to_f / base[:allocated]),
       result[:window_coverage] ? format("%.2f", result[:window_coverage]) : ""]
    end
    BenchReport.table(["configuration", "instructions", "vs none", "over none", "per request", "request vs none",
                       "per allocation", "sampled share"], rows)
    cache_misses(results, configs, requests) if cache_sim
  end

  # First-level (I1, D1) and last-level (LL) cache misses a request over no
  # profiler's, as valgrind's model of this machine's caches counts them.
  def cache_misses(results, configs, requests)
    base = results["no profiler"].first[:events]
    miss = lambda do |events, level|
      %w[I D].sum { |kind| events.fetch("#{kind}#{level}mr", 0) } + events.fetch("D#{level}mw", 0)
    end
    puts
    puts "(8) the same runs' cache misses (valgrind's model of one core's caches: #{CACHES.drop(1).join(' ')}), " \
         "first level (I1+D1) and second (LL), in the whole process; \"a request over none\": the misses over no " \
         "profiler's divided by the requests (the profiler's start included)"
    rows = configs.map do |config|
      events = results[config].first[:events]
      none = config == "no profiler"
      [config, format("%.1f M", miss.call(events, 1) / 1e6), format("%.2f M", miss.call(events, "L") / 1e6),
       none ? "" : format("%+.0f", (miss.call(events, 1) - miss.call(base, 1)).fdiv(requests)),
       none ? "" : format("%+.0f", (miss.call(events, "L") - miss.call(base, "L")).fdiv(requests))]
    end
    BenchReport.table(["configuration", "L1 misses", "LL misses", "L1 a request over none",
                       "LL a request over none"], rows)
  end

  def app_installed?(target)
    needs = target == "rails" ? 'require "action_pack/version"' : 'require "rails"; require "sqlite3"'
    return true if system(RbConfig.ruby, "-e", needs, err: File::NULL)

    puts "\n(8) callgrind #{target}: skipped, #{target == 'rails' ? 'ruby-actionpack' : 'ruby-rails or ruby-sqlite3'} " \
         "is not installed (script/bootstrap --bench installs it)"
    false
  end

  # The defaults' windows on TARGET at full speed, as two configurations
  # fixed by allocation counts: q and the rate inside them the defaults
  # chose, and q at the highest rate inside windows (MAX_IN_WINDOW_RATE),
  # which the defaults' cost cap never exceeds.
  def full_speed_configs(target)
    out, status = Open3.capture2(RbConfig.ruby, "-I", LIB, File.join(__dir__, "full_speed_windows.rb"), target)
    raise "full_speed_windows.rb #{target} failed" unless status.success?

    chosen = JSON.parse(out.lines.last, symbolize_names: true)
    q = format("%.3g", chosen[:q])
    puts "\n(8) #{target} at full speed, the defaults: #{chosen[:requests]} requests, #{delimit(chosen[:allocated])} " \
         "allocations; windows hooked #{q} of them and sampled #{format('%.4f', chosen[:in_window_rate])} of those " \
         "(#{chosen[:samples]} samples)"
    [chosen[:in_window_rate], MAX_IN_WINDOW_RATE].map do |rate|
      "memprofiler_pprof_rs #{format('%.3g', rate * Float(q))}, window_probability: #{q}, window_warm_up: 0"
    end
  end

  def requires
    results = BenchReport.alternate(REQUIRES.keys, 1) { |label| callgrind(*REQUIRES.fetch(label)).first }
    base = results["ruby -e 0"].first
    puts
    puts "(8) callgrind, loading a profiler: instructions of the whole process, one run each"
    rows = REQUIRES.keys.map do |label|
      count = results[label].first
      [label, millions(count), label == "ruby -e 0" ? "" : format("%+.1f M", (count - base) / 1e6)]
    end
    BenchReport.table(["command", "instructions", "over bare ruby"], rows)
  end

  # Runs `ruby ARGS` under callgrind; returns the instructions it counted
  # (its "Collected" line) and the program's stdout, and with `cache:` (CACHES)
  # every event it counted ({ "Ir" => .., "D1mr" => .., ... }).
  def callgrind(*args, cache: false)
    # --fair-sched=yes: valgrind runs one thread at a time, and by default
    # one that keeps running can starve the others, so the windows' timer
    # thread woke late and windows went by unhooked (0.025 of the Rails-depth
    # app's allocations hooked where 0.03 was asked; with it, 0.030).
    out, err, status = Open3.capture3("valgrind", "--tool=callgrind", "--fair-sched=yes",
                                      *(CACHES if cache),
                                      "--callgrind-out-file=/dev/null", RbConfig.ruby, *args)
    counts = err[/^==\d+== Collected\s*:\s*([\d ]+)$/, 1]&.split&.map { |count| Integer(count) }
    names = err[/^==\d+== Events\s*:\s*(.+)$/, 1]&.split || ["Ir"]
    raise "callgrind ruby #{args.join(' ')} failed:\n#{err}" unless status.success? && counts&.any?

    # (Counts of 0 at the end of the line are left out.)
    [counts.first, out, names.each_with_index.to_h { |name, i| [name, counts[i] || 0] }]
  end

  def millions(count) = format("%.1f M", count / 1e6)

  def delimit(number) = number.to_s.reverse.scan(/\d{1,3}/).join(",").reverse
end
