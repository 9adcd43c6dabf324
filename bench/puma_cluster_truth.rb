# frozen_string_literal: true

# How true a Rails app's profiles are under puma's cluster mode (2 workers,
# preload_app!, production), profiled through the Railtie: the scenario of
# spec/integration/puma_cluster_spec.rb (spec/support/puma_cluster.rb), run --runs
# times per configuration, each worker's profiles checked against the bytes
# it really kept. Per configuration:
# - the leak line's in-use in each worker's last profile / the truth;
# - how often that line tops the whole profile (not only the app's lines);
# - the garbage-only action's in-use over the leak's in a worker's last
#   profile (which follows a GC at exit), and the largest in its earlier
#   ones with 10 MB of leak or more (as of the GCs the requests caused);
# - how often `diff` over a worker's profiles calls the leak a likely leak;
# - the share of a worker's allocations that sampling windows missed.
# --busy N runs N busy loops beside the server (a loaded machine: the
# process then runs in slices, and some windows are missed).
# Needs Debian's puma and ruby-rails (script/bootstrap).
#
#   ruby -Ilib bench/puma_cluster_truth.rb [--runs 3] [--busy 2] [--only defaults]

require "optparse"
require "tmpdir"
require "open3"
require "memprofiler_pprof_rs"
require_relative "../spec/support/puma_cluster"
require_relative "lib/busy_loops"

CONFIGS = {
  "defaults" => {},
  "defaults, inuse_as_of: :flush" => { "MEMPROFILER_PPROF_RS_INUSE_AS_OF" => "flush" },
  "mode: :exact" => { "MEMPROFILER_PPROF_RS_MODE" => "exact" }
}.freeze

runs = 3
busy = 0
only = nil
parser = OptionParser.new do |opts|
  opts.on("--runs N", Integer, "runs per configuration (default 3)") { |n| runs = n }
  opts.on("--busy N", Integer, "busy loops beside the server (default 0)") { |n| busy = n }
  opts.on("--only NAME", CONFIGS.keys, "one configuration: #{CONFIGS.keys.join(', ')}") { |name| only = name }
end
begin
  parser.parse!
rescue OptionParser::ParseError => e
  abort "puma_cluster_truth: #{e.message}"
end
abort "puma_cluster_truth: --runs and --busy must not be negative" if runs.negative? || busy.negative?

def summary(values, digits = 2)
  return "-" if values.empty?

  sorted = values.sort
  format("%.#{digits}f [%.#{digits}f-%.#{digits}f]", sorted.sum / sorted.size, sorted.first, sorted.last)
end

BusyLoops.start(busy)

rows = CONFIGS.slice(*(only ? [only] : CONFIGS.keys)).map do |name, env|
  workers = []
  verdicts = []
  runs.times do
    Dir.mktmpdir("puma-cluster") do |dir|
      PumaCluster.serve_three_phases(dir, env)
      workers.concat(PumaCluster.workers(dir))
      verdicts.concat(PumaCluster.diff(dir).last)
    end
  end
  on_top = workers.count { |w| w.top_line.include?("block in LeakController#leaky") }
  [name, summary(workers.map { |w| w.leak.fdiv(w.truth) }), "#{on_top} of #{workers.size}",
   summary(workers.map { |w| w.clean.fdiv(w.leak) }, 3), summary(workers.map { |w| w.garbage_shares.max || 0.0 }, 3),
   "#{verdicts.count { |v| v.start_with?('Verdict: likely leak: block in LeakController#leaky') }} of #{verdicts.size}",
   summary(workers.map { |w| 100 * w.missed_share }, 1)]
end

header = ["configuration", "leak in-use / truth, mean [min-max]", "leak on top", "garbage / leak, last profile",
          "garbage / leak, worst earlier profile", "diff: likely leak", "missed by windows, % of allocations"]
puts "| #{header.join(' | ')} |"
puts "|#{header.map { '---' }.join('|')}|"
rows.each { |row| puts "| #{row.join(' | ')} |" }
