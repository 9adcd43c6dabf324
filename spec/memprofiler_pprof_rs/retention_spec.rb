# frozen_string_literal: true

require "spec_helper"
require "json"

# Collector#retention_report: the shortest chain of references from a GC
# root to sampled objects of the sites with the most memory in use, walked
# in a forked child.
module RetentionSpecLeak
  CACHE = {} # rubocop:disable Style/MutableConstant (the leak)

  class Registry
    @entries = []
    class << self
      attr_reader :entries
    end
  end

  PageRenderer = Struct.new(:buffer)

  def self.keep_pages(count)
    count.times { |i| CACHE["page:#{i}"] = [PageRenderer.new("<p>#{i}</p>" * 20)] }
  end

  def self.register(count)
    count.times { |i| Registry.entries << "entry #{i} " * 30 }
  end
end

RSpec.describe "Collector#retention_report" do
  after do
    RetentionSpecLeak::CACHE.clear
    RetentionSpecLeak::Registry.entries.clear
    $retention_spec_global = nil # rubocop:disable Style/GlobalVars
    Thread.current[:retention_spec_local] = nil
  end

  def report_with(collector_options = {}, **report_options)
    collector = MemprofilerPprof::Collector.new(sample_rate: 1.0, **collector_options)
    collector.start!
    yield
    collector.retention_report(**report_options)
  ensure
    collector&.stop!
  end

  def site_named(report, text)
    report.sites.find { |site| site["site"].include?(text) } or
      raise "no site #{text.inspect} in:\n#{report}"
  end

  def paths_of(site)
    site["objects"].filter_map { |object| MemprofilerPprof::RetentionReport.path_text(object) }
  end

  %i[exact light].each do |mode|
    it "names the constant, the Hash key, the Array index and the member that hold a leak (mode: :#{mode})" do
      report = report_with({ mode: mode }, top: 3, per_site: 3) { RetentionSpecLeak.keep_pages(2_000) }
      site = site_named(report, "String#*")
      expect(site["objects"].size).to eq(3)
      leak = /\ARetentionSpecLeak::CACHE \(constant\) -> Hash\["page:\d+"\] -> Array\[0\] -> /
      expect(paths_of(site)).to all(match(/#{leak}RetentionSpecLeak::PageRenderer\.buffer -> String\z/))
      expect(site["inuse_objects"]).to be_within(100).of(2_000)
      expect(report).not_to be_partial
      expect(report.to_s).to include("RetentionSpecLeak::CACHE (constant)")
    end
  end

  it "finds the objects again after GC.compact moved them (mode: :light)" do
    skip "GC.compact is not supported here" unless GC.respond_to?(:compact)

    report = report_with({ mode: :light }, top: 3, per_site: 2) do
      RetentionSpecLeak.keep_pages(1_000)
      GC.compact
    end
    paths = paths_of(site_named(report, "String#*"))
    expect(paths).to all(start_with("RetentionSpecLeak::CACHE (constant) -> Hash[\"page:"))
  end

  it "names a class's instance variable, a global and a thread-local" do
    report = report_with({}, top: 10, per_site: 1) do
      RetentionSpecLeak.register(500)
      $retention_spec_global = Array.new(400) { |i| "global #{i} " * 30 } # rubocop:disable Style/GlobalVars
      Thread.current[:retention_spec_local] = Array.new(300) { |i| "local #{i} " * 30 }
    end
    texts = report.sites.flat_map { |site| paths_of(site) }
    expect(texts).to include(
      a_string_matching(/\ARetentionSpecLeak::Registry\.@entries \(class instance variable\) -> Array\[\d+\] -> String\z/),
      a_string_matching(/\A\$retention_spec_global \(global\) -> Array\[\d+\] -> String\z/),
      a_string_matching(/\AThread main\[:retention_spec_local\] \(fiber-local\) -> Array\[\d+\] -> String\z/)
    )
  end

  it "names the main script's local variables and the frames of a script's site" do
    script = <<~RUBY
      require "memprofiler_pprof_rs"
      class PageCache
        def initialize; @pages = {}; end
        def put(key, page); @pages[key] = page; end
      end
      collector = MemprofilerPprof::Collector.new(sample_rate: 1.0)
      collector.start!
      cache = PageCache.new
      300.times { |i| cache.put("p\#{i}", "<html>\#{i}</html>" * 10) }
      puts collector.retention_report(top: 3, per_site: 1, sites: ["-e:9"])
    RUBY
    out, err, status = run_ruby(script)
    expect(status).to be_success, err
    expect(out).to match(/^1\. String#\* \(-e:9\): ~[\d.]+ KB in use, ~300 objects \(300 samples, ±6%\)$/)
    expect(out).to include("its sampled objects are Ruby's internal objects")
    expect(out).to match(/^   String: the main script's local variable cache -> PageCache\#@pages -> Hash\["p\d+"\] -> String$/)
  end

  it "names hops through objects that refuse to be looked into, and never runs their methods" do
    hostile = Class.new do
      def inspect = raise("inspect must not run")
      def equal?(*) = raise("equal? must not run")
      def ==(*) = raise("== must not run")
      def hash = raise("hash must not run")
    end
    report = report_with({}, top: 3, per_site: 2) do
      by_identity = {}.compare_by_identity
      50.times { |i| by_identity[BasicObject.new] = ["kept by a BasicObject key #{i}"] * 10 }
      RetentionSpecLeak::CACHE[:identity] = by_identity
      hostile_keys = {}.compare_by_identity
      hostile_keys[hostile.new] = Array.new(300) { |i| "behind a hostile key #{i}" * 5 }
      RetentionSpecLeak::CACHE[:hostile] = hostile_keys
      Thread.current.name = "bad \xFF name".b
    end
    texts = report.sites.flat_map { |site| paths_of(site) }
    held = /\ARetentionSpecLeak::CACHE \(constant\) -> Hash\[:hostile\] -> /
    expect(texts).to include(a_string_matching(/#{held}Hash\[#<#<Class:0x\h+>>\] -> Array\[\d+\] -> String\z/))
  ensure
    Thread.current.name = nil
  end

  it "forks past other libraries' fork hooks (none runs, in the child or the parent), and survives CHLD ignored" do
    script = <<~'RUBY'
      require "memprofiler_pprof_rs"
      collector = MemprofilerPprof::Collector.new(sample_rate: 1.0).tap(&:start!)
      KEPT = Array.new(100) { |i| "kept #{i}" * 10 }
      Process.singleton_class.prepend(Module.new do
        def _fork
          puts "#{Process.pid}: a fork hook ran"
          super
        end
      end)
      MemprofilerPprof::Atfork.at_fork(:child) { puts "#{Process.pid}: an at_fork handler ran" }
      puts "#{Process.pid}: " + collector.retention_report(top: 1, per_site: 1).sites.first["objects"].first["class"]
      trap("CHLD", "IGNORE")
      puts "#{Process.pid}: " + collector.retention_report(top: 1, per_site: 1).sites.first["objects"].first["class"]
    RUBY
    out, err, status = run_ruby(script)
    expect(status).to be_success, err
    pid = out[/\A\d+/]
    expect(out).to eq("#{pid}: String\n#{pid}: String\n")
  end

  it "frees nothing in the child: no finalizer runs there for what only another thread holds" do
    Dir.mktmpdir do |dir|
      log = File.join(dir, "finalized")
      script = <<~'RUBY'
        require "memprofiler_pprof_rs"
        def finalizer(log) = proc { File.write(log, "#{Process.pid}\n", mode: "a") }
        collector = MemprofilerPprof::Collector.new(sample_rate: 1.0).tap(&:start!)
        KEPT = Array.new(100) { |i| "kept #{i}" * 10 }
        ready = Queue.new
        holder = Thread.new do
          held = Object.new
          ObjectSpace.define_finalizer(held, finalizer(ARGV[0]))
          ready << true
          sleep
        end
        ready.pop
        collector.retention_report(top: 1)
        puts File.exist?(ARGV[0]) ? File.read(ARGV[0]) : "nothing finalized"
      RUBY
      out, err, status = run_ruby(script, args: [log])
      expect(status).to be_success, err
      expect(out).to eq("nothing finalized\n")
    end
  end

  it "prefers a named root to the GC's root sets, which hold many classes themselves" do
    report = report_with({}, top: 1, per_site: 1, sites: ["String#center"]) do
      String.instance_variable_set(:@retention_spec_held, ["held".center(100, ".")])
    end
    expect(paths_of(report.sites.first)).to eq(["String.@retention_spec_held (class instance variable) -> Array[0] -> String"])
  ensure
    String.remove_instance_variable(:@retention_spec_held)
  end

  it "refuses to go on in a child whose GC another thread turned back on around the fork" do
    collector = MemprofilerPprof::Collector.new.tap(&:start!)
    allow(GC).to receive(:disable).and_return(false) # (as if turned on again before the fork)
    expect { collector.retention_report(top: 1) }
      .to raise_error(MemprofilerPprof::RetentionError, /another thread turned GC on \(GC.enable\).*try again/)
  ensure
    collector&.stop!
  end

  it "shows no control character of the process's names" do
    report = MemprofilerPprof::RetentionReport.from_h(
      "sites" => [{ "site" => "evil\e[2J (x.rb:1)", "inuse_bytes" => 1, "inuse_objects" => 1, "objects" => [] }]
    )
    expect(report.to_s).to include("1. evil?[2J (x.rb:1)")
  end

  def make_garbage(count) = Array.new(count) { |i| "garbage #{i} " * 10 }

  it "says which sampled objects have no path (garbage not yet collected), and gc: true collects it first" do
    collector = MemprofilerPprof::Collector.new(sample_rate: 1.0).tap(&:start!)
    GC.disable # (so that the garbage below is still there for the report)
    make_garbage(200)
    report = collector.retention_report(top: 1, per_site: 2, sites: ["make_garbage"])
    GC.enable
    site = report.sites.first
    expect(site["objects"].map { |object| object["path"] }).to eq([nil, nil])
    expect(report.to_s).to include("   String: no path from a root found\n")
    expect(report.to_s).to match(/\(8 of the 8 objects sampled here that the walk looked for have no path from a root: garbage/)

    GC.disable
    make_garbage(200)
    collected = collector.retention_report(top: 1, per_site: 2, sites: ["make_garbage"], gc: true)
    GC.enable
    expect(collected.sites.flat_map { |garbage_site| garbage_site["objects"] }).to be_empty # (the Strings are gone)
    expect(collected.to_s).not_to include("no path")

    unmatched = collector.retention_report(top: 1, sites: ["no such site"])
    expect(unmatched.to_s).to include("No site matches the sites asked for. The biggest sites: ")
  ensure
    GC.enable
    collector&.stop!
  end

  it "names a constant before a local variable or a global holding the same object" do
    script = <<~'RUBY'
      require "memprofiler_pprof_rs"
      collector = MemprofilerPprof::Collector.new(sample_rate: 1.0).tap(&:start!)
      held = Array.new(300) { |i| "held #{i}" * 10 }
      HELD = held
      $held = held
      puts collector.retention_report(top: 1, per_site: 1, sites: ["-e:3"]).to_s.lines.grep(/String:/)
    RUBY
    out, err, status = run_ruby(script)
    expect(status).to be_success, err
    expect(out).to match(/\A   String: HELD \(constant\) -> Array\[\d+\] -> String\n\z/)
  end

  it "reports only the sites asked for" do
    report = report_with({}, top: 5, per_site: 1, sites: ["String#*", /\Anothing\z/]) do
      RetentionSpecLeak.keep_pages(200)
      RetentionSpecLeak.register(200)
    end
    expect(report.sites.map { |site| site["site"] }).to contain_exactly(
      "String#* (#{__FILE__}:22)", "String#* (#{__FILE__}:26)"
    )
  end

  it "round-trips through JSON, and the CLI prints a saved report" do
    report = report_with({}, top: 2, per_site: 1) { RetentionSpecLeak.keep_pages(500) }
    Dir.mktmpdir do |dir|
      path = report.save(File.join(dir, "retainers.json"))
      expect(MemprofilerPprof::RetentionReport.load(path).to_s).to eq(report.to_s)
      out, err, status = Open3.capture3(RbConfig.ruby, File.join(PROJECT_ROOT, "exe/memprofiler_pprof_rs"),
                                        "retainers", path)
      expect(status.exitstatus).to eq(0), err
      expect(out).to eq(report.to_s)

      File.write(path, JSON.generate("sites" => [{ "site" => "x", "objects" => [{ "class" => 1 }] }]))
      out, err, status = Open3.capture3(RbConfig.ruby, File.join(PROJECT_ROOT, "exe/memprofiler_pprof_rs"),
                                        "retainers", path)
      expect([out, status.exitstatus]).to eq(["", 1])
      expect(err).to eq("memprofiler_pprof_rs: #{path}: not a retention report (site 0: an object is malformed)\n")
      {
        { "sites" => [], "fork_seconds" => "x" * 1000 } => '"fork_seconds" is not a number',
        { "sites" => [{ "site" => "s", "inuse_objects" => {} }] } => 'site 0: "inuse_objects" is not a number',
        { "sites" => [{ "site" => "s", "objects" => [{ "class" => "S", "path" => [{ "kind" => "ivar", "ref" => [] }] }] }] } =>
          "site 0: an object is malformed"
      }.each do |data, problem|
        File.write(path, JSON.generate(data))
        _, err, status = Open3.capture3(RbConfig.ruby, File.join(PROJECT_ROOT, "exe/memprofiler_pprof_rs"),
                                        "retainers", path)
        expect([err, status.exitstatus]).to eq(["memprofiler_pprof_rs: #{path}: not a retention report (#{problem})\n", 1])
      end
      expect { MemprofilerPprof::RetentionReport.load("/dev/zero") }.to raise_error(ArgumentError, "/dev/zero: not a file")
    end
  end

  it "goes beside a profile in the flame graph page (the CLI's flamegraph --retainers)" do
    exe = File.join(PROJECT_ROOT, "exe/memprofiler_pprof_rs")
    Dir.mktmpdir do |dir|
      collector = MemprofilerPprof::Collector.new(sample_rate: 1.0).tap(&:start!)
      RetentionSpecLeak.keep_pages(300)
      GC.start # (in use: as of the last GC)
      File.binwrite(File.join(dir, "heap.pprof"), collector.flush.pprof_data)
      collector.retention_report(top: 2, per_site: 1).save(File.join(dir, "retainers.json"))
      collector.stop!
      _, err, status = Open3.capture3(RbConfig.ruby, exe, "flamegraph", "heap.pprof", "-o", "heap.html",
                                      "--retainers", "retainers.json", chdir: dir)
      expect(status.exitstatus).to eq(0), err
      page = File.read(File.join(dir, "heap.html"))
      expect(page).to include("<h2>What holds it</h2>", %("retainers":[{"site":"String#* (#{__FILE__}:22)"))
      expect(page).to include("RetentionSpecLeak::CACHE (constant) -\\u003e Hash[\\\"page:")

      _, err, status = Open3.capture3(RbConfig.ruby, exe, "flamegraph", "heap.pprof", "-o", "heap.svg",
                                      "--retainers", "retainers.json", chdir: dir)
      expect([status.exitstatus, err.lines.first]).to eq(
        [2, "memprofiler_pprof_rs: --retainers are shown on the HTML page only, not in an SVG\n"]
      )
    end
  end

  it "keeps a long path's first and last hops, saying how many are left out" do
    report = report_with({}, top: 1, per_site: 1, sites: ["String#center"]) do
      tail = []
      chain = tail
      100.times { chain = [chain] }
      RetentionSpecLeak::CACHE[:chain] = chain
      tail << "the end".center(100, ".")
    end
    # 104 hops: Object and the module (their constant), the Hash, 101 Arrays.
    expect(paths_of(report.sites.first).first).to match(
      /\ARetentionSpecLeak::CACHE \(constant\) -> Hash\[:chain\] -> (Array\[0\] -> ){12}\.\.\. 74 more hops \.\.\. -> (Array\[0\] -> ){15}String\z/ # rubocop:disable Layout/LineLength
    )
  end

  # A chain of `length` Arrays under a constant, built before the collector
  # starts, with a String at its far end: the one sampled object, whose
  # path the walk finds only after reaching every Array.
  def report_on_chain_end(length, **options)
    tail = []
    chain = tail
    length.times { chain = [chain] }
    RetentionSpecLeak::CACHE[:chain] = chain
    chain = nil # (only the constant holds it)
    report_with({}, top: 1, per_site: 1, sites: ["String#center"], **options) do
      tail << "the end".center(100, ".")
      tail = nil
    end
  end

  it "stops at max_objects, at max_memory_mb and at its time bound, and says the report is partial" do
    by_count = report_on_chain_end(10_000, max_objects: 1)
    expect(by_count).to be_partial
    expect(by_count.stopped).to eq("objects")
    expect(by_count.to_s).to include("PARTIAL: the walk stopped at max_objects (1)")
    expect(by_count.sites.first["objects"].first["path"]).to be_nil
    expect(by_count.to_s).to include("String: no path from a root found (the walk was cut short)")

    by_memory = report_on_chain_end(200_000, max_memory_mb: 1)
    expect(by_memory.stopped).to eq("memory")
    expect(by_memory.to_s).to include("PARTIAL: the walk stopped at its memory bound (max_memory_mb: 1)")

    # (The walk's share of the timeout made nil, so that its bound is hit
    # at the first look, however fast the machine, while the answer still
    # has all the time it needs.)
    stub_const("MemprofilerPprof::Retention::WALK_SHARE", 0.0)
    by_time = report_on_chain_end(10_000, timeout: 20)
    expect(by_time.stopped).to eq("time")
    expect(by_time.to_s).to include("PARTIAL: the walk stopped at its time bound (timeout: 20.0 s)")

    stub_const("MemprofilerPprof::Retention::WALK_SHARE", 0.8)
    whole = report_on_chain_end(10_000)
    expect(whole).not_to be_partial
    expect(paths_of(whole.sites.first).first).to include("... 9974 more hops ...")
  end

  it "kills a child that does not answer by the timeout" do
    allow(MemprofilerPprof::Retention::GraphWalk).to(receive(:new).and_wrap_original { sleep 30 })
    started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    expect { report_with({}, timeout: 1) { RetentionSpecLeak.keep_pages(10) } }
      .to raise_error(MemprofilerPprof::RetentionError, /did not answer within 1\.0 s \(its process was killed\)/)
    expect(Process.clock_gettime(Process::CLOCK_MONOTONIC) - started).to be < 10
  end

  it "passes a failure in the child on as a RetentionError" do
    allow(MemprofilerPprof::Retention::GraphWalk).to receive(:new).and_raise(RuntimeError, "boom")
    expect { report_with { RetentionSpecLeak.keep_pages(10) } }
      .to raise_error(MemprofilerPprof::RetentionError, "the retention walk failed: RuntimeError: boom")
  end

  it "refuses bad arguments, naming the value" do
    collector = MemprofilerPprof::Collector.new.tap(&:start!)
    expect { collector.retention_report(top: 0) }
      .to raise_error(ArgumentError, "top must be a whole number from 1 to 100, got 0")
    expect { collector.retention_report(top: 2.5) }.to raise_error(TypeError, /top must be a whole number .* got 2.5/)
    expect { collector.retention_report(per_site: "3") }.to raise_error(TypeError, /per_site/)
    expect { collector.retention_report(timeout: -1) }.to raise_error(ArgumentError, /timeout .* got -1/)
    expect { collector.retention_report(timeout: Float::NAN) }.to raise_error(ArgumentError, /got NaN/)
    expect { collector.retention_report(max_objects: 0) }
      .to raise_error(ArgumentError, "max_objects must be a whole number at least 1, got 0")
    expect { collector.retention_report(gc: "yes") }.to raise_error(TypeError, /gc/)
    expect { collector.retention_report(sites: [1]) }.to raise_error(ArgumentError, /sites must be .* got 1/)
    expect { collector.retention_report(sites: []) }.to raise_error(ArgumentError, /sites must name at least one site .*got \[\]/)
  ensure
    collector&.stop!
  end

  it "needs a running collector, fork, no Ractors, and one report at a time" do
    collector = MemprofilerPprof::Collector.new
    expect { collector.retention_report }.to raise_error(MemprofilerPprof::StateError, /needs a running collector/)
    collector.start!

    allow(MemprofilerPprof::RactorSafety).to receive(:ractors_used?).and_return(true)
    expect { collector.retention_report }.to raise_error(MemprofilerPprof::RetentionError, /Ractors/)
    allow(MemprofilerPprof::RactorSafety).to receive(:ractors_used?).and_call_original

    allow(MemprofilerPprof::Retention).to receive(:plain_fork).and_raise(Errno::EAGAIN)
    expect { collector.retention_report }
      .to raise_error(MemprofilerPprof::RetentionError, /could not fork: Resource temporarily unavailable/)
    expect(GC.disable).to be(false) # (turned back on after the failed fork)
    GC.enable
    allow(MemprofilerPprof::Retention).to receive(:plain_fork).and_call_original

    MemprofilerPprof::Retention::LOCK.synchronize do
      expect { collector.retention_report }
        .to raise_error(MemprofilerPprof::RetentionError, "a retention report is already running in this process")
    end
    expect(collector.retention_report(top: 1)).to be_a(MemprofilerPprof::RetentionReport)
  ensure
    collector&.stop!
  end

  it "leaves the parent's flushers out of the child" do
    Dir.mktmpdir do |dir|
      collector = MemprofilerPprof::Collector.new(sample_rate: 1.0).tap(&:start!)
      flusher = MemprofilerPprof::FileFlusher.new(collector, pattern: "#{dir}/mem-%{pid}-%{index}.pprof", interval: 0.05)
      flusher.start!
      RetentionSpecLeak.keep_pages(100)
      collector.retention_report(top: 1, per_site: 1)
      flusher.stop!
      pids = Dir.children(dir).filter_map { |name| name[/\Amem-(\d+)-/, 1]&.to_i }.uniq
      expect(pids).to eq([Process.pid])
    ensure
      flusher&.stop!
      collector&.stop!
    end
  end
end
