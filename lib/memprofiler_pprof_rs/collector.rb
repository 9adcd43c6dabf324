# frozen_string_literal: true

module MemprofilerPprof
  # Samples allocations (NEWOBJ: by default every one for the first
  # 250,000, then in short windows at random places; see window_budget), tracks which
  # sampled objects are still alive, and turns both into a gzipped pprof
  # profile on #flush.
  #
  #   collector = MemprofilerPprof::Collector.new(sample_rate: 0.01)
  #   collector.start!
  #   ... run code ...
  #   File.binwrite("heap.pprof", collector.flush.pprof_data)
  class Collector
    # ruby_memprofiler_pprof's backtrace methods. There, :cfp read the VM's
    # internal frame structs and :slowrb used the public rb_profile_frames.
    # This gem never reads internal structs (their layout changes between
    # Ruby versions), so both capture through rb_profile_frames, without
    # allocating, and give identical stacks.
    BT_METHODS = %i[cfp slowrb].freeze

    # When new samples are measured: :postponed_job (default) at Ruby's next
    # safe point after the allocation; :c_return on the next return from a C
    # method, as ruby_memprofiler_pprof does (every C return then pays for a
    # hook, so only choose it to reproduce that gem's numbers).
    SIZE_MEASUREMENTS = { postponed_job: 0, c_return: 1 }.freeze

    # How deaths of sampled objects are found. :exact: Ruby's FREEOBJ hook
    # runs on every free in the process, so a live sample's death is seen
    # as it happens. :light (default before Ruby 4.0, refused from 4.0 on:
    # see LIGHT_MODE_SUPPORTED): no FREEOBJ hook; each tracked
    # sample gets its object's id (as Object#object_id would), and samples
    # whose object is gone are found at each flush and whenever the tracked
    # set has grown enough. Cheaper on code that allocates and frees a lot
    # (see docs/performance.md); the profile's numbers are the same kind.
    MODES = { exact: 0, light: 1 }.freeze

    # What inuse_* counts. :last_gc (default): the sampled objects alive at
    # the last completed GC, as Go's heap profile does: an object allocated
    # since is not known to be alive yet (most are garbage not collected
    # yet), so it counts in inuse_* once a GC has run after its allocation
    # (alloc_* counts it at once). :flush: every sampled object not freed
    # at the flush, garbage included (what a script that calls GC.start
    # before flushing sees either way).
    INUSE_AS_OF = { last_gc: 0, flush: 1 }.freeze

    # flush's sample_labels choices, in the native code's order.
    SAMPLE_LABELS = %i[keep class_frame drop].freeze

    attr_reader :bt_method, :size_measurement, :mode, :window_probability, :window_budget, :window_warm_up,
                :inuse_as_of

    private_class_method :_native_pause_all_for_ractors

    # seed: an Integer makes the sampling reproducible (same allocations, same
    # samples); nil (the default) seeds from the clock and process id.
    # Defaults: MemprofilerPprof::DEFAULTS (defined by the extension).
    # window_budget: :auto (the default) is DEFAULTS[:window_budget] in
    # mode :light below sample_rate 1.0 without a window_probability, and
    # nil (every allocation hooked) otherwise: sample_rate 1.0 asks for
    # every allocation, and mode :exact for the hooks always on.
    def initialize(sample_rate: DEFAULTS[:sample_rate], max_allocation_samples: DEFAULTS[:max_allocation_samples],
                   max_heap_samples: DEFAULTS[:max_heap_samples], bt_method: :cfp, allocation_retain_rate: 1.0,
                   size_measurement: :postponed_job, mode: DEFAULTS[:mode], window_probability: 1.0,
                   window_budget: :auto, window_warm_up: DEFAULTS[:window_warm_up], inuse_as_of: :last_gc,
                   seed: nil)
      _native_configure(
        self.class.validate_fraction(sample_rate, :sample_rate),
        self.class.validate_count(max_allocation_samples, :max_allocation_samples),
        self.class.validate_count(max_heap_samples, :max_heap_samples)
      )
      self.bt_method = bt_method
      self.allocation_retain_rate = allocation_retain_rate
      self.size_measurement = size_measurement
      self.mode = mode
      self.window_probability = window_probability
      self.window_budget = window_budget
      self.window_warm_up = window_warm_up
      self.inuse_as_of = inuse_as_of
      _native_set_seed(self.class.validate_seed(seed)) unless seed.nil?
      @flush_lock = Mutex.new
    end

    # A copy would share nothing with the original's samples or hooks, so
    # copying is refused rather than half-done.
    def initialize_copy(_other)
      raise TypeError, "#{self.class} can't be copied (create a new one with the same options)"
    end

    def sample_rate=(rate)
      _native_set_sample_rate(self.class.validate_fraction(rate, :sample_rate))
    end

    def max_allocation_samples=(count)
      _native_set_max_allocation_samples(self.class.validate_count(count, :max_allocation_samples))
    end

    def max_heap_samples=(count)
      _native_set_max_heap_samples(self.class.validate_count(count, :max_heap_samples))
    end

    # Fraction of measured samples kept in the allocation profile (alloc_*);
    # the others only count while alive (inuse_*). Kept ones are re-weighted,
    # so alloc_* totals stay estimates of the true totals.
    def allocation_retain_rate=(rate)
      _native_set_allocation_retain_rate(self.class.validate_fraction(rate, :allocation_retain_rate))
    end

    def bt_method=(method)
      @bt_method = Validation.one_of(method, BT_METHODS, :bt_method)
    end

    def size_measurement=(mode)
      Validation.one_of(mode, SIZE_MEASUREMENTS.keys, :size_measurement)
      _native_set_size_measurement(SIZE_MEASUREMENTS.fetch(mode))
      @size_measurement = mode
    end

    # See INUSE_AS_OF; also while running (from the next flush).
    def inuse_as_of=(choice)
      Validation.one_of(choice, INUSE_AS_OF.keys, :inuse_as_of)
      _native_set_inuse_as_of(INUSE_AS_OF.fetch(choice))
      @inuse_as_of = choice
    end

    # Only while stopped; forgets what was sampled (see MODES). :light is
    # refused on Ruby 4.0 and later (LIGHT_MODE_SUPPORTED), where :exact is
    # the default.
    def mode=(mode)
      Validation.one_of(mode, MODES.keys, :mode)
      if mode == :light && !LIGHT_MODE_SUPPORTED
        raise UnsupportedRuntimeError,
              "mode: :light is not supported on Ruby #{RUBY_VERSION} (it reads object ids, which Ruby 4.0 " \
              "moved into the object); use mode: :exact, the default on this Ruby"
      end
      _native_set_mode(MODES.fetch(mode))
      @mode = mode
      apply_window_budget(auto_window_budget) if @window_budget_auto
    end

    # Sampling windows: each allocation is in a window (the NEWOBJ hook
    # on) with this probability, from 1.0 (always: no windows) down to just
    # above 0: windows of 1,000 consecutive allocations, one at a random
    # place in each block of 1,000 / probability. Ruby's NEWOBJ hook slows
    # every allocation while it is on, so 0.25 costs about a quarter of
    # that (plus the hook's lead-in before each window). Each sample weighs
    # 1 / (its sample rate x the probability), so estimates are unbiased;
    # inside windows the sample rate is sample_rate / probability, up to
    # 0.1, so as many samples are taken as without windows where that
    # allows (see docs/performance.md). Only while stopped.
    def window_probability=(probability)
      q = self.class.validate_fraction(probability, :window_probability)
      if window_budget && q < 1.0 && !@window_budget_auto
        raise ArgumentError, "window_probability #{probability.inspect} and window_budget #{window_budget} " \
                             "exclude each other (set window_budget = nil first)"
      end
      raise "window_probability can only be changed while the collector is stopped" if running?

      @window_probability = probability
      if @window_budget_auto
        # The automatic budget gives way to a probability, and comes back
        # with 1.0.
        apply_window_budget(auto_window_budget)
      elsif !window_budget
        _native_set_window_probability(q)
      end
    end

    # Sampling windows whose probability is chosen for you: at most about
    # this many allocations a second go through the NEWOBJ hook. For each
    # block of allocations the probability becomes this over the process's
    # recent allocation rate (and the hook's lead-in before each window; at
    # most 1.0, at least 0.001), so a process that allocates less keeps the
    # hook on all the time, and a busy server pays for about this many (at
    # the 80-300 ns per hooked allocation measured in bench/, 100,000 a
    # second is 0.8-3% of a core, and the samples as much again). Each sample
    # is weighted by its window's probability. :auto (the default): DEFAULTS[:window_budget]
    # in mode :light below sample_rate 1.0 without a window_probability
    # (re-chosen when mode or window_probability change; sample_rate= does
    # not change it), else nil; nil: no budget. A number excludes a
    # window_probability below 1.0. Only while stopped.
    def window_budget=(per_second)
      @window_budget_auto = per_second == :auto
      apply_window_budget(@window_budget_auto ? auto_window_budget : per_second)
    end

    # Every allocation is hooked until this many have been made since
    # start!: a short profile (a block, a test, a script) is then complete,
    # at the sample rate, and a busy server pays for the hook in less than
    # its first second only. 0: windows from the start. Only while stopped.
    def window_warm_up=(allocations)
      Validation.integer(allocations, :window_warm_up, min: 0)
      _native_set_window_warm_up(allocations)
      @window_warm_up = allocations
    end

    # Starts sampling. Clears samples and drop counters of any earlier run.
    # Does nothing (returns false) if already running. Raises
    # UnsupportedRuntimeError under a GC other than Ruby's default one.
    def start!
      GCSupport.check!
      @label_folds_seen ||= Labels.folds
      _native_start(RactorSafety.ractors_used?)
    end

    # Stops sampling. What was collected stays readable and flushable.
    # Returns false if it was not running.
    def stop!
      _native_stop
    end

    # Returns a ProfileData for the interval since the last flush (or start!):
    # allocations of the interval and everything sampled that is still alive.
    # Allocations made while a flush runs go to the next one.
    #
    # yield_gvl: build and compress the profile without holding the GVL.
    # proactively_yield_gvl: also let other threads run between the flush's
    # steps that need the GVL (measuring live objects, naming frames).
    # These are ruby_memprofiler_pprof 0.0.4's keywords, but on by default
    # here: with both, a flush of 50,000 live samples holds the GVL for at
    # most ~3 ms at a time instead of ~100 ms in one go (see
    # bench/run flush). Pass false to get that gem's behaviour.
    #
    # max_profile_bytes: if the uncompressed profile would be larger, the
    # samples with the fewest bytes are folded into one "(other)" sample
    # (totals unchanged) until it fits; ProfileData#folded_samples_count
    # says how many, and a profile comment says so too. The sizes are
    # measured by building the profile (a few times at most, and only when
    # it is over the limit).
    # max_profile_samples: the same, for a profile of at most this many
    # samples, "(other)" included (Pyroscope refuses more than 16,000).
    #
    # sample_labels: where each sample's class and GC age go.
    # - :keep (the default): a `class` label and, on live samples, a
    #   `gc_age` label (`go tool pprof -tagfocus`, the CLI's `--by class`).
    # - :class_frame: the class as the stack's leaf frame, and no labels.
    #   For Grafana Pyroscope (PyroscopeFlusher's default): it makes every
    #   distinct label value a series of its own, and 3,000 classes exceed
    #   its default limit of 5,000 active series.
    # - :drop: neither; samples differ by stack only, as in Go's heap
    #   profiles.
    #
    # Flushes of one collector from several threads run one after another.
    def flush(yield_gvl: true, proactively_yield_gvl: true, max_profile_bytes: nil, max_profile_samples: nil,
              sample_labels: :keep)
      self.class.validate_flag(yield_gvl, :yield_gvl)
      self.class.validate_flag(proactively_yield_gvl, :proactively_yield_gvl)
      Validation.integer(max_profile_bytes, :max_profile_bytes, min: 1) unless max_profile_bytes.nil?
      Validation.integer(max_profile_samples, :max_profile_samples, min: 1) unless max_profile_samples.nil?
      # A case, not SAMPLE_LABELS.index: the constant's first lookup at this
      # call site allocates (a Hash on Ruby 3.1), inside the profile.
      labels = case sample_labels
               when :keep then 0
               when :class_frame then 1
               when :drop then 2
               else Validation.one_of(sample_labels, SAMPLE_LABELS, :sample_labels)
               end

      # (No extra method call on the common path: the first call of each
      # call site allocates an inline cache, which the flush would sample.)
      lock = @flush_lock || flush_lock
      begin
        lock.synchronize do
          values = _native_flush(yield_gvl, proactively_yield_gvl, max_profile_bytes, max_profile_samples, labels)
          # (After the native flush: what this allocates is not in its profile.)
          folds = Labels.folds
          folded = folds - (@label_folds_seen || folds)
          @label_folds_seen = folds
          ProfileData.from_native(values, sample_labels: sample_labels, label_sets_folded: folded)
        end
      rescue ThreadError => e
        # A flush interrupted by a finalizer or a signal trap on its own
        # thread, which flushes again: waiting for the outer flush would
        # wait forever (in a trap handler, even SIGTERM could not end the
        # process).
        if lock.owned?
          raise "#{self.class}#flush called while this thread is already flushing this collector " \
                "(from a finalizer or signal trap that interrupted the flush?)"
        end
        raise unless e.message.include?("trap context")

        # Mutex#synchronize refuses to run in a signal trap handler; another
        # thread may, and the handler waits for it.
        Thread.new do
          flush(yield_gvl: yield_gvl, proactively_yield_gvl: proactively_yield_gvl,
                max_profile_bytes: max_profile_bytes, max_profile_samples: max_profile_samples,
                sample_labels: sample_labels)
        end.value
      end
    end

    # start!, run the block, flush, stop!; returns the ProfileData. The hooks
    # are off again even if the block raises. alloc_* is what the block
    # allocated; with inuse_as_of :last_gc, inuse_* is what it left alive
    # (a full GC runs after the block, as memory_profiler's "retained" does).
    def profile(**flush_options)
      raise ArgumentError, "#{self.class}#profile needs a block" unless block_given?

      start!
      begin
        yield
        GC.start if @inuse_as_of == :last_gc
        # flush(**{}) allocates a Hash on Ruby 3.3+, inside the interval
        # the profile covers.
        flush_options.empty? ? flush : flush(**flush_options)
      ensure
        stop!
      end
    end

    # What keeps memory alive: for the `top` sites with the most estimated
    # bytes in use (or those `sites` names: Strings found in a site's name,
    # or Regexps), the shortest chain of references from a GC root to
    # `per_site` of their sampled objects, each hop named (a constant, an
    # instance variable, a Hash key, an Array index...). Returns a
    # RetentionReport (#to_s for text, #save for the CLI). Made in a forked
    # child that walks its copy of the heap: this process pays the fork and
    # waits without the GVL, at most `timeout` seconds; a walk cut short by
    # `timeout`, `max_objects` or `max_memory_mb` (the child's own memory)
    # gives a partial report. Raises RetentionError when it cannot be made
    # (no fork, another report running, the child did not answer). `gc:
    # true` runs a full GC first (its pause is this process's), so that no
    # garbage not yet collected is among the sampled objects.
    def retention_report(top: 5, per_site: 3, sites: nil, timeout: 30, max_objects: 5_000_000, max_memory_mb: 512,
                         gc: false)
      Retention.report(self, top: top, per_site: per_site, sites: sites, timeout: timeout,
                             max_objects: max_objects, max_memory_mb: max_memory_mb, gc: gc)
    end

    # Hook failures caught inside the extension (should stay 0; for diagnosis).
    def internal_error_count
      _native_internal_error_count
    end

    # ----- argument checks (shared by initialize and the setters) -----

    # Any real Numeric (Integer, Float, Rational, BigDecimal, ...); see
    # Validation.fraction.
    def self.validate_fraction(rate, name)
      Validation.fraction(rate, name)
    end

    # Largest cap passed to the extension; larger values mean "no cap" anyway.
    MAX_CAP = (2**62) - 1

    def self.validate_count(count, name)
      [Validation.integer(count, name, min: 0), MAX_CAP].min
    end

    def self.validate_seed(seed)
      Validation.integer(seed, :seed, min: 0, max: MAX_CAP, expected: "an Integer from 0 to #{MAX_CAP} or nil")
    end

    def self.validate_flag(value, name)
      Validation.flag(value, name)
    end

    # Guards creation of the flush lock of a subclass whose initialize does
    # not call super (the native part works without initialize).
    FLUSH_LOCK_GUARD = Mutex.new
    private_constant :FLUSH_LOCK_GUARD

    private

    def apply_window_budget(per_second)
      Validation.integer(per_second, :window_budget, min: 1, nil_ok: true)
      if per_second && window_probability.to_f < 1.0
        raise ArgumentError, "window_budget #{per_second} and window_probability #{window_probability} " \
                             "exclude each other (set window_probability = 1.0 first)"
      end
      if per_second
        _native_set_window_budget(per_second)
      else
        _native_set_window_probability(self.class.validate_fraction(window_probability || 1.0, :window_probability))
      end
      @window_budget = per_second
    end

    # See initialize's window_budget: :auto.
    def auto_window_budget
      return nil unless mode == :light && window_probability.to_f >= 1.0

      sample_rate < 1.0 ? DEFAULTS[:window_budget] : nil
    end

    def flush_lock
      @flush_lock || FLUSH_LOCK_GUARD.synchronize { @flush_lock ||= Mutex.new }
    end
  end

  # Raised where the gem cannot profile safely: by Collector#start! under
  # another GC, and by Collector#mode= for :light on Ruby 4.0 and later.
  class UnsupportedRuntimeError < StandardError
    include Error
  end

  # Since Ruby 3.4 a process can run another GC than the default one
  # (RUBY_GC_LIBRARY, e.g. MMTk, an opt-in build of Ruby 4.0). The gem is
  # built on the default GC's contract: FREEOBJ hooks called on the thread
  # that holds the GVL, objects moved only by GC.compact. MMTk calls FREEOBJ
  # from its own worker threads, where this gem's hook must not run; so
  # start! refuses any GC but the default one, with a message that names it.
  module GCSupport
    def self.implementation
      return "default" unless GC.respond_to?(:config)

      GC.config.fetch(:implementation, "default").to_s
    end

    def self.check!
      name = implementation
      return if name == "default"

      raise UnsupportedRuntimeError,
            "memprofiler_pprof_rs supports Ruby's default GC only; this process runs the #{name.inspect} " \
            "GC (RUBY_GC_LIBRARY)"
    end
  end

  # Ruby's GC event hooks (NEWOBJ, FREEOBJ) are not safe once Ractors run:
  # on Ruby 3.1 an allocation or GC in a Ractor's thread crashes inside the
  # interpreter whenever any such hook is enabled (ObjectSpace's allocation
  # tracing crashes the same way), even while a finished Ractor's thread is
  # still winding down after Ractor.count is back to 1. Up to Ruby 3.4 the
  # hooks only see the Ractor that enabled them; from Ruby 4.0 they fire in
  # every Ractor, in parallel, which this gem's hooks are not written for.
  # So from the first Ractor.new on, every collector's hooks are off for the
  # rest of the process: `sampling_paused_for_ractors?` says so, and data
  # collected before stays flushable.
  module RactorSafety
    @ractors_used = false

    class << self
      def ractors_used?
        @ractors_used || (defined?(Ractor) ? Ractor.count > 1 : false)
      end

      def ractor_created!
        @ractors_used = true
        MemprofilerPprof::Collector.__send__(:_native_pause_all_for_ractors)
      end
    end

    # Prepended to Ractor's singleton class.
    module PauseSamplingOnNew
      def new(*args, **kwargs, &block)
        # A Ractor made by another Ractor: Ractors already exist, so the
        # hooks are already off, and module state is not writable there
        # (trying would make every nested Ractor.new raise IsolationError).
        MemprofilerPprof::RactorSafety.ractor_created! if Ractor.current == Ractor.main
        super
      end
    end

    Ractor.singleton_class.prepend(PauseSamplingOnNew) if defined?(Ractor)
  end
end
