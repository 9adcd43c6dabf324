# frozen_string_literal: true

module MemprofilerPprof
  # Profiling settings read from environment variables, for the wrapper
  # executable (and anyone who wants the same knobs in an initializer).
  #
  # Each setting is read from MEMPROFILER_PPROF_RS_<NAME>, or else from
  # ruby_memprofiler_pprof's RUBY_MEMPROFILER_PPROF_<NAME>. A value that does
  # not parse is reported (with the variable's name) through `warnings` and
  # the default is used instead: a typo must never stop a program from
  # booting.
  class EnvConfig
    PREFIXES = %w[MEMPROFILER_PPROF_RS_ RUBY_MEMPROFILER_PPROF_].freeze

    # name => [default, parser, description of valid values]
    SETTINGS = {
      sample_rate: [0.01, :fraction, "a number from 0 to 1"],
      alloc_retain_rate: [1.0, :fraction, "a number from 0 to 1"],
      max_alloc_samples: [10_000, :count, "a whole number >= 0"],
      max_heap_samples: [50_000, :count, "a whole number >= 0"],
      flush_interval: [30.0, :seconds, "a number of seconds >= 0.1"],
      file_pattern: [FileFlusher::DEFAULT_PATTERN, :pattern, "a file name pattern"],
      keep_files: [nil, :positive_count, "a whole number >= 1"],
      flush_at_exit: [true, :flag, "1/0, true/false, yes/no or on/off"],
      seed: [nil, :count, "a whole number >= 0"]
    }.freeze

    attr_reader :warnings

    def initialize(env = ENV)
      @warnings = []
      @values = SETTINGS.to_h do |name, (default, parser, valid)|
        variable, raw = lookup(env, name)
        next [name, default] if raw.nil? || raw.strip.empty?

        begin
          [name, send(:"parse_#{parser}", raw.strip)]
        rescue ArgumentError => e
          # Float()/Integer() messages only repeat the value; a pattern's
          # message says what is wrong with it.
          detail = parser == :pattern ? " (#{e.message})" : ""
          @warnings << "ignoring #{variable}=#{raw.inspect}: must be #{valid}#{detail}; " \
                       "using #{default.nil? ? 'none' : default.inspect}"
          [name, default]
        end
      end
    end

    SETTINGS.each_key do |name|
      define_method(name) { @values.fetch(name) }
    end

    def to_h
      @values.dup
    end

    # Keywords for Collector.new.
    def collector_options
      options = {
        sample_rate: sample_rate, allocation_retain_rate: alloc_retain_rate,
        max_allocation_samples: max_alloc_samples, max_heap_samples: max_heap_samples
      }
      options[:seed] = seed unless seed.nil?
      options
    end

    # Keywords for FileFlusher.new.
    def file_flusher_options
      { pattern: file_pattern, interval: flush_interval, keep: keep_files, flush_on_stop: flush_at_exit }
    end

    private

    def lookup(env, name)
      PREFIXES.each do |prefix|
        variable = "#{prefix}#{name.to_s.upcase}"
        value = env[variable]
        # An empty value counts as unset, so the next prefix still applies.
        return [variable, value] unless value.nil? || value.strip.empty?
      end
      [nil, nil]
    end

    def parse_fraction(raw)
      value = Float(raw)
      raise ArgumentError, "" unless value.finite? && value >= 0.0 && value <= 1.0

      value
    end

    def parse_count(raw)
      value = Integer(raw, 10)
      raise ArgumentError, "" if value.negative?

      value
    end

    def parse_positive_count(raw)
      value = parse_count(raw)
      raise ArgumentError, "" if value.zero?

      value
    end

    # At least 0.1 s: a smaller value is almost certainly a unit mistake,
    # and would write thousands of files a second.
    def parse_seconds(raw)
      value = Float(raw)
      raise ArgumentError, "" unless value.finite? && value >= 0.1

      value
    end

    def parse_pattern(raw)
      FileFlusher.validate_pattern(raw)
      raw
    end

    def parse_flag(raw)
      case raw.downcase
      when "1", "true", "yes", "on" then true
      when "0", "false", "no", "off" then false
      else raise ArgumentError, ""
      end
    end
  end
end
