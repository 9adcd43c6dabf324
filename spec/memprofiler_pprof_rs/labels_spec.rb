# frozen_string_literal: true

# Context labels (MemprofilerPprof.with_labels): which request or job
# allocated what, in the allocation profile and, for as long as the objects
# live, in the live one.
RSpec.describe "MemprofilerPprof.with_labels" do
  let(:labels_module) { MemprofilerPprof::Labels }

  after { MemprofilerPprof.labels = nil }

  def label(profile_sample, key)
    profile_sample.labels.find { |l| l.key == key }&.str
  end

  # Sum of sample type `type` by the value of label `key`.
  describe "the current fiber's labels" do
    it "nests, merges, removes a key given nil, and restores however the block ends" do
      expect(MemprofilerPprof.labels).to eq({})
      MemprofilerPprof.with_labels(endpoint: "GET /users/:id", shard: 3) do
        expect(MemprofilerPprof.labels).to eq("endpoint" => "GET /users/:id", "shard" => "3")
        MemprofilerPprof.with_labels("job" => :Mailer, shard: nil) do
          expect(MemprofilerPprof.labels).to eq("endpoint" => "GET /users/:id", "job" => "Mailer")
        end
        expect do
          MemprofilerPprof.with_labels(endpoint: "inner") { raise "boom" }
        end.to raise_error(RuntimeError, "boom")
        expect(MemprofilerPprof.labels).to eq("endpoint" => "GET /users/:id", "shard" => "3")
      end
      expect(MemprofilerPprof.labels).to eq({})
      expect(MemprofilerPprof.labels).to be_frozen
    end

    it "is replaced whole by labels= and cleared by nil or {}" do
      MemprofilerPprof.labels = { queue: "default", job: String }
      expect(MemprofilerPprof.labels).to eq("queue" => "default", "job" => "String")
      MemprofilerPprof.labels = { job: "Other" }
      expect(MemprofilerPprof.labels).to eq("job" => "Other")
      MemprofilerPprof.labels = {}
      expect(MemprofilerPprof.labels).to eq({})
      expect(Thread.current[labels_module::FIBER_KEY]).to be_nil
    end

    it "belongs to the fiber: neither a new fiber nor a new thread inherits it, nor leaks back" do
      MemprofilerPprof.with_labels(endpoint: "outer") do
        seen = {}
        fiber = Fiber.new do
          seen[:fiber_start] = MemprofilerPprof.labels
          MemprofilerPprof.labels = { endpoint: "fiber" }
          Fiber.yield
          seen[:fiber_resumed] = MemprofilerPprof.labels
        end
        fiber.resume
        seen[:between] = MemprofilerPprof.labels
        fiber.resume
        seen[:thread] = Thread.new { MemprofilerPprof.labels }.value
        expect(seen).to eq(fiber_start: {}, between: { "endpoint" => "outer" },
                           fiber_resumed: { "endpoint" => "fiber" }, thread: {})
        parent = MemprofilerPprof.labels
        passed = Thread.new { MemprofilerPprof.with_labels(**parent) { MemprofilerPprof.labels } }.value
        expect(passed).to eq("endpoint" => "outer")
      end
    end
  end

  describe "bad labels" do
    it "are refused with the bad key or value named, and leave the labels as they were" do
      MemprofilerPprof.labels = { endpoint: "kept" }
      {
        [{ "with-dash" => 1 }] => [ArgumentError, /label key "with-dash" is not an identifier/],
        [{ "" => 1 }] => [ArgumentError, /label key ""/],
        [{ "9lives" => 1 }] => [ArgumentError, /"9lives"/],
        [{ ("k" * 65) => 1 }] => [ArgumentError, /not an identifier of 1-64/],
        [{ class: "X" }] => [ArgumentError, /label key "class" is reserved/],
        [{ gc_age: 1 }] => [ArgumentError, /"gc_age" is reserved/],
        [{ 1 => "x" }] => [TypeError, /a label key must be a Symbol or String, got 1/],
        [{ k: Object.new }] => [TypeError, /label k must be a String, Symbol, number.*got #<Object/],
        [{ k: [1] }] => [TypeError, /got \[1\]/],
        [(1..9).to_h { |i| [:"k#{i}", i] }] => [ArgumentError, /\A(9|10) labels: at most 8/],
        ["endpoint"] => [TypeError, /labels must be a Hash of label => value, got "endpoint"/]
      }.each do |(labels), (error, message)|
        expect { MemprofilerPprof.with_labels(labels) { raise "ran" } }.to raise_error(error, message)
        expect { MemprofilerPprof.labels = labels }.to raise_error(error, message)
        expect(MemprofilerPprof.labels).to eq("endpoint" => "kept")
      end
      expect { MemprofilerPprof.with_labels(endpoint: "x") }.to raise_error(ArgumentError, /needs a block/)
      expect { MemprofilerPprof.max_label_sets = 0 }.to raise_error(ArgumentError, /max_label_sets/)
      expect { MemprofilerPprof.max_label_sets = "5" }.to raise_error(TypeError, /max_label_sets/)
      expect { MemprofilerPprof.max_label_sets = 50_001 }
        .to raise_error(ArgumentError, /max_label_sets must be.*50000.*got 50001/)
    end

    it "cuts a megabyte-long value to 200 bytes at a character boundary" do
      MemprofilerPprof.labels = { endpoint: "é" * 500_000 }
      expect(MemprofilerPprof.labels["endpoint"]).to eq("é" * 100)
      MemprofilerPprof.labels = { endpoint: "#{'x' * 199}é" }
      expect(MemprofilerPprof.labels["endpoint"]).to eq("x" * 199)
    end

    # In a child: the table of sets is the process's, and this fills it.
    it "fold beyond max_label_sets into (other), counted, with memory bounded, for 200,000 distinct values", :slow do
      out, err, status = run_ruby(<<~RUBY)
        require "memprofiler_pprof_rs"
        MemprofilerPprof.max_label_sets = 50
        rss = -> { File.read("/proc/self/status")[/VmRSS:\\s+(\\d+)/, 1].to_i }
        collector = MemprofilerPprof::Collector.new(sample_rate: 1.0)
        collector.start!
        kept = []
        MemprofilerPprof.with_labels(request_id: "warm") { kept << "x" * 64 }
        before = rss.call
        200_000.times { |i| MemprofilerPprof.with_labels(request_id: i, n: i % 7) { kept << "y" if (i % 50_000).zero? } }
        grown = rss.call - before
        data = collector.flush
        MemprofilerPprof.with_labels(request_id: "one more") { nil }
        later = collector.flush
        collector.stop!
        profile = MemprofilerPprof::PprofReader.parse(data.pprof_data)
        values = profile.samples.flat_map { |s| s.labels.select { |l| l.key == "request_id" }.map(&:str) }.uniq.sort
        p [MemprofilerPprof::Labels.count, MemprofilerPprof::Labels.folds, grown, values,
           data.label_sets_folded, later.label_sets_folded]
      RUBY
      expect(status).to be_success, err
      count, folds, grown_kb, values, folded, folded_later = eval(out)
      expect(count).to be <= 50 + 64 + 1
      expect(folds).to eq(200_000 + 1 + 1 - 50)
      expect([folded, folded_later]).to eq([200_000 + 1 - 50, 1])
      expect(grown_kb).to be < 20_000
      expect(values).to include("(other)", "warm")
    end
  end

  %i[exact light].each do |mode|
    describe "on samples (mode: #{mode})" do
      it "names which label's objects are alive, in inuse_* as well as alloc_*, beside class and gc_age" do
        collector = MemprofilerPprof::Collector.new(mode: mode, sample_rate: 1.0)
        leaked = []
        data = collector.profile do
          MemprofilerPprof.with_labels(endpoint: "GET /leaky") { 2_000.times { leaked << ("l" * 100) } }
          MemprofilerPprof.with_labels(endpoint: "GET /clean") { 2_000.times { ("c" * 100).size } }
          GC.start
        end
        profile = parse_profile(data)
        inuse = sums_by_label(profile, "endpoint", "inuse_objects")
        alloc = sums_by_label(profile, "endpoint", "alloc_objects")
        expect(inuse["GET /leaky"]).to be_between(2_000, 2_100)
        expect(inuse["GET /clean"]).to be < 100
        expect(alloc["GET /leaky"]).to be >= 2_000
        expect(alloc["GET /clean"]).to be >= 2_000
        leaky = profile.samples.find { |s| label(s, "endpoint") == "GET /leaky" && s.value(profile, "inuse_objects") >= 1_000 }
        expect(label(leaky, "class")).to eq("String")
        expect(leaky.labels.map(&:key)).to include("gc_age")
        expect(leaked.size).to eq(2_000)
      end

      it "keeps an object's labels for as long as it lives, across flushes, after its block ended" do
        collector = MemprofilerPprof::Collector.new(mode: mode, sample_rate: 1.0)
        collector.start!
        kept = MemprofilerPprof.with_labels(job: "Importer") { Array.new(500) { "i" * 50 } }
        collector.flush
        3.times { "after" * 10 }
        GC.start
        profile = parse_profile(collector.flush)
        collector.stop!
        expect(sums_by_label(profile, "job", "inuse_objects")["Importer"]).to be_between(500, 550)
        expect(sums_by_label(profile, "job", "alloc_objects")["Importer"]).to eq(0)
        expect(kept.size).to eq(500)
      end

      it "keeps the labels in Pyroscope's class_frame shape and in :drop, and go tool pprof -tagfocus reads them" do
        collector = MemprofilerPprof::Collector.new(mode: mode, sample_rate: 1.0)
        collector.start!
        kept = MemprofilerPprof.with_labels(endpoint: "GET /leaky") { Array.new(300) { "k" * 80 } }
        GC.start # in use from now on (see Collector::INUSE_AS_OF)
        data = %i[class_frame drop].map { |shape| collector.flush(sample_labels: shape) }
        collector.stop!
        data.each do |flushed|
          profile = parse_profile(flushed)
          expect(sums_by_label(profile, "endpoint", "inuse_objects")["GET /leaky"]).to be >= 300
          expect(profile.samples.flat_map(&:labels).map(&:key).uniq).to eq(["endpoint"])
        end
        out, err, status = go_pprof(data.last, "-top", "-sample_index=inuse_objects", "-tagfocus=endpoint=GET /leaky")
        expect(status).to be_success, err
        expect(out).to match(/Showing nodes accounting for [3-9]\d\d, /)
        expect(kept.size).to eq(300)
      end
    end
  end

  it "has the CLI's top and diff --by endpoint name the endpoint whose objects stay alive" do
    Dir.mktmpdir("labels") do |dir|
      _out, err, status = run_ruby(<<~RUBY, args: [dir])
        require "memprofiler_pprof_rs"
        collector = MemprofilerPprof::Collector.new(sample_rate: 0.1, seed: 7)
        collector.start!
        leak = []
        3.times do |i|
          500.times do
            MemprofilerPprof.with_labels(endpoint: "GET /leaky") { leak << "l" * 200; 10.times { "t" * 200 } }
            MemprofilerPprof.with_labels(endpoint: "GET /clean") { 20.times { "c" * 200 } }
          end
          GC.start
          File.binwrite(File.join(ARGV[0], "heap-\#{i}.pprof"), collector.flush.pprof_data)
        end
      RUBY
      expect(status).to be_success, err
      exe = File.join(PROJECT_ROOT, "exe/memprofiler_pprof_rs")
      lib = File.join(PROJECT_ROOT, "lib")
      files = (0..2).map { |i| File.join(dir, "heap-#{i}.pprof") }
      out, err, status = Open3.capture3(RbConfig.ruby, "-I", lib, exe, "top", files.last, "--by", "endpoint")
      expect(status).to be_success, err
      rows = out.lines.grep(/GET /)
      expect(rows.first).to include("GET /leaky")
      expect(out).to include("values of label endpoint")
      out, err, status = Open3.capture3(RbConfig.ruby, "-I", lib, exe, "diff", *files, "--by", "endpoint")
      expect(status).to be_success, err
      verdict = %r{^By endpoint: GET /leaky grew most, \+\d+(\.\d+)? kB, \d+(\.\d)?% of the growth, up in 2 of 2 intervals\.$}
      expect(out).to match(verdict)
      expect(out).to include("Growth by label endpoint")
      _out, err, status = Open3.capture3(RbConfig.ruby, "-I", lib, exe, "diff", *files, "--by", "tenant")
      expect(status.exitstatus).to eq(1)
      expect(err).to include('the first profile: no sample has a label "tenant" (the profile\'s labels: class, endpoint)')
      _out, err, status = Open3.capture3(RbConfig.ruby, "-I", lib, exe, "top", files.last, "--by", "gc_age")
      expect(status.exitstatus).to eq(1)
      expect(err).to include('label "gc_age" holds numbers; --by groups by a label\'s string values')
    end
  end

  it "adds no label and interns no set while the app sets none" do
    out, err, status = run_ruby(<<~RUBY)
      require "memprofiler_pprof_rs"
      profile = MemprofilerPprof::PprofReader.parse(MemprofilerPprof::Collector.new(sample_rate: 1.0).profile { Array.new(100) { "x" * 10 } }.pprof_data)
      p [MemprofilerPprof::Labels.count, profile.samples.flat_map(&:labels).map(&:key).uniq.sort]
    RUBY
    expect(status).to be_success, err
    expect(out.strip).to eq('[0, ["class", "gc_age"]]')
  end
end
