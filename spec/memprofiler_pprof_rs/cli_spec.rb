# frozen_string_literal: true

require "fileutils"

# The `memprofiler_pprof_rs` executable (top, diff, flamegraph, merge) and
# MemprofilerPprof::Profile, which it is built on.
#
# Golden files: reports on profiles written by PprofWriter (exact samples, so
# the same bytes on every Ruby). After an intended change of format, rewrite
# them with UPDATE_GOLDEN=1 rspec spec/memprofiler_pprof_rs/cli_spec.rb and review the diff.
RSpec.describe "memprofiler_pprof_rs executable" do
  EXE = File.join(PROJECT_ROOT, "exe/memprofiler_pprof_rs")
  GOLDEN_DIR = File.join(SPEC_ROOT, "fixtures/golden")
  GO_FIXTURES = File.join(SPEC_ROOT, "fixtures/other_tools")
  TYPES = [%w[alloc_objects count], %w[alloc_space bytes], %w[inuse_objects count], %w[inuse_space bytes]].freeze
  T0 = 1_796_000_000 * 1_000_000_000 # 2026-11-30 00:53:20 UTC

  RACK = "/usr/local/bundle/gems/rack-3.0.8/lib/rack/builder.rb"
  AS_CACHE = "/usr/local/bundle/gems/activesupport-7.1.3/lib/active_support/cache.rb"
  JSON_RB = "/usr/lib/ruby/3.1.0/json/common.rb"

  # A shop's heap at minute `minute` (0, 1, 2): sessions leak (grow every
  # minute), the catalog is steady, the cache goes up and down.
  def shop_profile(minute)
    leaked = 1_048_576 * (minute + 1)
    noise = [100_000, 400_000, 200_000][minute]
    checkout = ["ShopController#checkout", "/srv/shop/app/controllers/shop_controller.rb", 30, 28]
    index = ["ShopController#index", "/srv/shop/app/controllers/shop_controller.rb", 12, 10]
    rack = ["Rack::Builder#call", RACK, 260, 258]
    catalog = ["Catalog#load", "/srv/shop/app/models/catalog.rb", 8, 6]
    samples = [
      { stack: [["String#*", "/srv/shop/app/models/session_store.rb", 14, 0],
                ["SessionStore#remember", "/srv/shop/app/models/session_store.rb", 14, 12], checkout, rack],
        values: [2_000 * (minute + 1), leaked, 2_000 * (minute + 1), leaked], class: "String" },
      { stack: [["Array#map", "/srv/shop/app/models/catalog.rb", 8, 0], catalog, index, rack],
        values: [5_000, 900_000, 4_000, 800_000], class: "Array" },
      { stack: [["Hash#merge", AS_CACHE, 400, 0], ["ActiveSupport::Cache::Store#fetch", AS_CACHE, 400, 380], index, rack],
        values: [3_000, 3_000_000, 100, noise], class: "Hash" },
      { stack: [["JSON::Ext::Parser#parse", JSON_RB, 216, 0], ["JSON.parse", JSON_RB, 216, 210], catalog, index, rack],
        values: [600, 60_000, 500, 50_000], class: "Hash" },
      # Temporaries: allocated, already freed (no in-use value).
      { stack: [["Integer#to_s", "/srv/shop/app/views/render.rb", 3, 0], ["View#render", "/srv/shop/app/views/render.rb", 3, 1],
                index, rack],
        values: [40_000, 1_600_000, 0, 0], class: "String" }
    ]
    PprofWriter.build(
      sample_types: TYPES, samples: samples, time_nanos: T0 + minute * 60_000_000_000,
      duration_nanos: 60_000_000_000, period: 100, period_type: %w[space bytes],
      comments: ["memprofiler_pprof_rs: sample_rate=0.01; one object in 100 sampled on average"],
      default_sample_type: "inuse_space"
    )
  end

  include_context "in a temporary directory"

  def write(name, bytes)
    File.binwrite(File.join(@dir, name), bytes)
    name
  end

  def cli(*args)
    out, err, status = Open3.capture3(RbConfig.ruby, EXE, *args, chdir: @dir)
    [out, err, status.exitstatus]
  end

  def expect_golden(name, actual)
    path = File.join(GOLDEN_DIR, name)
    if ENV["UPDATE_GOLDEN"] == "1"
      FileUtils.mkdir_p(GOLDEN_DIR)
      File.write(path, actual)
    end
    expect(actual).to eq(File.read(path)), "#{name} differs from #{path} (UPDATE_GOLDEN=1 rewrites it)"
  end

  def expect_one_line_error(err)
    expect(err.lines.size).to be <= 2, err
    expect(err).not_to match(/\.rb:\d+:in |from .*\.rb:\d+/), "stack trace in: #{err}"
  end

  describe "top" do
    before { 3.times { |m| write("shop-#{m}.pprof", shop_profile(m)) } }

    {
      "top_by_function.txt" => ["shop-2.pprof"],
      "top_by_line.txt" => ["shop-2.pprof", "--by", "line", "-n", "5"],
      "top_by_gem_alloc_space.txt" => ["shop-2.pprof", "--by", "gem", "-i", "alloc_space"],
      "top_by_class_inuse_objects.txt" => ["shop-2.pprof", "--by", "class", "--sample-index", "inuse_objects"],
      "top_by_file_cum.txt" => ["shop-2.pprof", "--by", "file", "--cum"],
      "top_focus.txt" => ["shop-2.pprof", "--focus", "Catalog#", "-i", "alloc_space"]
    }.each do |golden, args|
      it "prints #{golden.delete_suffix('.txt').tr('_', ' ')} (golden)" do
        out, err, status = cli("top", *args)
        expect([err, status]).to eq(["", 0])
        expect_golden(golden, out)
      end
    end

    it "agrees with go tool pprof -top on flat and cum" do
      out, _err, status = cli("top", "shop-2.pprof", "-n", "0", "-i", "alloc_objects")
      expect(status).to eq(0)
      go_out, _go_err, go_status = go_pprof(shop_profile(2), "-top", "-sample_index=alloc_objects",
                                            "-nodecount=100", "-nodefraction=0")
      expect(go_status).to be_success
      # Ours prints 18.6k where Go prints 18600: compare as numbers (3 digits).
      number = ->(text) { text.end_with?("k") ? text.to_f * 1000 : text.to_f }
      ours = out.lines.grep(/^\s*\d/).to_h do |line|
        fields = line.split
        [line.split(/\s{2,}/).last.strip, [number[fields[0]], number[fields[3]]]]
      end
      go_rows = go_out.lines.grep(/^\s*\d/).to_h do |l|
        f = l.split
        [f[5..].join(" "), [f[0].to_f, f[3].to_f]]
      end
      expect(ours.keys).to match_array(go_rows.keys)
      go_rows.each do |name, (flat, cum)|
        expect(ours[name][0]).to be_within(flat * 0.005).of(flat), name
        expect(ours[name][1]).to be_within(cum * 0.005).of(cum), name
      end
    end
  end

  describe "diff" do
    before { 3.times { |m| write("shop-#{m}.pprof", shop_profile(m)) } }

    it "names the top growing allocation site between two profiles (golden)" do
      out, err, status = cli("diff", "shop-0.pprof", "shop-2.pprof")
      expect([err, status]).to eq(["", 0])
      expect_golden("diff_two.txt", out)
    end

    it "tells steady growth from noise across several profiles, sorted by their time (golden)" do
      out, err, status = cli("diff", "shop-2.pprof", "shop-0.pprof", "shop-1.pprof")
      expect([err, status]).to eq(["", 0])
      expect_golden("diff_three.txt", out)
      expect(out.lines.grep(/^Verdict/).first)
        .to start_with("Verdict: likely leak: String#* in SessionStore#remember at /srv/shop/app/models/session_store.rb:14 " \
                       "grew in all 2 intervals")
    end

    it "compares in the given order with --keep-order" do
      out, _err, status = cli("diff", "--keep-order", "shop-2.pprof", "shop-0.pprof")
      expect(status).to eq(0)
      expect(out).to include("Verdict: no growth: inuse_space went from")
    end
  end

  describe "flamegraph" do
    before { write("shop-2.pprof", shop_profile(2)) }

    it "writes a self-contained HTML page with the frames" do
      _out, err, status = cli("flamegraph", "shop-2.pprof", "-o", "shop.html")
      expect(status).to eq(0), err
      html = File.read(File.join(@dir, "shop.html"))
      expect(html).to include("SessionStore#remember", "Catalog#load")
      # Nothing fetched: no external script, stylesheet, image or font.
      expect(html).not_to match(/<script[^>]+src=|<link[^>]+href="(?!data:)|<img|url\(|@import/)
      expect(html.scan(%r{https?://[^"' ]+}).uniq - ["http://www.w3.org/2000/svg"]).to eq([])
    end

    it "writes an SVG with --format svg (and for a .svg name)" do
      _out, err, status = cli("flamegraph", "shop-2.pprof", "-o", "shop.svg")
      expect(status).to eq(0), err
      svg = File.read(File.join(@dir, "shop.svg"))
      expect(svg).to start_with("<?xml").or start_with("<svg")
      expect(svg).to include("SessionStore#remember")
    end
  end

  describe "merge" do
    it "adds up profiles into one that go tool pprof reads" do
      write("a.pprof", shop_profile(0))
      write("b.pprof", shop_profile(2))
      _out, err, status = cli("merge", "a.pprof", "b.pprof", "-o", "all.pprof")
      expect(status).to eq(0), err
      expect(err).to include("merged 2 profiles")
      merged = MemprofilerPprof::Profile.read(File.join(@dir, "all.pprof"))
      a = MemprofilerPprof::Profile.parse(shop_profile(0))
      b = MemprofilerPprof::Profile.parse(shop_profile(2))
      expect(merged.totals).to eq(a.totals.merge(b.totals) { |_k, x, y| x + y })
      # Same stacks were added up (5 stacks in each, the same 5), and the
      # class labels survived.
      expect(merged.samples_count).to eq(a.samples_count)
      by_class = ->(profile) { profile.top(by: :class, limit: 0, sample_index: "alloc_space").lines.grep(/%  \S+$/) }
      expect(by_class[merged].map { |l| l.split.last }).to eq(%w[String Hash Array])
      expect(merged.top(by: :class, sample_index: "alloc_space")).to include("String")
      _go_out, go_err, go_status = go_pprof(File.binread(File.join(@dir, "all.pprof")), "-top")
      expect(go_status).to be_success, go_err
    end

    it "refuses profiles of different kinds" do
      write("a.pprof", shop_profile(0))
      write("cpu.pprof", PprofWriter.build(sample_types: [%w[cpu nanoseconds]], samples: []))
      _out, err, status = cli("merge", "a.pprof", "cpu.pprof", "-o", "all.pprof")
      expect(status).to eq(1)
      expect(err).to include("cpu.pprof has sample types cpu/nanoseconds but a.pprof has ")
      expect(File.exist?(File.join(@dir, "all.pprof"))).to be(false)
    end

    # Found by a reviewer: with files folded in as memory allows, the merge's
    # own message counted from the last fold ("profile 2" for the sixth).
    it "names the file of another kind however the files are folded" do
      5.times { |k| write("s#{k}.pprof", shop_profile(k % 3)) }
      write("t.pprof", PprofWriter.build(sample_types: [%w[alloc_space bytes]], samples: []))
      files = %w[s0.pprof s1.pprof s2.pprof s3.pprof t.pprof s4.pprof]
      _out, err, status = cli("merge", *files, "-o", "all.pprof", "--memory-limit", "1")
      expect(status).to eq(1)
      expect(err).to include("t.pprof has sample types alloc_space/bytes but s0.pprof has ")
    end

    it "refuses standard input redirected from a file it also names" do
      write("a.pprof", shop_profile(0))
      out, err, status = Open3.capture3(RbConfig.ruby, EXE, "merge", "a.pprof", "-", "-o", "all.pprof",
                                        chdir: @dir, stdin_data: "")
      expect(status.exitstatus).to eq(1), out + err # a pipe: read, and found empty
      _out, err, status = Open3.capture3("#{RbConfig.ruby} #{EXE} merge a.pprof - -o all.pprof < a.pprof", chdir: @dir)
      expect(status.exitstatus).to eq(2)
      expect(err).to include("standard input is a.pprof again (the same file; it would count twice)")
    end
  end

  describe "on real profiles from a collector" do
    it "finds the leaking method from three flushes of a leaking process" do
      code = <<~RUBY
        class LeakySpecCache
          def initialize; @items = []; end
          def remember(n) = n.times { @items << ("x" * 2_000) }
        end
        def noise = 2_000.times.map { |i| "tmp" * (i % 10) }
        cache = LeakySpecCache.new
        collector = MemprofilerPprof::Collector.new(sample_rate: 0.1)
        collector.start!
        3.times do |i|
          cache.remember(3_000)
          noise
          GC.start # (a busy process's GCs): in-use is as of the last one
          collector.flush.write(File.join(ARGV[0], "real-\#{i}.pprof"))
          sleep 0.01
        end
      RUBY
      _out, err, status = run_ruby("require 'memprofiler_pprof_rs'\n#{code}", args: [@dir])
      expect(status).to be_success, err
      out, err, status = cli("diff", "real-0.pprof", "real-1.pprof", "real-2.pprof")
      expect(status).to eq(0), err
      verdict = out.lines.grep(/^Verdict:/).first
      expect(verdict).to include("likely leak:", "LeakySpecCache#remember")
      out, _err, status = cli("top", "real-2.pprof", "-n", "6", "--cum")
      expect(status).to eq(0)
      row = out.lines.grep(/  LeakySpecCache#remember$/).first
      cum_percent = row.split.grep(/\A[\d.]+%\z/).last # (the ± columns begin with ±)
      expect(cum_percent.to_f).to be > 90, out # cum%: nearly all that is alive
      expect(row).to match(/ ±\d+%  LeakySpecCache#remember$/), out # how sure, from the profile
      out, _err, status = cli("top", "real-2.pprof", "--by", "line", "-n", "1")
      expect(status).to eq(0)
      expect(out.lines.last).to end_with("String#* -e:4\n") # the line in #remember
    end
  end

  describe "profiles from other tools" do
    it "reads a Go heap profile written by Go's runtime/pprof" do
      out, err, status = cli("top", File.join(GO_FIXTURES, "go_heap.pprof"), "-i", "alloc_space", "-n", "5")
      expect(status).to eq(0), err
      expect(out).to include("Type: alloc_space (bytes)", "main.allocate")
    end

    it "reads a Go CPU profile (its own sample types)" do
      out, err, status = cli("top", File.join(GO_FIXTURES, "go_cpu.pprof"), "-n", "5")
      expect(status).to eq(0), err
      expect(out).to include("Type: cpu (nanoseconds)", "main.spin")
      _out, err, status = cli("top", File.join(GO_FIXTURES, "go_cpu.pprof"), "-i", "inuse_space")
      expect(status).to eq(1)
      expect(err).to include('has no sample type "inuse_space"; it has samples, cpu')
      expect_one_line_error(err)
    end

    it "reads a Datadog-style Ruby heap profile, classes from its 'allocation class' label" do
      samples = [
        { stack: [["Foo#bar", "/app/foo.rb", 3, 1]], values: [10, 4, 4_000], class: "Foo" },
        { stack: [["Foo#baz", "/app/foo.rb", 9, 7]], values: [5, 2, 600], class: "String" }
      ]
      bytes = PprofWriter.build(sample_types: [%w[alloc-samples count], %w[heap-live-samples count], %w[heap-live-size bytes]],
                                samples: samples, class_key: "allocation class")
      write("dd.pprof", bytes)
      out, err, status = cli("top", "dd.pprof", "--by", "class")
      expect(status).to eq(0), err
      expect(out).to include("Type: heap-live-size (bytes)")
      expect(out.lines.grep(/Foo$|String$/).map { |l| l.split.last }).to eq(%w[Foo String])
    end
  end

  describe "crafted and damaged profiles" do
    def raw_shop
      Zlib.gunzip(shop_profile(2))
    end

    def expect_clean_exit(name, *args)
      _out, err, status = cli(*args)
      expect([0, 1]).to include(status), "#{name}: exit #{status}: #{err}"
      expect(err).not_to include("panicked"), "#{name}: #{err}"
      expect_one_line_error(err) if status == 1
      [status, err]
    end

    it "refuses references that point nowhere, and survives huge values and deep stacks" do
      one = ->(stack, values) { [{ stack: stack, values: values, class: "String" }] }
      leaf = ["Deep#dive", "/app/deep.rb", 3, 1]
      files = {
        "drop_frames.pprof" => raw_shop + PprofWriter.field_varint(7, 999),
        "keep_frames.pprof" => raw_shop + PprofWriter.field_varint(8, 10**9),
        "default_type.pprof" => raw_shop + PprofWriter.field_varint(14, 10**6),
        # Three samples of 2**62: their sum does not fit in an i64.
        "huge.pprof" => PprofWriter.build(sample_types: TYPES,
                                          samples: %w[A#a B#b C#c].flat_map { |n| one[[[n, "/h.rb", 1, 1]], [2**62] * 4] }),
        "deep.pprof" => PprofWriter.build(sample_types: TYPES, samples: one[[leaf] * 200_000, [1, 100, 1, 100]]),
        # 50 million empty strings: 100 MB of protobuf, 230 kB gzipped.
        "bomb.pprof" => PprofWriter.gzip(raw_shop + (PprofWriter.message(6, "".b) * 50_000_000))
      }
      files.each { |name, bytes| write(name, bytes) }
      %w[drop_frames keep_frames default_type].each do |name|
        status, err = expect_clean_exit(name, "top", "#{name}.pprof")
        expect(status).to eq(1)
        expect(err).to include("malformed pprof profile")
      end
      # Sums saturate at i64::MAX instead of wrapping to negative numbers.
      write("huge2.pprof", files["huge.pprof"])
      expect(expect_clean_exit("huge merge", "merge", "huge.pprof", "huge2.pprof", "-o", "m.pprof").first).to eq(0)
      %w[huge.pprof m.pprof].each do |name|
        out, err, status = cli("top", name)
        expect(status).to eq(0), err
        expect(out.lines.grep(/^\s*-\d|total \(-/)).to eq([]), out
        expect(out).to include("8.00 EB").or include("8388608 TB")
      end
      %w[top diff flamegraph].each do |command|
        args = { "top" => ["deep.pprof"], "diff" => ["deep.pprof", "huge.pprof"],
                 "flamegraph" => ["deep.pprof", "-o", "deep.html"] }[command]
        status, err = expect_clean_exit("deep #{command}", command, *args)
        expect(status).to eq(0), err
      end
      expect(File.size(File.join(@dir, "deep.html"))).to be < 2_000_000
      status, err = expect_clean_exit("bomb", "top", "bomb.pprof")
      expect(status).to eq(1)
      expect(err).to include("would take about").and include("refusing to read it")
    end

    it "never crashes or raises anything but ProfileFormatError on damaged bytes" do
      raw = raw_shop
      random = Random.new(RSpec.configuration.seed)
      outcomes = Hash.new(0)
      400.times do
        bytes = raw.dup
        (1 + random.rand(4)).times { bytes.setbyte(random.rand(bytes.bytesize), random.rand(256)) }
        bytes = bytes.byteslice(0, random.rand(bytes.bytesize)) if random.rand(4).zero?
        begin
          profile = MemprofilerPprof::Profile.parse(random.rand(2).zero? ? bytes : PprofWriter.gzip(bytes))
          profile.top(by: %i[function line class file gem].sample(random: random))
          profile.flamegraph(format: :svg)
          if profile.sample_type_names.include?("alloc_objects")
            MemprofilerPprof::Profile.diff([profile, MemprofilerPprof::Profile.parse(shop_profile(0))],
                                           sample_index: "alloc_objects")
          end
          outcomes[:read] += 1
        rescue MemprofilerPprof::ProfileFormatError
          outcomes[:refused] += 1
        rescue ArgumentError => e
          raise unless e.message.include?("no sample type")

          outcomes[:other_types] += 1
        end
      end
      expect(outcomes[:read] + outcomes[:refused] + outcomes[:other_types]).to eq(400)
      expect(outcomes[:refused]).to be > 0
    end
  end

  describe "bad input" do
    it "says what is wrong with a file that is not a profile, with exit status 1 and no stack trace" do
      gz = shop_profile(0)
      cases = {
        "empty.pprof" => ["", "the file is empty"],
        "notes.txt" => ["remember to buy milk\n" * 5, "not a pprof profile"],
        "truncated.pprof" => [gz[0, gz.bytesize / 2], "truncated gzip data"],
        "twice.pprof" => [gz + gz, "unexpected data after the end of the gzip stream"],
        "garbage.gz" => [PprofWriter.gzip("\xff\xfe\x00garbage".b * 10), "not a pprof profile"],
        "image.png" => ["\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR".b, "not a pprof profile"]
      }
      cases.each do |name, (bytes, message)|
        write(name, bytes)
        _out, err, status = cli("top", name)
        expect(status).to eq(1), "#{name}: #{err}"
        expect(err).to start_with("memprofiler_pprof_rs: #{name}: ").and(include(message)), "#{name}: #{err}"
        expect_one_line_error(err)
      end
    end

    it "reports a missing file or a directory the same way" do
      _out, err, status = cli("top", "nope.pprof")
      expect(status).to eq(1)
      expect(err).to include("No such file or directory").and include("nope.pprof")
      expect_one_line_error(err)
      _out, err, status = cli("top", ".")
      expect(status).to eq(1)
      expect(err).to include("Is a directory")
      expect_one_line_error(err)
    end

    it "treats usage mistakes as usage errors (exit 2)" do
      write("a.pprof", shop_profile(0))
      [
        [["frobnicate"], "unknown command"],
        [["top"], "top needs a profile file"],
        [["top", "a.pprof", "--by", "no-such"], "invalid argument: --by no-such"],
        [["top", "a.pprof", "--limit", "-3"], "--limit must be 0 or more"],
        [["top", "a.pprof", "--limit", "many"], "invalid argument: --limit many"],
        [["top", "a.pprof", "--limit", "99999999999999999999"], "--limit must be at most 1000000000"],
        [["top", "a.pprof", "--focus", "("], "is not a valid regular expression"],
        [["top", "a.pprof", "a.pprof"], "top reads one profile"],
        [["diff", "a.pprof"], "diff needs at least 2 profile files"],
        [["flamegraph", "a.pprof"], "flamegraph needs -o OUTPUT"],
        [["merge", "a.pprof"], "merge needs -o OUTPUT"],
        [["top", "a.pprof", "--colour"], "invalid option: --colour"]
      ].each do |args, message|
        _out, err, status = cli(*args)
        expect(status).to eq(2), "#{args.join(' ')}: #{err}"
        expect(err).to include(message), "#{args.join(' ')}: #{err}"
        expect_one_line_error(err)
      end
    end

    it "fails with exit status 1 when its output cannot be written" do
      write("a.pprof", shop_profile(0))
      out, err, status = Open3.capture3("#{RbConfig.ruby} #{EXE} top a.pprof > /dev/full", chdir: @dir)
      expect(out).to eq("")
      expect(status.exitstatus).to eq(1)
      expect(err).to include("No space left on device")
      expect_one_line_error(err)
    end

    it "reads standard input for -, writes standard output for -o -, and never overwrites its input" do
      write("a.pprof", shop_profile(2))
      out, err, status = Open3.capture3(RbConfig.ruby, EXE, "top", "-", stdin_data: shop_profile(2), chdir: @dir)
      expect(status).to be_success, err
      expect(out).to start_with("File: (standard input)\n")
      out, _err, status = cli("flamegraph", "a.pprof", "-o", "-", "--format", "svg")
      expect(status).to eq(0)
      expect(out).to include("<svg", "SessionStore#remember")
      _out, err, status = cli("flamegraph", "a.pprof", "-o", "a.pprof")
      expect(status).to eq(2)
      expect(err).to include("-o a.pprof is the input profile a.pprof")
      expect(MemprofilerPprof::Profile.read(File.join(@dir, "a.pprof")).samples_count).to eq(5)
      _out, err, status = cli("merge", "a.pprof", "a.pprof", "-o", "m.pprof")
      expect(status).to eq(2)
      expect(err).to include("a.pprof is given twice")
    end

    # Issue 36, item 9: `diff a.pprof ./a.pprof` compared a profile with
    # itself, and `merge` counted one file twice, because only identical
    # spellings were caught.
    it "refuses one file named twice under other names, in diff and merge, with one line" do
      write("a.pprof", shop_profile(0))
      write("b.pprof", shop_profile(2))
      FileUtils.mkdir(File.join(@dir, "sub"))
      File.symlink("a.pprof", File.join(@dir, "link.pprof"))
      File.link(File.join(@dir, "a.pprof"), File.join(@dir, "hard.pprof"))
      [
        [%w[diff a.pprof ./a.pprof], "./a.pprof is a.pprof again"],
        [%w[diff a.pprof b.pprof sub/../a.pprof], "sub/../a.pprof is a.pprof again"],
        [["diff", File.join(@dir, "a.pprof"), "b.pprof", "link.pprof"], "link.pprof is #{File.join(@dir, 'a.pprof')} again"],
        [%w[merge b.pprof hard.pprof a.pprof -o m.pprof], "a.pprof is hard.pprof again"]
      ].each do |args, message|
        out, err, status = cli(*args)
        expect(status).to eq(2), "#{args.join(' ')}: #{err}"
        expect(out).to eq("")
        expect(err.lines.first).to eq("memprofiler_pprof_rs: #{message} (the same file; it would count twice)\n")
        expect_one_line_error(err)
      end
      expect(File.exist?(File.join(@dir, "m.pprof"))).to be(false)
      # A copy is another file: compared (and merged) as one.
      write("copy.pprof", shop_profile(0))
      out, err, status = cli("diff", "a.pprof", "copy.pprof")
      expect(status).to eq(0), err
      expect(out).to include("copy.pprof")
    end

    it "rejects an unknown sample type naming the ones there are" do
      write("a.pprof", shop_profile(0))
      _out, err, status = cli("top", "a.pprof", "-i", "cpu")
      expect(status).to eq(1)
      expect(err).to include('no sample type "cpu"; it has alloc_objects, alloc_space, inuse_objects, inuse_space')
    end
  end

  describe "help" do
    it "lists the commands, each with examples" do
      out, _err, status = cli("--help")
      expect(status).to eq(0)
      expect(out).to include("top", "diff", "flamegraph", "merge")
      %w[top diff flamegraph merge].each do |command|
        help, _err, status = cli(command, "--help")
        expect(status).to eq(0)
        expect(help).to include("usage: memprofiler_pprof_rs #{command}", "Examples:")
        expect(help.scan(/^\s+memprofiler_pprof_rs #{command} /).size).to be >= 2
      end
    end

    it "prints usage on stderr with no command (exit 2)" do
      _out, err, status = cli
      expect(status).to eq(2)
      expect(err).to include("usage: memprofiler_pprof_rs COMMAND")
    end
  end
end
