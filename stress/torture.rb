# frozen_string_literal: true

# Torture test: everything that has crashed Ruby memory profilers, at once,
# for as long as you like, checking invariants as it goes. Exits 1 on any
# failed check, and a crash (a Ruby [BUG], SIGSEGV, abort) ends the process
# with a signal, which stress/torture_repeat counts.
#
#   ruby stress/torture.rb --duration 120        # what CI runs (script/test)
#   ruby stress/torture.rb --duration 3600 --seed 7
#   stress/torture_repeat 100                    # N CI-length runs in a row, counts crashes
#
# At the same time:
# - worker threads allocate strings, arrays, hashes, structs, objects of
#   classes made and dropped at run time (anonymous classes, eval'd methods,
#   so frames and iseqs die while samples reference them), fibers, dynamic
#   symbols and short-lived threads; recurse 10,000 frames deep; raise and
#   rescue exceptions (also through those 10,000 frames);
# - two flusher threads flush two long-lived collectors in a loop with random
#   flush options; every profile is decoded here, checked against the caps,
#   and read by `go tool pprof` (in batches, by a validator thread);
# - a controller thread toggles stop!/start!, changes sample_rate, runs
#   GC.compact, GC.verify_compaction_references, full and minor GCs and short
#   GC.stress windows;
# - a forker thread forks children that profile, flush, check their profiles
#   and exit (a child that crashes, fails or hangs is a failure);
# - a churn thread creates and drops whole collectors, several at once, some
#   dropped while still running, some driven by a BlockFlusher + FileFlusher;
# - RSS is sampled; after warm-up it must stay under warm-up RSS + a margin.
# An exception escaping from a hook would surface in a worker as an
# exception it did not raise: every worker treats those as failures.

require "optparse"
require "rbconfig"
require "tmpdir"
require "fileutils"
require "open3"
require "timeout"

# Non-main threads need a VM stack deep enough for 10,000 Ruby frames; the
# size is read when Ruby starts, so set it and start again.
DEEP_STACK_BYTES = 64 * 1024 * 1024
if ENV["RUBY_THREAD_VM_STACK_SIZE"].to_i < DEEP_STACK_BYTES
  env = { "RUBY_THREAD_VM_STACK_SIZE" => DEEP_STACK_BYTES.to_s }
  exec(env, RbConfig.ruby, "-W0", __FILE__, *ARGV)
end

$LOAD_PATH.unshift(File.expand_path("../lib", __dir__))
require "memprofiler_pprof_rs"
# Loaded now, not on first use (autoload) in one of the threads: a fork
# while another thread is inside an autoload leaves the child with the
# constant half-defined (seen on 3.4: PprofReader without its StringIO).
# That is Ruby's autoload-and-fork hazard, not what this test is after.
MemprofilerPprof.const_get(:PprofReader)

