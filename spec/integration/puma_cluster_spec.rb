# frozen_string_literal: true

require "tmpdir"

# A Rails app in production as issue 38 tried it: puma in cluster mode (2
# workers, preload_app!), profiled through the Railtie, three phases of
# requests to a leaking and a garbage-only action a flush interval apart,
# each worker writing the bytes it really keeps (spec/support/puma_cluster.rb,
# spec/apps/puma_app). bench/puma_cluster_truth.rb runs it many times for
# docs/performance.md. Debian builds puma and Rails for its suite's default
# Ruby only, so the Debian roots of script/test-debian skip this
# (MEMPROFILER_SKIP_FRAMEWORKS=1).
#
# script/rspec-lanes: alone
# (Beside another busy lane the workers' windows went by unhooked more
# often: 5.2% of one worker's allocations, and its leak read 0.74 of the
# truth against a bound of 0.75.)
RSpec.describe "A Rails app under puma's cluster mode", :slow do
  before do
    skip "Rails and puma are not installed in this root (MEMPROFILER_SKIP_FRAMEWORKS=1)" if ENV["MEMPROFILER_SKIP_FRAMEWORKS"]
  end

  def check_workers(dir, log, garbage_share:, in_flight:)
    # No profiler thread in the master when it forks: puma lists the
    # threads the app's boot started (Rails' own concurrent-ruby one), none
    # of them the gem's; and no profile from the master.
    threads = log.lines.grep(/\] ! #<Thread:/)
    expect(log.include?("Thread(s) started in app boot")).to eq(!threads.empty?)
    expect(threads.grep(/memprofiler/)).to eq([])
    master = PumaCluster.master_pid(log)
    workers = PumaCluster.workers(dir)
    expect(workers.map(&:pid).size).to eq(2)
    expect(workers.map(&:pid)).not_to include(master)
    workers.each { |worker| check_worker(worker, master, garbage_share, in_flight) }
    check_diff(dir, workers)
  end

  def check_worker(worker, master, garbage_share, in_flight)
    expect(worker.processes.map { |p| [p.pid, p.forked_from] }).to eq([[worker.pid, master]])
    expect(worker.processes.first.program).to start_with("puma: cluster worker")
    # The leak on top of the app's lines, off from the truth by no more
    # than the profile says it may be (three relative standard errors, at
    # least 20%). (A sampled 1 MB Thread reads as 100 MB at 1 in 100: on
    # top of everything in some runs; see docs/performance.md.)
    # (The leak's line allocates the Strings, in the block, and the Array
    # that keeps them: either may lead, as a sampled 16 kB Array weighs.)
    expect(worker.app_top_line).to match(/%  (block in )?LeakController#leaky config\.ru:\d+$/)
    expect(worker.leak.fdiv(worker.truth)).to be_within([0.2, 3 * worker.rse].max).of(1.0), worker.to_h.to_s
    # Garbage does not read as in use: in the last profile (after a GC at
    # exit), and in the earlier ones, which are as of the GCs the requests
    # caused, no more than the requests in flight at those GCs held (alive
    # then), read through the sampling's noise.
    expect(worker.clean.fdiv(worker.leak)).to be <= garbage_share, worker.to_h.to_s
    # (None has 10 MB of leak in use where no GC ran during the requests.)
    expect(worker.garbage_shares.max || 0).to be <= in_flight, worker.to_h.to_s
  end

  # Each worker's section: the site that grew most is the leak's line, its
  # Strings or the Array that keeps them ("Class#new in LeakController#leaky":
  # one sampled Array can stand for tens of MB at the defaults). Its verdict
  # calls it a likely leak when it rose beyond the sampling error in every
  # interval with a GC: see docs/performance.md for how often.
  def check_diff(dir, workers)
    out, verdicts = PumaCluster.diff(dir)
    expect(out).to start_with("These #{workers.sum { |w| w.files.size }} profiles come from 2 processes")
    sections = out.split(/^== /).drop(1)
    expect(sections.size).to eq(2)
    expect(verdicts.size).to eq(2)
    sections.each do |section|
      rows = section.lines.drop_while { |l| !l.start_with?("Growth by allocation site") }
      expect(rows[2]).to match(/ LeakController#leaky at config\.ru:\d+$/), section
    end
  end

  it "at the defaults: the leak on top of each worker's in-use, garbage under 5%, no thread before fork" do
    Dir.mktmpdir("puma-cluster") do |dir|
      log = PumaCluster.serve_three_phases(dir, {})
      check_workers(dir, log, garbage_share: 0.05, in_flight: 0.25)
    end
  end

  it "with mode: :exact: the leak within 20% of the truth, garbage under 1%" do
    Dir.mktmpdir("puma-cluster") do |dir|
      log = PumaCluster.serve_three_phases(dir, "MEMPROFILER_PPROF_RS_MODE" => "exact")
      check_workers(dir, log, garbage_share: 0.01, in_flight: 0.05)
    end
  end
end
