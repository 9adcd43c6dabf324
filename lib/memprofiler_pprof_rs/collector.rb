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
    BT_METHODS = %i[cfp].freeze

    def initialize(sample_rate: 0.01, max_allocation_samples: 10_000, max_heap_samples: 50_000,
                   bt_method: :cfp)
      _native_configure(
        self.class.validate_rate(sample_rate),
        self.class.validate_count(max_allocation_samples, :max_allocation_samples),
        self.class.validate_count(max_heap_samples, :max_heap_samples)
      )
      self.bt_method = bt_method
    end

    def sample_rate=(rate)
      _native_set_sample_rate(self.class.validate_rate(rate))
    end

    def max_allocation_samples=(count)
      _native_set_max_allocation_samples(self.class.validate_count(count, :max_allocation_samples))
    end

    def max_heap_samples=(count)
      _native_set_max_heap_samples(self.class.validate_count(count, :max_heap_samples))
    end

    attr_reader :bt_method

    # How backtraces are captured. :cfp walks the VM's frames directly,
    # without allocating (the C gem's default).
    def bt_method=(method)
      unless BT_METHODS.include?(method)
        raise ArgumentError, "bt_method must be one of #{BT_METHODS.inspect}, got #{method.inspect}"
      end

      @bt_method = method
    end

    # Starts sampling. Clears samples and drop counters of any earlier run.
    # Does nothing (returns false) if already running.
    def start!
      _native_start
    end

    # Stops sampling. What was collected stays readable and flushable.
    # Returns false if it was not running.
    def stop!
      _native_stop
    end

    # Returns a ProfileData for the interval since the last flush (or start!):
    # allocations of the interval and everything sampled that is still alive.
    # yield_gvl and proactively_yield_gvl are accepted for compatibility with
    # ruby_memprofiler_pprof 0.0.4.
    def flush(yield_gvl: false, proactively_yield_gvl: false)
      self.class.validate_flag(yield_gvl, :yield_gvl)
      self.class.validate_flag(proactively_yield_gvl, :proactively_yield_gvl)
      ProfileData.from_native(_native_flush)
    end

    # start!, run the block, flush, stop!; returns the ProfileData. The hooks
    # are off again even if the block raises.
    def profile
      raise ArgumentError, "#{self.class}#profile needs a block" unless block_given?

      start!
      begin
        yield
        flush
      ensure
        stop!
      end
    end

    # Hook failures caught inside the extension (should stay 0; for diagnosis).
    def internal_error_count
      _native_internal_error_count
    end

    # ----- argument checks (shared by initialize and the setters) -----

    def self.validate_rate(rate)
      unless rate.is_a?(Integer) || rate.is_a?(Float) || rate.is_a?(Rational)
        raise TypeError, "sample_rate must be a Float between 0.0 and 1.0, got #{rate.inspect}"
      end

      rate = rate.to_f
      unless rate.finite? && rate >= 0.0 && rate <= 1.0
        raise ArgumentError, "sample_rate must be between 0.0 and 1.0, got #{rate.inspect}"
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
end