module Torture
  Options = Struct.new(:duration, :seed, :rss_margin_mb, :workers, :go, :keep_dir, :quiet, :profiler, :main_mode)

  # Raised on purpose by the workers; anything else they see is a failure.
  class Expected < StandardError; end

  RECURSION_DEPTH = 10_000
  HANG_SECONDS = 300
  # Ruby 3.2 renamed verify_compaction_references' double_heap: to expand_heap:.
  GROW_HEAP_KEYWORD =
    GC.method(:verify_compaction_references).parameters.include?(%i[key expand_heap]) ? :expand_heap : :double_heap
  MAIN_CAPS = { max_allocation_samples: 4_000, max_heap_samples: 20_000 }.freeze
  SIDE_CAPS = { max_allocation_samples: 1_000, max_heap_samples: 5_000 }.freeze

  # Failures from any thread; the first one is printed at once.
  class Failures
    def initialize
      @lock = Mutex.new
      @list = []
    end

    def add(message)
      @lock.synchronize do
        @list << message
        $stderr.puts "torture: FAIL: #{message}" if @list.size <= 20
      end
    end

    def any? = @lock.synchronize { !@list.empty? }
    def count = @lock.synchronize { @list.size }
  end

  # Counters for the summary.
  class Stats
    def initialize
      @lock = Mutex.new
      @counts = Hash.new(0)
    end

    def bump(key, by = 1) = @lock.synchronize { @counts[key] += by }
    def [](key) = @lock.synchronize { @counts[key] }
    def to_h = @lock.synchronize { @counts.dup }
  end

  def self.rss_mb
    File.foreach("/proc/self/status") { |l| return l.split[1].to_i / 1024.0 if l.start_with?("VmRSS:") }
    0.0
  end

  # Checks one profile: the counts against the caps it was taken under, and
  # that it decodes with sane values. Returns an error message or nil.
  def self.check_profile(data, caps)
    if data.heap_samples_count > caps[:max_heap_samples]
      return "heap_samples_count #{data.heap_samples_count} > cap #{caps[:max_heap_samples]}"
    end
    if data.allocation_samples_count > caps[:max_allocation_samples]
      return "allocation_samples_count #{data.allocation_samples_count} > cap #{caps[:max_allocation_samples]}"
    end

    # Two independent decoders must agree: the Rust core's (what the
    # executable uses) and the plain-Ruby PprofReader. Neither uses Ruby's
    # zlib, whose GVL-released resizing crashes forked children
    # (repro/zlib_fork_crash.rb).
    profile = MemprofilerPprof::PprofReader.parse(data.pprof_data)
    native = MemprofilerPprof::Profile.parse(data.pprof_data)
    if native.samples_count != profile.samples.size
      return "decoders disagree: #{native.samples_count} samples (native) vs #{profile.samples.size} (PprofReader)"
    end

    names = profile.sample_type_names
    unless names == %w[allocations allocation_size inuse_objects inuse_space] ||
           names.sort == %w[alloc_objects alloc_space inuse_objects inuse_space]
      return "unexpected sample types #{names.inspect}"
    end

    bad = profile.samples.find { |s| names.any? { |n| s.value(profile, n).negative? } }
    return "negative value in a sample: #{bad.inspect[0, 200]}" if bad

    nil
  rescue StandardError => e
    "profile does not decode: #{e.class}: #{e.message}"
  end

  # Runs `go tool pprof` over written profiles in batches (one go process
  # reads many profiles at once; a failing batch is retried file by file to
  # name the culprit, which is kept).
  class GoValidator
    BATCH = 40

    def initialize(failures, stats, keep_dir)
      @failures = failures
      @stats = stats
      @keep_dir = keep_dir
      @queue = Queue.new
      @thread = Thread.new { run }
    end

    def <<(path)
      @queue << path
    end

    def finish
      @queue << :done
      @thread.join
    end

    private

    def run
      loop do
        batch = [@queue.pop]
        batch << @queue.pop while batch.size < BATCH && !@queue.empty?
        done = batch.delete(:done)
        validate(batch) unless batch.empty?
        break if done
      end
    rescue Exception => e # rubocop:disable Lint/RescueException
      @failures.add("validator died: #{e.class}: #{e.message}")
    end

    def validate(paths)
      if pprof_ok?(paths)
        @stats.bump(:go_validated, paths.size)
      else
        paths.each do |path|
          next @stats.bump(:go_validated) if pprof_ok?([path])

          kept = File.join(@keep_dir, File.basename(path))
          FileUtils.mkdir_p(@keep_dir)
          FileUtils.cp(path, kept)
          @failures.add("go tool pprof rejects #{kept}: #{@last_error.to_s.lines.first(3).join.strip}")
        end
      end
      paths.each { |p| File.delete(p) if File.exist?(p) }
    end

    def pprof_ok?(paths)
      _out, err, status = Open3.capture3("go", "tool", "pprof", "-top", "-nodecount=1", *paths)
      @last_error = err
      status.success?
    end
  end

  # One worker thread's allocation mix.
  class Worker
    Point = Struct.new(:x, :y, :label)

    def initialize(id, random, stop, failures, stats)
      @id = id
      @random = random
      @stop = stop
      @failures = failures
      @stats = stats
      @retained = Array.new(3_000) # what survives for a while, then dies
      @classes = []                # runtime classes, dropped after a while
      @serial = 0
    end

    def run
      until @stop.true?
        step = @random.rand(12)
        send(STEPS[step])
        @stats.bump(:worker_steps)
      end
    rescue Exception => e # rubocop:disable Lint/RescueException
      @failures.add("worker #{@id} got #{e.class}: #{e.message} at #{e.backtrace&.first(3)&.join(' < ')}")
    end

    STEPS = %i[strings arrays_and_hashes structs runtime_class runtime_class eval_methods deep_recursion
               exceptions fibers symbols short_thread strings].freeze

    private

    def keep(object)
      @retained[@random.rand(@retained.size)] = object
    end

    def strings
      500.times do |i|
        s = "w#{@id}-#{i}-" * @random.rand(1..40)
        keep(s) if (i % 7).zero?
      end
      keep(String.new(capacity: @random.rand(1..200_000)))
    end

    def arrays_and_hashes
      200.times do |i|
        a = Array.new(@random.rand(0..64)) { |j| j.even? ? j : j.to_s }
        h = { a: a, i => [i, i.to_f, i.to_r], "k#{i}" => { nested: a.dup } }
        keep(h) if (i % 5).zero?
      end
    end

    def structs
      klass = Struct.new(:a, :b, :c, :d) # a new class each time; dies with its instances
      300.times { |i| keep(klass.new(i, i.to_s, [i], Point.new(i, i, "p#{i}"))) if (i % 3).zero? }
    end

    # Anonymous classes with methods defined at run time; instances and the
    # strings the methods allocate are retained for a while, the classes
    # dropped after a few steps.
    def runtime_class
      @serial += 1
      klass = Class.new do
        attr_accessor :payload

        define_method(:fill) { |n| self.payload = Array.new(n) { |i| "dyn#{i}" } }
      end
      obj = klass.new
      obj.fill(@random.rand(1..100))
      keep(obj)
      @classes << klass
      @classes.shift while @classes.size > 20
    end

    # Methods compiled from strings: their iseqs (and frames in samples)
    # die when the module is dropped.
    def eval_methods
      @serial += 1
      mod = Module.new
      mod.module_eval(<<~RUBY, "(torture-eval-#{@id}-#{@serial})", 1)
        def self.make(n)
          Array.new(n) { |i| "evald-\#{i}" * 3 }
        end

        def self.nest(n)
          n.zero? ? make(20) : nest(n - 1)
        end
      RUBY
      keep(mod.nest(@random.rand(1..60)))
      keep(mod.make(50)) if @random.rand < 0.5
    end

    def deep_recursion
      raise_at_bottom = @random.rand < 0.3
      result = recurse(RECURSION_DEPTH, raise_at_bottom)
      keep(result)
    rescue Expected => e
      keep(e)
    end

    def recurse(depth, raise_at_bottom)
      return bottom(raise_at_bottom) if depth.zero?

      recurse(depth - 1, raise_at_bottom)
    end

    def bottom(raise_at_bottom)
      objects = Array.new(100) { |i| "deep#{i}" }
      raise Expected, "from #{RECURSION_DEPTH} frames down" if raise_at_bottom

      objects
    end

    def exceptions
      50.times do |i|
        raise Expected, "boom #{i}" if i.odd?

        Integer("not a number #{i}") # raised from C
      rescue Expected, ArgumentError => e
        keep(e) if (i % 10).zero?
      end
    end

    def fibers
      enum = Enumerator.new { |y| 100.times { |i| y << "fiber#{i}" } }
      20.times { keep(enum.next) }
      Fiber.new { keep(Array.new(50) { |i| [i] }) }.resume
    end

    def symbols
      50.times { |i| keep("sym_#{@id}_#{@random.rand(1_000_000)}_#{i}".to_sym) }
    end

    def short_thread
      t = Thread.new { Array.new(200) { |i| "t#{i}" } }
      keep(t.value)
    end
  end

  class Run
    def initialize(options)
      @options = options
      @random = Random.new(options.seed)
      @stop = Atomic.new
      @failures = Failures.new
      @stats = Stats.new
      @dir = Dir.mktmpdir("torture")
      @validator = options.go ? GoValidator.new(@failures, @stats, options.keep_dir) : nil
      # The main collector at the defaults (--main-mode to choose): no
      # FREEOBJ hook (deaths found by object id), and past its warm-up
      # sampling windows (the NEWOBJ hook switched on and off around short
      # windows at random places in the allocation sequence, with a budget).
      @main = MemprofilerPprof::Collector.new(sample_rate: 0.01, seed: @random.rand(2**32),
                                              mode: options.main_mode, **MAIN_CAPS)
      # The side collector with both hooks always on (mode :exact, 0.1.0's
      # defaults), sizing from C_RETURN.
      @side = MemprofilerPprof::Collector.new(sample_rate: 0.05, seed: @random.rand(2**32),
                                              size_measurement: :c_return, mode: :exact, **SIDE_CAPS)
      @collectors = { @main => MAIN_CAPS, @side => SIDE_CAPS }
      @collectors_lock = Mutex.new # the controller's stop!/start! and flushes of the same collector
      @rss_max_after_warmup = 0.0
      @rss_at_warmup = nil
      @block_dirs = {}
    end

    def call
      started = @started = now
      # --no-profiler: the same threads, GC and forks with no collector
      # running, to tell Ruby's own crashes from the profiler's.
      @collectors.each_key(&:start!) if @options.profiler
      threads = []
      @options.workers.times do |i|
        threads << named("worker#{i}") { Worker.new(i, Random.new(@random.rand(2**32)), @stop, @failures, @stats).run }
      end
      2.times { |i| threads << named("flusher#{i}") { flusher_loop } } if @options.profiler
      threads << named("controller") { controller_loop(Random.new(@random.rand(2**32))) }
      threads << named("forker") { forker_loop(Random.new(@random.rand(2**32))) }
      threads << named("churn") { churn_loop(Random.new(@random.rand(2**32))) } if @options.profiler

      watch(started)
      @stop.set
      join_all(threads)
      finish
      summary(now - started)
      @failures.any? ? 1 : 0
    ensure
      FileUtils.rm_rf(@dir)
    end

    private

    def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)

    def named(name)
      Thread.new do
        Thread.current.name = name
        yield
      rescue Exception => e # rubocop:disable Lint/RescueException
        @failures.add("#{name} died: #{e.class}: #{e.message} at #{e.backtrace&.first(3)&.join(' < ')}")
      end
    end

    # Main thread: RSS after warm-up, progress lines, deadline.
    def watch(started)
      warmup = [@options.duration * 0.25, 10].max.clamp(0, @options.duration)
      last_report = started
      until now - started >= @options.duration || @failures.any?
        before = now
        sleep 0.5
        @longest_stall = [@longest_stall || 0, now - before - 0.5].max
        elapsed = now - started
        rss = Torture.rss_mb
        if elapsed >= warmup
          @rss_at_warmup ||= rss
          @rss_max_after_warmup = [@rss_max_after_warmup, rss].max
          if rss > @rss_at_warmup + @options.rss_margin_mb
            @failures.add(format("RSS %.0f MB > %.0f MB at warm-up + %d MB", rss, @rss_at_warmup, @options.rss_margin_mb))
          end
        end
        next if @options.quiet || now - last_report < 15

        last_report = now
        puts format("torture: %4.0fs rss %.0f MB, %d flushes, %d children, %d collectors made, %d profiles validated",
                    elapsed, rss, @stats[:flushes], @stats[:children], @stats[:collectors_made], @stats[:go_validated])
      end
    end

    # A GC.stress window on a loaded machine can stall every thread for a
    # minute, so hangs are only called after HANG_SECONDS.
    def join_all(threads)
      deadline = now + HANG_SECONDS
      threads.each do |t|
        next if t.join([deadline - now, 0].max)

        @failures.add("thread #{t.name} did not stop within #{HANG_SECONDS} s (hang?): #{t.backtrace&.first(5)&.join(' < ')}")
      end
    end

    def finish
      GC.stress = false
      @collectors.each do |collector, caps|
        collector.start!
        data = collector.flush
        check_and_queue(data, caps, "final")
        collector.stop!
        if collector.internal_error_count.positive?
          @failures.add("collector counted #{collector.internal_error_count} internal hook errors")
        end
      end
      @validator&.finish
    end

    def summary(elapsed)
      s = @stats.to_h
      puts format("torture: %s after %.0f s (seed %d): %d failures; %d flushes (%d folded), %d children, " \
                  "%d collectors made, %d profiles read by go tool pprof, %d worker steps, " \
                  "%d flushes interrupted by Timeout, %d compactions, %d GC.stress windows; " \
                  "RSS %.0f MB at warm-up, max %.0f MB after; " \
                  "longest main-thread stall %.1f s, slowest controller action %s",
                  @failures.any? ? "FAILED" : "ok", elapsed, @options.seed, @failures.count, s[:flushes],
                  s[:folded], s[:children], s[:collectors_made], s[:go_validated], s[:worker_steps],
                  s[:flushes_interrupted], s[:compactions], s[:stress_windows], @rss_at_warmup || 0, @rss_max_after_warmup,
                  @longest_stall || 0, @slowest_action.inspect)
    end

    def check_and_queue(data, caps, label)
      serial = @stats.bump(:flushes)
      @stats.bump(:folded) if data.folded_samples_count.positive?
      if (error = Torture.check_profile(data, caps))
        @failures.add("#{label} flush: #{error}")
      end
      return unless @validator

      path = File.join(@dir, "#{label}-#{Process.pid}-#{serial}.pprof")
      write_file(path, data.pprof_data)
      @validator << path
    end

    # Never through Ruby's IO buffer: a child forked meanwhile would flush its
    # copy of the buffer into the same file (see FileOutput.write).
    def write_file(path, data)
      MemprofilerPprof::FileOutput.write(path, data)
    end

    def flusher_loop
      random = Random.new(@random.rand(2**32))
      until @stop.true?
        collector, caps = @collectors.to_a.sample(random: random)
        options = { yield_gvl: random.rand < 0.8, proactively_yield_gvl: random.rand < 0.8 }
        options[:max_profile_bytes] = random.rand(2_000..500_000) if random.rand < 0.2
        if random.rand < 0.1
          # Timeout raises into the flush wherever it is (also while the GVL
          # is released): the flush must give up cleanly, the next one work.
          begin
            Timeout.timeout(random.rand * 0.05) { collector.flush(**options) }
          rescue Timeout::Error
            @stats.bump(:flushes_interrupted)
          end
          next
        end
        data = collector.flush(**options)
        check_and_queue(data, caps, "flush")
        sleep random.rand * 0.3
      end
    end

    def controller_loop(random)
      until @stop.true?
        sleep random.rand * 0.5
        action = random.rand(100)
        action_started = now
        case action
        when 0...35
          next unless @options.profiler

          collector_action(random, action)
        when 35...50
          GC.compact
          @stats.bump(:compactions)
        when 50...53
          GC.verify_compaction_references(GROW_HEAP_KEYWORD => random.rand < 0.3, toward: :empty)
          @stats.bump(:compactions)
        when 53...63
          # Full GC.stress makes every allocation a major GC; with several
          # threads allocating, even a 10 ms window stalls for many seconds.
          # So other threads only get minor-only stress (flag 0x01), and full
          # stress lasts a few allocations of this thread (no GVL release).
          if random.rand < 0.3
            GC.stress = true
            keep = Array.new(random.rand(1..5)) { |i| "stressed#{i}" }
            GC.stress = false
            keep.clear
          else
            GC.stress = 0x01
            sleep random.rand * 0.005
            GC.stress = false
          end
          @stats.bump(:stress_windows)
        when 63...80
          GC.start(full_mark: random.rand < 0.5, immediate_sweep: random.rand < 0.5)
        end
        took = now - action_started
        @slowest_action = [took, action] if took > (@slowest_action&.first || 0)
      end
    ensure
      GC.stress = false
    end

    def collector_action(random, action)
      collector = @collectors.keys.sample(random: random)
      if action < 15
        collector.stop!
        sleep random.rand * 0.05
        switch_mode(collector, random) if action < 3
        collector.start!
      else
        collector.sample_rate = [0.0, 0.001, 0.01, 0.1, 0.5, 1.0].sample(random: random)
      end
    end

    # While stopped: another way of finding deaths (forgets the samples), or
    # other sampling windows.
    def switch_mode(collector, random)
      collector.mode = %i[exact light].sample(random: random)
      collector.window_budget = nil
      probability = [1.0, 0.5, 0.1].sample(random: random)
      collector.window_probability = probability
      budgets = probability < 1.0 ? [:auto, nil] : [:auto, nil, 20_000]
      collector.window_budget = budgets.sample(random: random)
      collector.window_warm_up = [0, 100_000, 1_000_000].sample(random: random)
    end

    # Children inherit both running collectors, profile on their own, flush
    # (also a collector of their own) and exit; the parent checks how.
    def forker_loop(random)
      serial = 0
      until @stop.true?
        sleep 1 + random.rand * 3
        break if @stop.true?

        serial += 1
        child_seed = random.rand(2**32)
        pid = fork { child_main(serial, child_seed) }
        status = wait_child(pid)
        @stats.bump(:children)
        if status.nil?
          @failures.add("child #{pid} did not exit within #{HANG_SECONDS} s (killed)")
        elsif !status.success?
          @failures.add("child #{pid} failed: #{status.inspect}")
        else
          Dir.glob(File.join(@dir, "child-#{pid}-*.pprof")).each { |p| @validator ? @validator << p : File.delete(p) }
        end
      end
    end

    def wait_child(pid)
      deadline = now + HANG_SECONDS
      loop do
        _pid, status = Process.wait2(pid, Process::WNOHANG)
        return status if status
        break if now > deadline

        sleep 0.05
      end
      Process.kill(:KILL, pid)
      Process.wait(pid)
      nil
    end

    def child_main(serial, seed)
      GC.stress = false # the fork may have happened inside a GC.stress window
      random = Random.new(seed)
      errors = []
      worker = Worker.new(100 + serial, random, Atomic.new, Failures.new, Stats.new)
      unless @options.profiler
        10.times { worker.__send__(Worker::STEPS.sample(random: random)) }
        GC.start
        exit!(0)
      end
      own = MemprofilerPprof::Collector.new(sample_rate: 0.05, seed: seed, **SIDE_CAPS)
      own.start!
      10.times { worker.__send__(Worker::STEPS.sample(random: random)) }
      profiles = @collectors.map { |c, caps| [c.flush, caps] } << [own.flush, SIDE_CAPS]
      own.stop!
      profiles.each_with_index do |(data, caps), i|
        error = Torture.check_profile(data, caps)
        errors << error if error
        write_file(File.join(@dir, "child-#{Process.pid}-#{i}.pprof"), data.pprof_data)
      end
      $stderr.puts "torture child #{Process.pid}: #{errors.join('; ')}" unless errors.empty?
      exit!(errors.empty? ? 0 : 3)
    rescue Exception => e # rubocop:disable Lint/RescueException
      $stderr.puts "torture child #{Process.pid}: #{e.class}: #{e.message} at #{e.backtrace&.first(3)&.join(' < ')}"
      exit!(4)
    end

    # Whole collectors come and go, several at once; some are dropped while
    # still running (their finalizer switches the hooks off), some run a
    # BlockFlusher writing files.
    def churn_loop(random)
      until @stop.true?
        batch = Array.new(random.rand(1..3)) do
          caps = { max_allocation_samples: random.rand(0..2_000), max_heap_samples: random.rand(0..5_000) }
          c = MemprofilerPprof::Collector.new(sample_rate: random.rand, seed: random.rand(2**32),
                                              size_measurement: random.rand < 0.3 ? :c_return : :postponed_job,
                                              allocation_retain_rate: random.rand,
                                              mode: %i[exact light].sample(random: random),
                                              window_probability: [1.0, 0.3].sample(random: random), **caps)
          c.start!
          @stats.bump(:collectors_made)
          [c, caps]
        end
        flusher = random.rand < 0.3 ? block_flusher(batch.first[0], random) : nil
        sleep random.rand * 0.3
        batch.each do |c, caps|
          check_and_queue(c.flush, caps, "churn") if random.rand < 0.7
          c.stop! if random.rand < 0.6 # the others are dropped running
        end
        if flusher
          flusher.stop!(flush: random.rand < 0.5)
          check_block_flusher(flusher)
        end
        batch = nil
        GC.start if random.rand < 0.2
      end
    end

    # stop! returns at once; give the thread a moment, then check what it did.
    def check_block_flusher(flusher)
      deadline = now + 90
      sleep 0.01 while flusher.running? && now < deadline
      @failures.add("BlockFlusher did not stop within 90 s") if flusher.running?
      if flusher.error_count.positive?
        @failures.add("at #{(now - @started).round(1)} s (slowest controller action so far: #{@slowest_action.inspect}): " \
                      "BlockFlusher counted #{flusher.error_count} errors: #{flusher.last_error.inspect}")
      end
      Dir.glob(File.join(@block_dirs.delete(flusher), "*.pprof")).each { |p| @validator ? @validator << p : File.delete(p) }
    end

    def block_flusher(collector, random)
      dir = File.join(@dir, "block-#{random.rand(2**32)}")
      file_flusher = MemprofilerPprof::FileFlusher.new(collector, pattern: File.join(dir, "%{index}.pprof"),
                                                                  interval: 0.1, keep: 2,
                                                                  logger: nil, stop_timeout: 60)
      file_flusher.start!
      @block_dirs[file_flusher] = dir
      file_flusher
    end
  end

  # A flag threads poll (a Mutex-free boolean; assignment is atomic under the GVL).
  class Atomic
    def initialize = @value = false
    def set = @value = true
    def true? = @value
  end

  def self.parse(argv)
    # Failures go beside the checkout's tmp/, wherever the run's directory is.
    failures_dir = File.expand_path("../tmp/torture-failures", __dir__)
    options = Options.new(120, Random.new_seed % (2**32), 200, 3, true, failures_dir, false, true,
                          MemprofilerPprof::DEFAULTS[:mode])
    OptionParser.new do |o|
      o.banner = "usage: ruby stress/torture.rb [options]"
      o.on("--duration SECONDS", Float, "how long to run (default 120)") { |v| options.duration = v }
      o.on("--seed N", Integer, "random seed (default: random, printed)") { |v| options.seed = v }
      o.on("--rss-margin-mb N", Integer, "allowed RSS growth after warm-up (default 200)") { |v| options.rss_margin_mb = v }
      o.on("--workers N", Integer, "allocating threads (default 3)") { |v| options.workers = v }
      o.on("--[no-]go", "check every profile with go tool pprof (default on)") { |v| options.go = v }
      o.on("--quiet", "no progress lines") { options.quiet = true }
      o.on("--main-mode MODE", %i[exact light], "the main collector's mode (default: the default mode)") do |v|
        options.main_mode = v
      end
      o.on("--no-profiler", "the control: the same threads, GC and forks, no collector running") do
        options.profiler = false
      end
    end.parse!(argv)
    if options.go && !system("go", "version", out: File::NULL, err: File::NULL)
      abort "torture: go is not installed (apt-get install golang-go, or pass --no-go)"
    end
    options
  end
end

if $PROGRAM_NAME == __FILE__
  options = Torture.parse(ARGV)
  puts "torture: #{RUBY_DESCRIPTION}; #{options.duration.round} s, seed #{options.seed}" unless options.quiet
  exit Torture::Run.new(options).call
end
