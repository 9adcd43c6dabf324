# frozen_string_literal: true

require "bigdecimal"
require "pathname"
require "timeout"

# Hostile and careless use of the public API: wrong types, absurd numbers,
# subclasses, calls at the wrong moment or from the wrong place (finalizers,
# signal traps), and names that are not UTF-8. Every case must end in a
# clear exception naming the bad value or in a defined, asserted result;
# never a crash or a hang (risky cases run in a subprocess with a deadline).
RSpec.describe "Hostile and careless use" do
  # Objects that pretend to be numbers without being Numeric.
  let(:int_like) do
    Class.new do
      def to_int = 5
      def to_i = 5
      def inspect = "#<IntLike>"
    end.new
  end
  let(:float_like) do
    Class.new do
      def to_f = 0.5
      def inspect = "#<FloatLike>"
    end.new
  end
  let(:string_subclass) { Class.new(String).new("0.5") }

  # Values no numeric option may accept, with the exception each gets.
  def wrong_types
    { nil => TypeError, "0.5" => TypeError, :x => TypeError, true => TypeError,
      Object.new => TypeError, [0.5] => TypeError, Complex(0.5, 0) => TypeError,
      string_subclass => TypeError, int_like => TypeError, float_like => TypeError }
  end

  # The message of a refusal names the option and shows the value.
  # The gem's rule (MemprofilerPprof::Validation): a value of the wrong kind
  # is a TypeError, one of the right kind but unusable an ArgumentError.
  def refusal_for(value, kind)
    right_kind = case kind
                 when :integer then value.is_a?(Integer)
                 when :number then value.is_a?(Numeric) && value.real?
                 when :string then value.is_a?(String)
                 end
    right_kind ? ArgumentError : TypeError
  end

  def expect_refusal(error_class, name, value, &block)
    expect(&block).to raise_error(error_class) { |e|
      expect(e.message).to include(name.to_s), "#{e.message.inspect} does not name #{name}"
      expect(e.message).to include(value.inspect), "#{e.message.inspect} does not show #{value.inspect}"
    }
  end

  # Runs Ruby code in a fresh process, killing it after `deadline` seconds.
  # Returns [stdout, stderr, status or :timeout].
  def run_ruby_within(code, deadline: 20)
    lib = File.join(PROJECT_ROOT, "lib")
    Open3.popen3(RbConfig.ruby, "-I", lib, "-e", code) do |stdin, stdout, stderr, wait|
      stdin.close
      out_reader = Thread.new { stdout.read }
      err_reader = Thread.new { stderr.read }
      unless wait.join(deadline)
        Process.kill(:KILL, wait.pid)
        wait.join
        return [out_reader.value, err_reader.value, :timeout]
      end
      [out_reader.value, err_reader.value, wait.value]
    end
  end

  def expect_clean_exit(result)
    out, err, status = result
    expect(status).not_to eq(:timeout), "subprocess hung; stdout: #{out}\nstderr: #{err}"
    expect(status.exitstatus).to eq(0), "subprocess failed (#{status.inspect}): #{err}"
    expect(err).not_to match(/\[BUG\]|Segmentation|deadlock/i)
    out
  end

  describe MemprofilerPprof::Collector do
    describe "fraction options (sample_rate, allocation_retain_rate), in new and in the setters" do
      %i[sample_rate allocation_retain_rate].each do |name|
        it "#{name}: refuses non-numbers with a TypeError showing the value" do
          collector = described_class.new
          wrong_types.each do |value, error|
            expect_refusal(error, name, value) { described_class.new(name => value) }
            expect_refusal(error, name, value) { collector.public_send(:"#{name}=", value) }
          end
        end

        it "#{name}: refuses NaN, infinities, negatives and values above 1 with an ArgumentError" do
          collector = described_class.new
          [Float::NAN, Float::INFINITY, -Float::INFINITY, -1, -0.5, 1.5, 2**64, 10**30, Rational(3, 2),
           BigDecimal("1.5")].each do |value|
            expect_refusal(ArgumentError, name, value) { described_class.new(name => value) }
            expect_refusal(ArgumentError, name, value) { collector.public_send(:"#{name}=", value) }
          end
          expect(collector.public_send(name)).to eq(name == :sample_rate ? 0.01 : 1.0) # unchanged
        end

        it "#{name}: accepts any real number in 0..1 (Integer, Rational, BigDecimal, frozen) as a Float" do
          [[0, 0.0], [1, 1.0], [0.0, 0.0], [-0.0, 0.0], [Rational(1, 4), 0.25], [BigDecimal("0.5"), 0.5],
           [5e-324, 5e-324], [Rational(10**30, (10**30) + 1), 1.0], [0.5, 0.5]].each do |value, expected|
            collector = described_class.new(name => value)
            expect(collector.public_send(name)).to eql(expected)
            collector.public_send(:"#{name}=", value)
            expect(collector.public_send(name)).to eql(expected)
          end
          expect(described_class.new(name => -0.0).public_send(name).to_s).to eq("0.0") # not -0.0
        end
      end
    end

    it "tiny sample rates (down to the smallest denormal) sample next to nothing, not everything" do
      [5e-324, 1e-300, 1e-18].each do |rate|
        collector = described_class.new(sample_rate: rate, seed: 1)
        data = collector.profile { 50_000.times { |i| i.to_s } }
        expect(data.allocation_samples_count).to eq(0), "sample_rate #{rate}"
        expect(parse_profile(data).total("alloc_objects")).to eq(0)
      end
    end

    describe "count options (max_allocation_samples, max_heap_samples) and seed" do
      %i[max_allocation_samples max_heap_samples].each do |name|
        it "#{name}: refuses Floats, non-numbers and Integer-likes with a TypeError showing the value" do
          collector = described_class.new
          (wrong_types.keys + [1.5, 0.0, -0.0, Float::NAN, Float::INFINITY, -Float::INFINITY, Rational(1, 1),
                               BigDecimal("10")]).each do |value|
            expect_refusal(TypeError, name, value) { described_class.new(name => value) }
            expect_refusal(TypeError, name, value) { collector.public_send(:"#{name}=", value) }
          end
        end

        it "#{name}: refuses negatives with an ArgumentError; 0 and huge values are caps" do
          collector = described_class.new
          [-1, -(2**64)].each do |value|
            expect_refusal(ArgumentError, name, value) { described_class.new(name => value) }
            expect_refusal(ArgumentError, name, value) { collector.public_send(:"#{name}=", value) }
          end
          expect(described_class.new(name => 0).public_send(name)).to eq(0)
          [2**64, 10**30, 2**62].each do |value|
            expect(described_class.new(name => value).public_send(name)).to eq(described_class::MAX_CAP)
          end
        end
      end

      it "a cap of 0 samples nothing, counts the drops, and still flushes a valid profile" do
        collector = described_class.new(sample_rate: 1.0, max_allocation_samples: 0, max_heap_samples: 0)
        data = collector.profile { Array.new(100) { |i| i.to_s } }
        expect(data.allocation_samples_count).to eq(0)
        expect(data.dropped_samples_allocation_bufsize + data.dropped_samples_heap_bufsize).to be > 0
        expect(parse_profile(data).sample_type_names.size).to eq(4)
      end

      it "seed: nil or 0..MAX_CAP; other values are refused naming them" do
        (wrong_types.keys.compact + [1.5, Float::NAN, Float::INFINITY]).each do |value|
          expect_refusal(TypeError, :seed, value) { described_class.new(seed: value) }
        end
        [-1, 2**64, 10**30, described_class::MAX_CAP + 1].each do |value|
          expect_refusal(ArgumentError, :seed, value) { described_class.new(seed: value) }
        end
        expect { described_class.new(seed: 0) }.not_to raise_error
        expect { described_class.new(seed: described_class::MAX_CAP) }.not_to raise_error
      end
    end

    describe "symbol options (bt_method, size_measurement)" do
      it "refuses anything but the listed symbols, naming the value" do
        collector = described_class.new
        (wrong_types.keys + ["cfp", "c_return", :CFP, 0, Float::NAN]).each do |value|
          expect_refusal(ArgumentError, :bt_method, value) { described_class.new(bt_method: value) }
          expect_refusal(ArgumentError, :bt_method, value) { collector.bt_method = value }
          expect_refusal(ArgumentError, :size_measurement, value) { described_class.new(size_measurement: value) }
          expect_refusal(ArgumentError, :size_measurement, value) { collector.size_measurement = value }
        end
        expect([collector.bt_method, collector.size_measurement]).to eq(%i[cfp postponed_job])
      end
    end

    it "refuses unknown keywords and positional arguments" do
      expect { described_class.new(sample_rte: 0.1) }.to raise_error(ArgumentError, /sample_rte/)
      expect { described_class.new(0.1) }.to raise_error(ArgumentError, /wrong number of arguments/)
      expect { described_class.new("sample_rate" => 0.1) }.to raise_error(ArgumentError)
    end

    describe "flush keywords" do
      let(:collector) { described_class.new }

      it "yield_gvl and proactively_yield_gvl take only true or false" do
        %i[yield_gvl proactively_yield_gvl].each do |name|
          [nil, 0, 1, "true", :true, Float::NAN, Object.new].each do |value| # rubocop:disable Lint/BooleanSymbol
            expect_refusal(TypeError, name, value) { collector.flush(name => value) }
          end
        end
      end

      it "max_profile_bytes and max_profile_samples take nil or a positive Integer; huge ones mean no limit" do
        %i[max_profile_bytes max_profile_samples].each do |name|
          [0, -1, 1.5, 1e9, Float::NAN, Float::INFINITY, -Float::INFINITY, "1000", int_like, Object.new].each do |value|
            expect_refusal(refusal_for(value, :integer), name, value) { collector.flush(name => value) }
          end
          [2**64, 10**30].each do |value|
            expect(parse_profile(collector.flush(name => value)).sample_type_names.size).to eq(4)
          end
        end
      end

      it "sample_labels takes only :keep, :class_frame or :drop" do
        [nil, "keep", :class, 0, 1, Object.new].each do |value|
          expect_refusal(ArgumentError, :sample_labels, value) { collector.flush(sample_labels: value) }
        end
        %i[keep class_frame drop].each do |value|
          expect(parse_profile(collector.flush(sample_labels: value)).sample_type_names.size).to eq(4)
        end
      end

      it "max_profile_bytes: 1 (impossible to meet) gives the smallest profile it can, still valid" do
        collector = described_class.new(sample_rate: 1.0)
        data = collector.profile(max_profile_bytes: 1) { Array.new(200) { |i| "x#{i}" } }
        profile = parse_profile(data)
        expect(data.folded_samples_count).to be > 0
        expect(profile.samples.size).to be <= 2
        expect(profile.total("alloc_objects")).to be >= 200 # totals unchanged
      end

      it "refuses unknown keywords and positional arguments, and profile passes bad keywords' errors through" do
        expect { collector.flush(yield: true) }.to raise_error(ArgumentError, /yield/)
        expect { collector.flush(true) }.to raise_error(ArgumentError, /wrong number of arguments/)
        expect { collector.profile(max_profile_bytes: -1) { nil } }.to raise_error(ArgumentError, /-1/)
        expect(collector.running?).to be(false)
      end
    end

    describe "subclasses" do
      it "a subclass that calls super works like the class, and its instances are still refused copying" do
        subclass = Class.new(described_class) do
          def initialize(**options)
            super(sample_rate: 1.0, **options)
          end

          def flush(**options)
            super(**options, yield_gvl: false)
          end
        end
        collector = subclass.new(max_heap_samples: 10)
        data = collector.profile { Array.new(20) { |i| i.to_s } }
        expect(data.allocation_samples_count).to be >= 20
        expect(parse_profile(data).samples).not_to be_empty
        expect { collector.dup }.to raise_error(TypeError, /can't be copied/)
      end

      it "a subclass whose initialize forgets super still works, with the defaults" do
        careless = Class.new(described_class) do
          def initialize; end
        end
        collector = careless.new
        expect(collector.sample_rate).to eq(0.01)
        expect(collector.max_heap_samples).to eq(50_000)
        collector.sample_rate = 1.0
        data = collector.profile { Array.new(20) { |i| i.to_s } }
        expect(data.allocation_samples_count).to be >= 20
        expect(parse_profile(data).samples).not_to be_empty
      end

      it "an allocated but never initialized collector works with the defaults" do
        collector = described_class.allocate
        expect(collector.running?).to be(false)
        expect(collector.flush).to be_a(MemprofilerPprof::ProfileData)
      end

      it "native methods bound to foreign objects raise TypeError" do
        %i[sample_rate running? live_heap_samples_count].each do |name|
          expect { described_class.instance_method(name).bind_call(Object.new) }
            .to raise_error(TypeError, /Collector/)
        end
      end
    end

    describe "calls at the wrong moment" do
      it "flush before start! and after stop! return valid profiles; start!/stop! twice return false" do
        collector = described_class.new(sample_rate: 1.0)
        before = collector.flush
        expect(before.allocation_samples_count).to eq(0)
        expect(parse_profile(before).samples).to be_empty
        expect([collector.stop!, collector.start!, collector.start!]).to eq([false, true, false])
        kept = Array.new(30) { |i| "kept #{i}" }
        expect([collector.stop!, collector.stop!]).to eq([true, false])
        after = collector.flush
        expect(after.allocation_samples_count).to be >= 30 # what was collected stays flushable
        expect(parse_profile(after).samples).not_to be_empty
        expect(parse_profile(collector.flush).total("alloc_objects")).to eq(0) # already flushed
        expect(kept.size).to eq(30)
      end

      it "two collectors running at once each sample every allocation on their own" do
        first = described_class.new(sample_rate: 1.0)
        second = described_class.new(sample_rate: 1.0)
        expect([first.start!, second.start!]).to eq([true, true])
        Array.new(100) { |i| "both #{i}" }
        second.stop!
        Array.new(100) { |i| "first only #{i}" }
        first.stop!
        first_data = parse_profile(first.flush)
        second_data = parse_profile(second.flush)
        expect(second_data.total("alloc_objects")).to be >= 100
        expect(first_data.total("alloc_objects")).to be >= second_data.total("alloc_objects") + 100
      end

      it "two threads flushing one collector at once both get a complete profile, one after the other" do
        collector = described_class.new(sample_rate: 1.0, max_allocation_samples: 1_000_000)
        collector.start!
        kept = Array.new(20_000) { |i| "live #{i}" }
        GC.start # in use from now on (see Collector::INUSE_AS_OF)
        results = Array.new(2) do
          Thread.new { Array.new(3) { collector.flush(yield_gvl: true, proactively_yield_gvl: true) } }
        end.flat_map(&:value)
        collector.stop!
        expect(results.size).to eq(6)
        expect(results).to all(be_a(MemprofilerPprof::ProfileData))
        # Every allocation sample goes to exactly one flush; every flush sees the live objects.
        expect(results.map(&:heap_samples_count)).to all(be >= 20_000)
        expect(results.count { |r| r.allocation_samples_count >= 20_000 }).to eq(1)
        # Intervals do not overlap.
        intervals = results.map { |r| [r.started_at, r.finished_at] }.sort
        intervals.each_cons(2) { |(_, end1), (start2, _)| expect(start2).to be >= end1 }
        expect(kept.size).to eq(20_000)
      end

      it "start!/stop!/sample_rate= from another thread while a flush runs: all complete, counts stay sane" do
        collector = described_class.new(sample_rate: 1.0)
        collector.start!
        kept = Array.new(30_000) { |i| "live #{i}" }
        stop = false
        meddler = Thread.new do
          until stop
            collector.stop!
            collector.sample_rate = [0.0, 0.5, 1.0].sample
            collector.start!
            Thread.pass
          end
        end
        flushes = Array.new(5) { collector.flush(proactively_yield_gvl: true) }
        stop = true
        meddler.join
        collector.stop!
        expect(flushes).to all(be_a(MemprofilerPprof::ProfileData))
        flushes.each { |data| expect(parse_profile(data).sample_type_names.size).to eq(4) }
        expect(collector.internal_error_count).to eq(0)
        expect(kept.size).to eq(30_000)
      end
    end
  end

  describe "collectors in finalizers, signal traps and the garbage collector (subprocesses)" do
    it "a running collector dropped and garbage collected stops sampling without crashing" do
      out = expect_clean_exit(run_ruby_within(<<~RUBY))
        require "memprofiler_pprof_rs"
        def start_and_forget
          c = MemprofilerPprof::Collector.new(sample_rate: 1.0, size_measurement: :c_return)
          c.start!
          Array.new(5_000) { |i| "sampled \#{i}" } # live samples and pending measurements
          nil
        end
        3.times { start_and_forget }
        kept = []
        5.times do
          GC.start(full_mark: true, immediate_sweep: true)
          kept.concat(Array.new(20_000) { |i| [i.to_s] })
          GC.compact if GC.respond_to?(:compact)
        end
        hooks_left = TracePoint.stat.values.first&.first.to_i
        other = MemprofilerPprof::Collector.new(sample_rate: 1.0)
        data = other.profile { Array.new(100) { |i| i.to_s } }
        puts [hooks_left, data.allocation_samples_count >= 100].inspect
      RUBY
      expect(out).to eq("[0, true]\n")
    end

    it "flush, stop!, start! and sample_rate= from a finalizer work (or, inside a flush, raise clearly)" do
      out = expect_clean_exit(run_ruby_within(<<~RUBY))
        require "memprofiler_pprof_rs"
        $c = MemprofilerPprof::Collector.new(sample_rate: 1.0)
        $c.start!
        $results = []
        def register(n)
          ObjectSpace.define_finalizer(Object.new, proc do
            $results << begin
              d = $c.flush
              $c.sample_rate = 0.5
              ($c.stop! && $c.start!) if n.zero? # start! clears the live samples: once
              $c.sample_rate = 1.0
              "ok" if d.is_a?(MemprofilerPprof::ProfileData)
            rescue RuntimeError => e
              e.message.include?("already flushing") ? "refused" : e.inspect
            end
          end)
        end
        kept = Array.new(20_000) { |i| "live \#{i}" }
        200.times { |i| register(i); Array.new(50) { |j| j.to_s } }
        10.times { GC.start; $c.flush(proactively_yield_gvl: true) }
        GC.start
        sleep 0.1
        $c.stop!
        final = $c.flush
        puts [$results.size >= 100, ($results - ["ok", "refused"]).uniq, final.heap_samples_count > 0].inspect
      RUBY
      expect(out).to eq("[true, [], true]\n")
    end

    it "flush, stop!, start! and sample_rate= from a signal trap work, also when the trap interrupts a flush" do
      out = expect_clean_exit(run_ruby_within(<<~RUBY))
        require "memprofiler_pprof_rs"
        c = MemprofilerPprof::Collector.new(sample_rate: 1.0)
        c.start!
        kept = Array.new(30_000) { |i| "live \#{i}" }
        GC.start # in use from now on (see Collector::INUSE_AS_OF)
        results = []
        restart = true # only while idle: start! clears the live samples
        Signal.trap("USR1") do
          results << begin
            d = c.flush
            c.sample_rate = 0.5
            (c.stop! && c.start!) if restart
            c.sample_rate = 1.0
            d.heap_samples_count >= 30_000 ? "ok" : "empty"
          rescue RuntimeError => e
            e.message.include?("already flushing") ? "refused" : e.inspect
          end
        end
        Process.kill("USR1", Process.pid)
        sleep 0.1 until results.size == 1
        idle = results.dup
        restart = false
        kept += Array.new(30_000) { |i| "live again \#{i}" }
        GC.start
        signaller = Thread.new { 30.times { sleep 0.003; Process.kill("USR1", Process.pid) } }
        flushes = Array.new(8) { c.flush(proactively_yield_gvl: true) }
        signaller.join
        sleep 0.2
        Signal.trap("USR1") { results << [c.stop!, c.stop!] }
        Process.kill("USR1", Process.pid)
        sleep 0.1 until results.last.is_a?(Array)
        puts [idle, (results[1..-2] - ["ok", "refused"]).uniq, results.last, c.running?, flushes.size].inspect
      RUBY
      expect(out).to eq(%([["ok"], [], [true, false], false, 8]\n))
    end

    it "a signal trap that flushes while another thread flushes waits for it instead of failing" do
      out = expect_clean_exit(run_ruby_within(<<~RUBY))
        require "memprofiler_pprof_rs"
        c = MemprofilerPprof::Collector.new(sample_rate: 1.0, max_heap_samples: 1_000_000)
        c.start!
        kept = Array.new(50_000) { |i| "live \#{i}" }
        GC.start # in use from now on (see Collector::INUSE_AS_OF)
        got = nil
        Signal.trap("USR2") { got = c.flush.heap_samples_count }
        flusher = Thread.new { 5.times { c.flush(proactively_yield_gvl: true) } }
        sleep 0.001
        Process.kill("USR2", Process.pid)
        flusher.join
        sleep 0.05 until got
        puts got >= 50_000
      RUBY
      expect(out).to eq("true\n")
    end
  end

  describe "names that are not valid UTF-8" do
    # Defined form: pprof strings are UTF-8. A name in another encoding is
    # converted from it (ISO-8859-1 "caf\xE9" is "café"); bytes that are not
    # valid in their encoding, and the non-ASCII bytes of binary names, become
    # U+FFFD (one per invalid byte).
    before(:all) do
      module HostileUseNames; end
      HostileUseNames.const_set("Caf\xE9".dup.force_encoding(Encoding::ISO_8859_1), Class.new)
      HostileUseNames.const_set("Bin\xE9".b, Class.new)
      latin1 = "# -*- coding: iso-8859-1 -*-\n" \
               "class HostileUseNames::Caf\xE9; def caf\xE9_latin1 = 'latin1 ' * 3; end\n"
      eval(latin1.dup.force_encoding(Encoding::ISO_8859_1), nil, "/tmp/latin1_\xE9.rb".b, 1)
      binary = "# -*- coding: binary -*-\nmodule HostileUseNames; def self.m\xFF\xFEbin = 'binary ' * 3; end\n".b
      eval(binary, nil, "/tmp/\xFF\xFE.rb".b, 1)
      HostileUseNames.define_singleton_method("caf\xE9_defined".b) { "defined " * 3 }
    end

    let(:data) do
      latin1_class = HostileUseNames.const_get("Caf\xE9".dup.force_encoding(Encoding::ISO_8859_1))
      binary_class = HostileUseNames.const_get("Bin\xE9".b)
      MemprofilerPprof::Collector.new(sample_rate: 1.0).profile do
        @kept = [latin1_class.new.public_send(latin1_class.instance_methods(false).first),
                 HostileUseNames.public_send("m\xFF\xFEbin".b), binary_class.new, latin1_class.new,
                 HostileUseNames.public_send("caf\xE9_defined".b)]
      end
    end
    let(:profile) { parse_profile(data) } # also checked by go tool pprof

    it "every string of the profile is valid UTF-8" do
      expect(profile.strings).to all(satisfy { |s| s.encoding == Encoding::UTF_8 && s.valid_encoding? })
      expect(profile.samples).not_to be_empty
    end

    it "methods, classes and files named in ISO-8859-1 appear converted to UTF-8" do
      frames = profile.samples.flat_map(&:frames)
      expect(frames.map(&:name)).to include("HostileUseNames::Café#café_latin1")
      expect(frames.map(&:filename)).to include("/tmp/latin1_\uFFFD.rb") # a binary file name
      classes = profile.samples.flat_map { |s| s.labels.select { |l| l.key == "class" }.map(&:str) }
      expect(classes).to include("HostileUseNames::Café", "HostileUseNames::Bin\uFFFD")
    end

    it "binary method and file names appear with U+FFFD for each non-UTF-8 byte" do
      frames = profile.samples.flat_map(&:frames)
      expect(frames.map(&:name)).to include("HostileUseNames.m\uFFFD\uFFFDbin")
      expect(frames.map(&:filename)).to include("/tmp/\uFFFD\uFFFD.rb")
    end

    it "go tool pprof shows the names" do
      out, err, status = go_pprof(data, "-traces")
      expect(status.exitstatus).to eq(0), err
      expect(out).to include("HostileUseNames::Café#café_latin1", "HostileUseNames.m\uFFFD\uFFFDbin")
    end
  end

  describe MemprofilerPprof::ProfileData do
    it "new refuses a missing or non-String pprof_data and non-Integer counts, naming them" do
      expect { described_class.new }.to raise_error(ArgumentError, /pprof_data/)
      [nil, 1, :x, ["a"]].each do |value|
        expect_refusal(TypeError, :pprof_data, value) { described_class.new(pprof_data: value) }
      end
      [nil, -1, 1.5, "3"].each do |value|
        expect_refusal(refusal_for(value, :integer), :heap_samples_count, value) do
          described_class.new(pprof_data: "".b, heap_samples_count: value)
        end
      end
      expect_refusal(TypeError, :sample_rate, "0.1") { described_class.new(pprof_data: "".b, sample_rate: "0.1") }
      expect_refusal(TypeError, :started_at, 0) { described_class.new(pprof_data: "".b, started_at: 0) }
      expect_refusal(ArgumentError, :sample_labels, "keep") { described_class.new(pprof_data: "".b, sample_labels: "keep") }
      expect(described_class.new(pprof_data: "".b, sample_labels: :drop).sample_labels).to eq(:drop)
    end

    it "accepts a frozen String subclass and still inspects and writes it" do
      data = described_class.new(pprof_data: Class.new(String).new("abc").freeze)
      expect(data.inspect).to include("3 bytes of pprof", "no interval")
      Dir.mktmpdir do |dir|
        expect(File.binread(data.write(File.join(dir, "x.pprof")))).to eq("abc")
      end
    end

    describe "#write" do
      let(:data) { described_class.new(pprof_data: "pprof".b) }

      it "refuses paths that are not Strings or are empty, and an overwrite: that is not a boolean" do
        [nil, 1, :sym, Object.new].each do |value|
          expect_refusal(TypeError, :path, value) { data.write(value) }
        end
        expect { data.write("") }.to raise_error(ArgumentError, /empty/)
        Dir.mktmpdir do |dir|
          path = File.join(dir, "p.pprof")
          [nil, "no", 0].each do |value|
            expect_refusal(TypeError, :overwrite, value) { data.write(path, overwrite: value) }
          end
          expect(File.exist?(path)).to be(false)
        end
      end

      it "a NUL byte, a directory or an unwritable place raise the system's error naming the path" do
        expect { data.write("/tmp/a\0b") }.to raise_error(ArgumentError, /null byte/)
        Dir.mktmpdir do |dir|
          expect { data.write(dir) }.to raise_error(Errno::EISDIR, /#{Regexp.escape(dir)}/)
          expect(Dir.children(dir)).to be_empty # no temporary file left
        end
        expect { data.write("/proc/hostile.pprof") }.to raise_error(SystemCallError, %r{/proc/})
      end

      it "writes to a path with non-UTF-8 bytes, a Pathname, and a frozen String subclass" do
        Dir.mktmpdir do |dir|
          binary = File.join(dir, "caf\xE9.pprof").b
          expect(data.write(binary)).to eq(binary)
          expect(File.binread(binary)).to eq("pprof")
          expect(File.binread(data.write(Pathname(dir) / "p.pprof"))).to eq("pprof")
          subclassed = Class.new(String).new(File.join(dir, "s.pprof")).freeze
          expect(File.binread(data.write(subclassed))).to eq("pprof")
        end
      end
    end
  end

  describe MemprofilerPprof::BlockFlusher do
    let(:collector) { MemprofilerPprof::Collector.new }

    it "refuses a non-positive, non-finite or non-numeric interval and stop_timeout, naming them" do
      [nil, 0, -1, Float::NAN, Float::INFINITY, -Float::INFINITY, "30", int_like, float_like,
       Complex(1, 0)].each do |value|
        expect_refusal(refusal_for(value, :number), :interval, value) { described_class.new(collector, interval: value) }
      end
      [nil, -1, Float::NAN, Float::INFINITY, "10"].each do |value|
        expect_refusal(refusal_for(value, :number), :stop_timeout, value) { described_class.new(collector, stop_timeout: value) }
      end
    end

    it "huge intervals and timeouts are fine: start! and stop! return at once" do
      [2**64, 10**30, 1e300, Rational(1, 3)].each do |value|
        flusher = described_class.new(collector, interval: value, stop_timeout: value)
        Timeout.timeout(5) do
          expect(flusher.start!).to be(true)
          expect(flusher.stop!).to be(true)
        end
      end
    end

    it "refuses bad collectors, callbacks, loggers and flags, naming them" do
      expect_refusal(TypeError, :collector, nil) { described_class.new(nil) }
      expect_refusal(TypeError, :on_flush, 1) { described_class.new(collector, on_flush: 1) }
      expect_refusal(TypeError, :logger, "log") { described_class.new(collector, logger: "log") }
      %i[yield_gvl proactively_yield_gvl flush_on_stop].each do |name|
        [nil, 1, "true"].each do |value|
          expect_refusal(TypeError, name, value) { described_class.new(collector, name => value) }
        end
      end
      expect_refusal(TypeError, :flush, "yes") { described_class.new(collector).stop!(flush: "yes") }
      expect { described_class.new(collector, intervall: 1) }.to raise_error(ArgumentError, /intervall/)
      expect { described_class.new(collector).run }.to raise_error(ArgumentError, /block/)
    end

    it "priority: non-Integers are refused; huge Integers are clamped to Ruby's -3..3, so start! works" do
      [1.5, Float::NAN, "1", int_like].each do |value|
        expect_refusal(TypeError, :priority, value) { described_class.new(collector, priority: value) }
      end
      { 2**64 => 3, -(10**30) => -3, 2 => 2 }.each do |value, expected|
        flusher = described_class.new(collector, priority: value)
        expect(flusher.priority).to eq(expected)
        expect(flusher.start!).to be(true)
        expect(flusher.stop!).to be(true)
      end
    end

    it "stop! before start!, twice, and start! twice have defined results" do
      flusher = described_class.new(collector, interval: 60)
      expect(flusher.stop!).to be(false)
      expect([flusher.start!, flusher.start!]).to eq([true, false])
      expect([flusher.stop!, flusher.stop!]).to eq([true, false])
      expect(flusher.running?).to be(false)
    end
  end

  describe MemprofilerPprof::FileFlusher do
    let(:collector) { MemprofilerPprof::Collector.new }

    it "refuses keep: that is not a positive Integer, naming it" do
      [0, -1, 1.5, Float::NAN, Float::INFINITY, "3", int_like].each do |value|
        expect_refusal(refusal_for(value, :integer), :keep, value) { described_class.new(collector, keep: value) }
      end
      expect(described_class.new(collector, keep: 2**64).keep).to eq(2**64)
    end

    it "refuses patterns that are not Strings, name no file, contain NUL or use unknown directives" do
      [nil, 1, :pattern, Float::NAN].each do |value|
        expect_refusal(TypeError, :pattern, value) { described_class.new(collector, pattern: value) }
      end
      ["", "/tmp/", "/tmp/a\0b-%{pid}", "/tmp/%s", "/tmp/%{pid", "/tmp/%{nope}"].each do |value|
        expect { described_class.new(collector, pattern: value) }.to raise_error(ArgumentError, /pattern/)
      end
    end

    it "a pattern with bytes invalid in its encoding is used as bytes" do
      Dir.mktmpdir do |dir|
        invalid = "#{dir}/caf\xE9-%{index}.pprof".dup.force_encoding(Encoding::UTF_8)
        flusher = described_class.new(collector, pattern: invalid)
        expect(flusher.path_for).to eq("#{dir}/caf\xE9-0.pprof".b)
        path = flusher.write(collector.flush)
        expect(File.exist?(path)).to be(true)
        expect(Dir.children(dir).map(&:b)).to eq(["caf\xE9-0.pprof".b])
      end
    end

    it "a frozen String subclass and a Pathname work as patterns" do
      Dir.mktmpdir do |dir|
        subclassed = Class.new(String).new("#{dir}/s-%{index}.pprof").freeze
        expect(described_class.new(collector, pattern: subclassed).path_for).to eq("#{dir}/s-0.pprof")
        expect(described_class.new(collector, pattern: Pathname("#{dir}/p-%{index}.pprof")).path_for)
          .to eq("#{dir}/p-0.pprof")
      end
    end
  end

  describe MemprofilerPprof::PyroscopeUploader do
    let(:base) { { server_address: "http://127.0.0.1:9", application_name: "app" } }

    it "refuses server addresses that are not http(s) URLs, naming them (without credentials)" do
      [nil, 1, Float::NAN, "", "pyroscope:4040", "ftp://h", "http://", "http://h\xFF/".b,
       "https://user:secret@"].each do |value|
        expect { described_class.new(**base, server_address: value) }.to raise_error(refusal_for(value, :string)) { |e|
          expect(e.message).to include("server_address")
          expect(e.message).not_to include("secret")
        }
      end
    end

    it "refuses bad application names, labels, headers and api, naming them" do
      [nil, "", 1, "my app", "app\xFF".b, :app].each do |value|
        expect_refusal(refusal_for(value, :string), :application_name, value) do
          described_class.new(**base, application_name: value)
        end
      end
      [nil, [], "env=prod"].each do |value|
        expect { described_class.new(**base, labels: value) }.to raise_error(TypeError, /labels must be a Hash/)
      end
      expect { described_class.new(**base, labels: { nil => "x" }) }.to raise_error(ArgumentError, /label name nil/)
      expect { described_class.new(**base, labels: { "__name__" => "x" }) }.to raise_error(ArgumentError, /__name__/)
      expect { described_class.new(**base, headers: nil) }.to raise_error(TypeError, /headers/)
      expect { described_class.new(**base, headers: { "X-A" => "a\r\nX-B: b" }) }.to raise_error(ArgumentError, /line break/)
      expect { described_class.new(**base, headers: { "X-A" => "a\0b\xFF".b }) }.to raise_error(ArgumentError, /line break/)
      expect_refusal(ArgumentError, :api, "push") { described_class.new(**base, api: "push") }
    end

    it "refuses a tenant_id with a line break or empty, since it becomes a header" do
      ["a\r\nX-Evil: 1", "", "t\0", "t\n\xFF".b].each do |value|
        expect_refusal(ArgumentError, :tenant_id, value) { described_class.new(**base, tenant_id: value) }
      end
      expect(described_class.new(**base, tenant_id: 42).tenant_id).to eq("42")
    end

    it "refuses bad timeouts, retries and delays; huge ones are accepted" do
      %i[open_timeout read_timeout retry_base_delay].each do |name|
        [nil, 0, -1, Float::NAN, Float::INFINITY, "5"].each do |value|
          expect_refusal(refusal_for(value, :number), name, value) { described_class.new(**base, name => value) }
        end
        expect(described_class.new(**base, name => 2**64)).to be_a(described_class)
      end
      [nil, -1, 1.5, "3", Float::INFINITY].each do |value|
        expect_refusal(refusal_for(value, :integer), :retries, value) { described_class.new(**base, retries: value) }
      end
      expect(described_class.new(**base, retries: 10**30).retries).to eq(10**30)
      expect { described_class.new(**base, basic_auth_username: "u") }.to raise_error(ArgumentError, /go together/)
    end

    it "labels: non-UTF-8 values are accepted (sent with U+FFFD), nil values become empty" do
      uploader = described_class.new(**base, labels: { "a" => "x\xFF".b, b: nil })
      expect(uploader.labels).to eq("a" => "x\xFF".b, "b" => "")
      encoded = described_class::Protobuf.string(1, "x\xFF".b)
      expect(encoded.byteslice(2..).force_encoding(Encoding::UTF_8)).to eq("x\uFFFD")
    end

    it "upload of something that is not a profile returns a failed Result naming it, never raising" do
      logger = ListLogger.new
      uploader = described_class.new(**base, logger: logger, retries: 0)
      [nil, 1, Object.new].each do |value|
        result = uploader.upload(value)
        expect(result.ok?).to be(false)
        expect(result.attempts).to eq(0)
        expect(result.error).to be_a(TypeError)
        expect(result.error.message).to include("ProfileData", value.inspect)
      end
      expect(logger.errors.size).to eq(3)
    end
  end

  describe MemprofilerPprof::PyroscopeFlusher do
    let(:collector) { MemprofilerPprof::Collector.new }
    let(:base) { { server_address: "http://127.0.0.1:9", application_name: "app" } }

    it "refuses bad max_pending, max_profile_bytes and interval, and unknown keywords, naming them" do
      %i[max_pending max_profile_bytes].each do |name|
        [nil, 0, -1, 1.5, Float::NAN, Float::INFINITY, "4", int_like].each do |value|
          expect_refusal(refusal_for(value, :integer), name, value) { described_class.new(collector, **base, name => value) }
        end
      end
      [nil, 0, -1, Float::NAN, Float::INFINITY, "15"].each do |value|
        expect_refusal(refusal_for(value, :number), :interval, value) { described_class.new(collector, **base, interval: value) }
      end
      expect { described_class.new(collector, **base, lables: {}) }.to raise_error(ArgumentError, /lables/)
      expect { described_class.new(collector, application_name: "app") }.to raise_error(ArgumentError, /server_address/)
      expect { described_class.new(nil, **base) }.to raise_error(TypeError, /collector/)
    end

    it "huge max_pending and max_profile_bytes are accepted and used as given" do
      flusher = described_class.new(collector, **base, max_pending: 2**64, max_profile_bytes: 10**30)
      expect([flusher.max_pending, flusher.max_profile_bytes]).to eq([2**64, 10**30])
    end
  end
end
