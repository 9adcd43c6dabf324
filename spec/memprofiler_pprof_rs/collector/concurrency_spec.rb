# frozen_string_literal: true

# Threads, fork, Ractors and compaction are normal conditions.
# In both modes (Collector::MODES): they find deaths differently, and
# compaction moves what each tracks.
%i[exact light].each do |mode|
  RSpec.describe MemprofilerPprof::Collector, "under concurrency (mode: #{mode})" do
    let(:unlimited) { { max_allocation_samples: 10_000_000, max_heap_samples: 10_000_000 } }

    def two_objects_allocations(profile)
      profile.samples
             .select { |s| s.frames.first(2).any? { |f| f.name == "Workload::Allocator#two_objects" } }
             .sum { |s| s.value(profile, "alloc_objects") }
    end

    [false, true].each do |yield_gvl|
      it "counts every allocation of 4 threads exactly once while another thread flushes (yield_gvl: #{yield_gvl})" do
        collector = described_class.new(mode: mode, sample_rate: 1.0, **unlimited)
        allocator = Workload::Allocator.new
        iterations = 20_000
        collector.start!
        flushes = []
        done = false
        flushing = Queue.new
        flusher = Thread.new do
          until done
            flushes << collector.flush(yield_gvl: yield_gvl, proactively_yield_gvl: yield_gvl)
            flushing << true if flushes.size == 1
            Thread.pass
          end
        end
        flushing.pop # the workers start once the flusher is under way
        workers = Array.new(4) do |t|
          Thread.new { iterations.times { |i| allocator.two_objects(t * iterations + i) } }
        end
        workers.each(&:join)
        done = true
        flusher.join
        flushes << collector.flush(yield_gvl: yield_gvl)
        collector.stop!

        expect(flushes.size).to be >= 2
        profiles = flushes.map { |d| parse_profile(d) }
        counted = profiles.sum { |p| two_objects_allocations(p) }
        nolock = flushes.sum(&:dropped_samples_nolock)
        expect(counted + nolock).to eq(4 * iterations * 2)
        expect(nolock).to eq(0)
        expect(collector.internal_error_count).to eq(0)
        _out, err, status = go_pprof(flushes[flushes.size / 2], "-top")
        expect(status.exitstatus).to eq(0), err
      end
    end

    it "serialises flushes called from two threads at once" do
      collector = described_class.new(mode: mode, sample_rate: 1.0)
      collector.start!
      Workload::Allocator.new.outer(100)
      results = Array.new(2) { Thread.new { collector.flush(yield_gvl: true) } }.map(&:value)
      collector.stop!
      expect(results.map(&:class).uniq).to eq([MemprofilerPprof::ProfileData])
      expect(results.sum(&:allocation_samples_count)).to be >= 300
    end

    it "keeps working in a forked child, which flushes its own allocations and the parent's live objects" do
      collector = described_class.new(mode: mode, sample_rate: 1.0, **unlimited)
      allocator = Workload::Allocator.new
      collector.start!
      kept_by_parent = Workload::Allocator.big_strings(50, 1_000)
      GC.start # in use from now on (see Collector::INUSE_AS_OF)
      collector.flush # the parent's allocations so far are reported here
      reader, writer = IO.pipe
      pid = fork do
        reader.close
        300.times { |i| allocator.two_objects(i) }
        data = collector.flush
        writer.binmode
        writer.write(data.pprof_data)
        writer.close
        exit!(0)
      end
      writer.close
      child_pprof = reader.read
      reader.close
      _, status = Process.wait2(pid)
      expect(status.success?).to be(true)

      child = parse_profile(child_pprof)
      expect(two_objects_allocations(child)).to eq(600)
      expect(big_strings_alive(child)).to eq(50)

      parent = parse_profile(collector.flush)
      collector.stop!
      expect(two_objects_allocations(parent)).to eq(0)
      expect(kept_by_parent.size).to eq(50)
    end

    it "lets a child forked while another thread is flushing flush on its own" do
      collector = described_class.new(mode: mode, sample_rate: 1.0, **unlimited)
      collector.start!
      stop = false
      flusher = Thread.new { collector.flush(yield_gvl: true, proactively_yield_gvl: true) until stop }
      results = Array.new(5) do
        Workload::Allocator.new.outer(200)
        reader, writer = IO.pipe
        pid = fork do
          reader.close
          outcome = begin
            data = collector.flush
            "ok #{data.pprof_data.bytesize.positive?}"
          rescue StandardError => e
            "#{e.class}: #{e.message}"
          end
          writer.write(outcome)
          writer.close
          exit!(0)
        end
        writer.close
        outcome = reader.read
        reader.close
        Process.wait(pid)
        outcome
      end
      stop = true
      flusher.join
      collector.stop!
      expect(results).to all(eq("ok true"))
    end

    it "lets Ractors run to completion, switching its hooks off for the rest of the process" do
      code = <<~RUBY
        Warning[:experimental] = false
        require "memprofiler_pprof_rs"
        c = MemprofilerPprof::Collector.new(mode: :#{mode}, sample_rate: 1.0)
        c.start!
        before = Array.new(50) { |i| i.to_s }
        ractors = 4.times.map { |n| Ractor.new(n) { |k| 20_000.times.map { |i| "r\#{k}-\#{i}" }.size } }
        paused = c.sampling_paused_for_ractors?
        results = ractors.map(&:take)
        data = c.flush
        later = MemprofilerPprof::Collector.new(mode: :#{mode}, sample_rate: 1.0)
        later_data = later.profile { 100.times { |i| i.to_s } }
        puts [results.sum, paused, data.allocation_samples_count >= 50, later.sampling_paused_for_ractors?,
              later_data.allocation_samples_count, c.internal_error_count].inspect
      RUBY
      out, err, status = run_ruby(code)
      expect(status.exitstatus).to eq(0), err
      expect(out).to eq("[80000, true, true, true, 0, 0]\n")
    end

    it "runs Ractor-heavy code to completion: nested Ractors, exceptions, GC and compaction, flushes meanwhile" do
      Dir.mktmpdir do |dir|
        code = <<~RUBY
          Warning[:experimental] = false
          require "memprofiler_pprof_rs"
          c = MemprofilerPprof::Collector.new(mode: :#{mode}, sample_rate: 0.1)
          c.start!
          side = MemprofilerPprof::Collector.new(mode: :#{mode}, sample_rate: 1.0, max_heap_samples: 1000)
          side.start!
          keep = Array.new(2000) { |i| "before\#{i}" }
          File.binwrite(#{File.join(dir, 'before.pprof').inspect}, c.flush.pprof_data)
          flusher = Thread.new { 20.times.map { c.flush.pprof_data.bytesize.tap { sleep 0.01 } } }
          ractors = 8.times.map do |n|
            Ractor.new(n) do |k|
              total = 0
              3.times do |round|
                objs = 5_000.times.map { |i| ["r\#{k}-\#{i}", { i => i.to_s }, i.to_f * 1.5, :"sym\#{k}_\#{i % 50}"] }
                total += objs.size
                begin
                  raise ArgumentError, "in ractor \#{k}"
                rescue ArgumentError => e
                  total += 1 if e.message.include?(k.to_s)
                end
                GC.start if round == 1
                # A Ractor made by a Ractor (this once raised IsolationError
                # with the gem loaded).
                total += Ractor.new(k) { |j| Array.new(1000) { |i| "inner\#{j}-\#{i}" }.size }.take
              end
              total
            end
          end
          3.times { GC.compact; GC.start }
          results = ractors.map(&:take)
          sizes = flusher.value
          data = c.flush
          File.binwrite(#{File.join(dir, 'ractors.pprof').inspect}, data.pprof_data)
          in_ractor = Ractor.new { MemprofilerPprof::Collector.new.start! rescue $!.class }.take
          p [results.uniq, sizes.all?(&:positive?), c.sampling_paused_for_ractors?,
             c.internal_error_count + side.internal_error_count, keep.size, in_ractor]
        RUBY
        out, err, status = run_ruby(code)
        expect(status.exitstatus).to eq(0), err
        expect(out).to eq("[[18003], true, true, 0, 2000, Ractor::UnsafeError]\n")
        # What the main Ractor allocated before the first Ractor.new is there;
        # the flush after the Ractors is empty (sampling is off) but valid.
        expect(parse_profile(File.binread(File.join(dir, "before.pprof"))).samples).not_to be_empty
        expect(parse_profile(File.binread(File.join(dir, "ractors.pprof"))).sample_types).not_to be_empty
      end
    end

    it "keeps tracking sampled strings that GC compaction moved" do
      skip "GC compaction unsupported" unless GC.respond_to?(:verify_compaction_references)
      collector = described_class.new(mode: mode, sample_rate: 1.0, **unlimited)
      collector.start!
      @kept = Workload::Allocator.big_strings(2_000, 30)
      GC.start # in use from now on (see Collector::INUSE_AS_OF)
      before = parse_profile(collector.flush)
      # Moves every movable object (toward an emptied heap). Ruby 3.2 renamed
      # double_heap: to expand_heap: (3.3 warns about the old name; 3.1 knows only it).
      params = GC.method(:verify_compaction_references).parameters
      grow = params.include?(%i[key expand_heap]) ? :expand_heap : :double_heap
      GC.verify_compaction_references(grow => true, toward: :empty)
      moved = GC.latest_compact_info[:moved]
      after = parse_profile(collector.flush)
      expect(big_strings_alive(before)).to eq(2_000)
      expect(moved.fetch(:T_STRING, 0)).to be >= 2_000
      expect(big_strings_alive(after)).to eq(2_000)
      expect(@kept.map(&:bytesize).uniq).to eq([30])
      @kept = nil
      GC.start
      gone = parse_profile(collector.flush)
      expect(big_strings_alive(gone)).to eq(0)
      expect(collector.internal_error_count).to eq(0)
    ensure
      collector&.stop!
    end

    # Flushes while another thread raises `error` into this one as soon as
    # the flush holds its lock (so, most likely, where it lets other threads
    # run): the flush's result, or what it raised. A raise that comes after
    # the flush returned is held back and dropped.
    def flush_raised_into(collector, error)
      main = Thread.current
      lock = collector.__send__(:flush_lock)
      done = false
      result = nil
      begin
        Thread.handle_interrupt(error => :never) do
          attacker = Thread.new do
            Thread.pass until lock.locked? || done
            main.raise(error) unless done
          end
          result = begin
            Thread.handle_interrupt(error => :immediate) { collector.flush }
          rescue error => e
            e
          end
          done = true
          attacker.join
        end
      rescue error
        # (Raised after the flush had returned.)
      end
      result
    end

    # Thread#raise (Timeout, a shutdown) lands where a flush lets other
    # threads run. The flush raises it, and its profile is never returned:
    # the next flush counts that interval's allocations, and starts where
    # the last returned profile ended.
    it "gives the allocations of a flush an exception interrupted to the next flush" do
      interrupted = Class.new(StandardError)
      collector = described_class.new(mode: mode, sample_rate: 1.0, **unlimited)
      allocator = Workload::Allocator.new
      collector.start!
      last = collector.flush
      rows = Array.new(3) do
        5_000.times { |i| allocator.two_objects(i) }
        first = flush_raised_into(collector, interrupted)
        2_500.times { |i| allocator.two_objects(i) }
        data = collector.flush
        delivered = first.is_a?(MemprofilerPprof::ProfileData)
        previous = delivered ? first : last
        last = data
        { inside: !delivered && first.backtrace.any? { |l| l.include?("_native_flush") }, delivered: delivered,
          counted: (delivered ? two_objects_allocations(parse_profile(first)) : 0) +
            two_objects_allocations(parse_profile(data)),
          continuous: data.started_at == previous.finished_at }
      end
      collector.stop!
      expect(rows.count { |row| row[:inside] }).to be >= 1
      # (A raise that lands in Ruby code around the native flush, just
      # before it or as it returns, tells nothing: left out.)
      known = rows.select { |row| row[:inside] || row[:delivered] }
      expect(known.map { |row| row[:counted] }).to all(eq(15_000))
      expect(known.map { |row| row[:continuous] }).to all(be(true))
    end

    # A flush measures live objects in chunks and lets other threads run in
    # between; what they do meanwhile must not corrupt or thin the profile.
    # Run in fresh processes (a failure here would be a crash).
    describe "while a flush lets other threads run between its steps" do
      it "counts every live object although GC.compact moves them mid-flush" do
        code = <<~RUBY
          require "memprofiler_pprof_rs"
          collector = MemprofilerPprof::Collector.new(mode: :#{mode}, sample_rate: 1.0, max_heap_samples: 200_000,
                                                      max_allocation_samples: 10)
          collector.start!
          keep = []
          junk = []
          60_000.times { |i| object = Object.new; (i % 3).zero? ? keep << object : junk << object }
          collector.stop!
          junk = nil
          GC.start
          before = collector.live_heap_samples_count
          stop = false
          compactor = Thread.new { GC.compact until stop }
          data = collector.flush
          stop = true
          compactor.join
          puts [before, data.heap_samples_count, keep.size].join(" ")
        RUBY
        out, err, status = run_ruby(code)
        expect(status).to be_success, err
        before, flushed, kept = out.split.map(&:to_i)
        expect(kept).to eq(20_000)
        expect(before).to be >= 20_000
        expect(flushed).to eq(before)
      end

      it "names the class of an object that died mid-flush, even an anonymous class freed meanwhile" do
        code = <<~RUBY
          require "memprofiler_pprof_rs"
          class Marker; end
          collector = MemprofilerPprof::Collector.new(mode: :#{mode}, sample_rate: 1.0, max_heap_samples: 200_000,
                                                      max_allocation_samples: 10)
          collector.start!
          classes = []
          instances = []
          20_000.times { klass = Class.new(Marker); classes << klass; instances << klass.new }
          collector.stop!
          GC.start
          started = false
          flush = Thread.new { started = true; collector.flush }
          Thread.pass until started
          5.times { Thread.pass }
          classes = nil
          instances = nil
          3.times { GC.start }
          filler = Array.new(200_000) { "x" * 10 }
          data = flush.value
          puts [data.heap_samples_count, collector.internal_error_count, filler.size].join(" ")
        RUBY
        out, err, status = run_ruby(code)
        expect(status).to be_success, err
        heap, errors, = out.split.map(&:to_i)
        expect(heap).to be_positive
        expect(errors).to eq(0)
      end
    end
  end
end
