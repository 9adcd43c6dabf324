# frozen_string_literal: true

module MemprofilerPprof
  # Samples allocations (NEWOBJ), tracks which sampled objects are still alive
  # (FREEOBJ), and turns both into a gzipped pprof profile on #flush.
  #
  #   collector = MemprofilerPprof::Collector.new(sample_rate: 0.01)
  #   collector.start!
  #   ... run code ...
  #   File.binwrite("heap.pprof", collector.flush.pprof_data)
  class Collector
    # How backtraces are read: :cfp walks the VM's frames in one call; :slowrb
    # walks them one frame per call (same stacks, slower; kept for
    # ruby_memprofiler_pprof compatibility).
    BT_METHODS = { cfp: 0, slowrb: 1 }.freeze

    # When new samples are measured: :postponed_job (default) at Ruby's next
    # safe point after the allocation; :c_return on the next return from a C
    # method, as ruby_memprofiler_pprof does (every C return then pays for a
    # hook, so only choose it to reproduce that gem's numbers).
    SIZE_MEASUREMENTS = { postponed_job: 0, c_return: 1 }.freeze

    attr_reader :bt_method, :size_measurement

    private_class_method :_native_pause_all_for_ractors

    def initialize(sample_rate: 0.01, max_allocation_samples: 10_000, max_heap_samples: 50_000,
                   bt_method: :cfp, allocation_retain_rate: 1.0, size_measurement: :postponed_job)
      _native_configure(
        self.class.validate_fraction(sample_rate, :sample_rate),
        self.class.validate_count(max_allocation_samples, :max_allocation_samples),
        self.class.validate_count(max_heap_samples, :max_heap_samples)
      )
      self.bt_method = bt_method
      self.allocation_retain_rate = allocation_retain_rate
      self.size_measurement = size_measurement
      @flush_lock = Mutex.new
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
      code = BT_METHODS.fetch(method) do
        raise ArgumentError, "bt_method must be one of #{BT_METHODS.keys.inspect}, got #{method.inspect}"
      end
      _native_set_bt_method(code)
      @bt_method = method
    end

    def size_measurement=(mode)
      code = SIZE_MEASUREMENTS.fetch(mode) do
        raise ArgumentError,
              "size_measurement must be one of #{SIZE_MEASUREMENTS.keys.inspect}, got #{mode.inspect}"
      end
      _native_set_size_measurement(code)
      @size_measurement = mode
    end

    # Starts sampling. Clears samples and drop counters of any earlier run.
    # Does nothing (returns false) if already running.
    def start!
      _native_start(RactorSafety.other_ractors_alive?)
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
    # steps that need the GVL. (ruby_memprofiler_pprof 0.0.4's keywords.)
    #
    # Flushes of one collector from several threads run one after another.
    def flush(yield_gvl: false, proactively_yield_gvl: false)
      self.class.validate_flag(yield_gvl, :yield_gvl)
      self.class.validate_flag(proactively_yield_gvl, :proactively_yield_gvl)
      @flush_lock.synchronize do
        _native_resume_after_ractors unless RactorSafety.other_ractors_alive?
        ProfileData.from_native(_native_flush(yield_gvl, proactively_yield_gvl))
      end
    end

    # start!, run the block, flush, stop!; returns the ProfileData. The hooks
    # are off again even if the block raises.
    def profile(**flush_options)
      raise ArgumentError, "#{self.class}#profile needs a block" unless block_given?

      start!
      begin
        yield
        flush(**flush_options)
      ensure
        stop!
      end
    end

    # Hook failures caught inside the extension (should stay 0; for diagnosis).
    def internal_error_count
      _native_internal_error_count
    end

    # ----- argument checks (shared by initialize and the setters) -----

    def self.validate_fraction(rate, name)
      unless rate.is_a?(Integer) || rate.is_a?(Float) || rate.is_a?(Rational)
        raise TypeError, "#{name} must be a Float between 0.0 and 1.0, got #{rate.inspect}"
      end

      rate = rate.to_f
      unless rate.finite? && rate >= 0.0 && rate <= 1.0
        raise ArgumentError, "#{name} must be between 0.0 and 1.0, got #{rate.inspect}"
      end

      rate
    end

    # Largest cap passed to the extension; larger values mean "no cap" anyway.
    MAX_CAP = (2**62) - 1

    def self.validate_count(count, name)
      raise TypeError, "#{name} must be an Integer, got #{count.inspect}" unless count.is_a?(Integer)
      raise ArgumentError, "#{name} must be >= 0, got #{count}" if count.negative?

      [count, MAX_CAP].min
    end

    def self.validate_flag(value, name)
      return if value == true || value == false

      raise TypeError, "#{name} must be true or false, got #{value.inspect}"
    end
  end

  # Ruby's NEWOBJ hooks are not safe while a non-main Ractor allocates (on
  # Ruby 3.1 the interpreter itself crashes, with any such hook), and they
  # only ever see the Ractor that enabled them. So allocation sampling pauses
  # from the moment a Ractor is created until only the main Ractor is left
  # (checked at start! and flush); frees are still tracked meanwhile.
  module RactorSafety
    def self.other_ractors_alive?
      defined?(Ractor) ? Ractor.count > 1 : false
    end

    # Prepended to Ractor's singleton class.
    module PauseSamplingOnNew
      def new(*args, **kwargs, &block)
        MemprofilerPprof::Collector.__send__(:_native_pause_all_for_ractors)
        super
      end
    end

    Ractor.singleton_class.prepend(PauseSamplingOnNew) if defined?(Ractor)
  end
end
