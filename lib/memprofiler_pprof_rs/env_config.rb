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

    # name => [default, parser, description of valid values]; the
    # collector's defaults are MemprofilerPprof::DEFAULTS.
    SETTINGS = {
      sample_rate: [DEFAULTS[:sample_rate], :fraction, "a number from 0 to 1"],
      alloc_retain_rate: [1.0, :fraction, "a number from 0 to 1"],
      max_alloc_samples: [DEFAULTS[:max_allocation_samples], :count, "a whole number >= 0"],
      max_heap_samples: [DEFAULTS[:max_heap_samples], :count, "a whole number >= 0"],
      flush_interval: [30.0, :seconds, "a number of seconds >= 0.1"],
      file_pattern: [FileFlusher::DEFAULT_PATTERN, :pattern, "a file name pattern"],
      keep_files: [nil, :positive_count, "a whole number >= 1"],
      file_mode: [FileOutput::FILE_MODE, :file_mode,
                  "an octal file permission that neither group nor others may write, such as 600, 640 or 644"],
      flush_at_exit: [true, :flag, "1/0, true/false, yes/no or on/off"],
      seed: [nil, :count, "a whole number >= 0"],
      mode: [DEFAULTS[:mode], :mode, LIGHT_MODE_SUPPORTED ? "exact or light" : "exact (light needs a Ruby before 4.0)"],
      window_probability: [1.0, :window_probability, "a number above 0, up to 1"],
      window_budget: [:auto, :window_budget, "a whole number >= 1, auto or none"],
      window_warm_up: [DEFAULTS[:window_warm_up], :count, "a whole number >= 0"],
      inuse_as_of: [:last_gc, :inuse_as_of, "last_gc or flush"],
      pyroscope_sample_labels: [:class_frame, :sample_labels, "keep, class_frame or drop"]
    }.freeze

    # What the wrapper's --help says of each setting; `usage` adds the
    # default from SETTINGS, so the two cannot disagree.
    HELP = {
      sample_rate: "fraction of allocations sampled",
      alloc_retain_rate: "fraction of samples kept in alloc_*",
      max_alloc_samples: "allocation samples kept per flush",
      max_heap_samples: "live objects tracked",
      flush_interval: "seconds between profiles",
      file_pattern: "where profiles go (keys: %{pid} %{isotime} %{unixtime} %{index})",
      keep_files: "keep only the newest N files per process",
      file_mode: "the files' permissions, octal (600: owner only; 640 or 644 to share; never writable " \
                 "by group or others)",
      flush_at_exit: "write a last profile at exit (1 or 0)",
      seed: "fixed seed for reproducible sampling",
      mode: "light (no FREEOBJ hook) or exact (both hooks always on)",
      window_probability: "share of allocations the hook sees, when no budget is set",
      window_budget: "allocations a second the hook sees once warmed up (a number, auto or none: " \
                     "every allocation)",
      window_warm_up: "allocations hooked in full first",
      inuse_as_of: "what inuse_* counts: objects alive at the last completed GC (last_gc), or every one not " \
                   "freed at the flush, garbage included (flush)",
      pyroscope_sample_labels: "what Pyroscope profiles carry of each sample's class (keep, class_frame or drop)"
    }.freeze

    USAGE_NAME_WIDTH = 40
    USAGE_WIDTH = 100

    # The settings part of the wrapper's --help: each variable, what it
    # does and its default.
    def self.usage
      SETTINGS.map do |name, (default, parser, _valid)|
        shown = usage_default(default, parser)
        text = shown.nil? ? HELP.fetch(name) : "#{HELP.fetch(name)} (default: #{shown})"
        usage_entry("#{PREFIXES.first}#{name.upcase}", text)
      end.join
    end

    def self.usage_default(default, parser)
      case [parser, default]
      in [_, nil] then nil
      in [:file_mode, Integer] then format("%o", default)
      in [:flag, _] then default ? "1" : "0"
      in [:window_budget, :auto] then "auto, #{DEFAULTS[:window_budget]}"
      in [:seconds, Float] if default == default.round then default.round.to_s
      else default.to_s
      end
    end

    def self.usage_entry(variable, text)
      indent = " " * (USAGE_NAME_WIDTH + 2)
      lines = text.split.each_with_object([+""]) do |word, out|
        out << +"" if !out.last.empty? && indent.size + out.last.size + 1 + word.size > USAGE_WIDTH
        out.last << " " unless out.last.empty?
        out.last << word
      end
      first = "  #{variable.ljust(USAGE_NAME_WIDTH)}"
      first = "  #{variable}\n#{indent}" if variable.size >= USAGE_NAME_WIDTH
      "#{first}#{lines.join("\n#{indent}")}\n"
    end
    private_class_method :usage_default, :usage_entry

    attr_reader :warnings

    def initialize(env = ENV)
      @env = env
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
          shown = if default.nil?
                    "none"
                  elsif parser == :file_mode
                    format("0%o", default)
                  else
                    default.inspect
                  end
          @warnings << "ignoring #{variable}=#{raw.inspect}: must be #{valid}#{detail}; using #{shown}"
          [name, default]
        end
      end
      exclude_window_probability_under_budget
    end

    SETTINGS.each_key do |name|
      define_method(name) { @values.fetch(name) }
    end

    def to_h
      @values.dup
    end

    # The settings and the Pyroscope server, never the environment: it
    # holds credentials (PYROSCOPE_BASIC_AUTH_PASSWORD, a password in
    # PYROSCOPE_SERVER_ADDRESS), which Object#inspect would show.
    def inspect
      address = @env["PYROSCOPE_SERVER_ADDRESS"].to_s.strip
      pyroscope = address.empty? ? "" : " pyroscope=#{PyroscopeAddress.redact(address)}"
      settings = @values.map { |name, value| "#{name}=#{value.inspect}" }.join(" ")
      "#<#{self.class.name} #{settings}#{pyroscope} warnings=#{@warnings.size}>"
    end
    alias to_s inspect

    # Keywords for Collector.new.
    def collector_options
      options = {
        sample_rate: sample_rate, allocation_retain_rate: alloc_retain_rate,
        max_allocation_samples: max_alloc_samples, max_heap_samples: max_heap_samples,
        mode: mode, window_probability: window_probability, window_budget: window_budget,
        window_warm_up: window_warm_up, inuse_as_of: inuse_as_of
      }
      options[:seed] = seed unless seed.nil?
      options
    end

    # Keywords for FileFlusher.new.
    def file_flusher_options
      { pattern: file_pattern, interval: flush_interval, keep: keep_files, flush_on_stop: flush_at_exit,
        mode: file_mode }
    end

    # True if a file pattern was set explicitly (with Pyroscope on, files
    # are written only then).
    def file_pattern_set?
      !lookup(@env, :file_pattern)[1].to_s.strip.empty?
    end

    # Keywords for PyroscopeFlusher.new from the variables Pyroscope's
    # agents use (PYROSCOPE_SERVER_ADDRESS, PYROSCOPE_APPLICATION_NAME,
    # PYROSCOPE_BASIC_AUTH_USER / _PASSWORD, PYROSCOPE_TENANT_ID, and
    # PYROSCOPE_TAGS or PYROSCOPE_LABELS as "k=v,k2=v2"), or nil when
    # PYROSCOPE_SERVER_ADDRESS is not set or a value is unusable (reported
    # in `warnings`). The interval is FLUSH_INTERVAL if set, else 15 s.
    def pyroscope_options
      address = @env["PYROSCOPE_SERVER_ADDRESS"].to_s.strip
      return nil if address.empty?

      options = {
        server_address: address,
        application_name: present("PYROSCOPE_APPLICATION_NAME") || default_application_name,
        labels: parse_tags(present("PYROSCOPE_TAGS") || present("PYROSCOPE_LABELS") || ""),
        basic_auth_username: present("PYROSCOPE_BASIC_AUTH_USER"),
        basic_auth_password: present("PYROSCOPE_BASIC_AUTH_PASSWORD"),
        tenant_id: present("PYROSCOPE_TENANT_ID"),
        interval: lookup(@env, :flush_interval)[1].to_s.strip.empty? ? 15.0 : flush_interval,
        flush_on_stop: flush_at_exit, sample_labels: pyroscope_sample_labels
      }
      # Checked now, so that a bad value is reported at boot, once.
      PyroscopeUploader.new(**options.slice(:server_address, :application_name, :labels, :basic_auth_username,
                                            :basic_auth_password, :tenant_id))
      options
    rescue ArgumentError, TypeError => e
      @warnings << "not sending profiles to Pyroscope: #{e.message}"
      nil
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

    # The parsers raise ArgumentError for a value they cannot use (the
    # checks are Validation's; a variable is always a String, so its
    # TypeErrors cannot happen).
    def parse_fraction(raw)
      Validation.fraction(Float(raw), :value)
    end

    def parse_count(raw)
      Validation.integer(Integer(raw, 10), :value, min: 0)
    end

    def parse_mode(raw)
      modes = LIGHT_MODE_SUPPORTED ? Collector::MODES.keys : [:exact]
      Validation.one_of(raw.to_sym, modes, :value)
    end

    def parse_inuse_as_of(raw)
      Validation.one_of(raw.to_sym, Collector::INUSE_AS_OF.keys, :value)
    end

    def parse_sample_labels(raw)
      Validation.one_of(raw.to_sym, Collector::SAMPLE_LABELS, :value)
    end

    # The collector takes one of the two: the budget, which adapts, wins.
    def exclude_window_probability_under_budget
      return unless @values[:window_budget].is_a?(Integer) && @values[:window_probability] < 1.0

      variable, raw = lookup(@env, :window_probability)
      @warnings << "ignoring #{variable}=#{raw.strip.inspect}: a window budget is set; using 1.0"
      @values[:window_probability] = 1.0
    end

    def parse_window_probability(raw)
      value = Validation.fraction(Float(raw), :value)
      raise ArgumentError, "" if value.zero?

      value
    end

    # A number, "auto" (Collector.new's default) or "none" (no budget).
    def parse_window_budget(raw)
      case raw.downcase
      when "auto" then :auto
      when "none" then nil
      else parse_positive_count(raw)
      end
    end

    def parse_positive_count(raw)
      Validation.integer(Integer(raw, 10), :value, min: 1)
    end

    # At least 0.1 s: a smaller value is almost certainly a unit mistake,
    # and would write thousands of files a second.
    def parse_seconds(raw)
      value = Validation.seconds(Float(raw), :value)
      raise ArgumentError, "must be at least 0.1 seconds" if value < 0.1

      value
    end

    # FileOutput's rule: not writable by group or others.
    def parse_file_mode(raw)
      raise ArgumentError, "" unless raw.match?(/\A0?[0-7]{3}\z/)

      FileOutput.validate_mode(Integer(raw, 8))
    end

    def parse_pattern(raw)
      FileFlusher.validate_pattern(raw)
      raw
    end

    def present(variable)
      value = @env[variable].to_s.strip
      value.empty? ? nil : value
    end

    def default_application_name
      name = File.basename($PROGRAM_NAME.to_s).gsub(%r{[^A-Za-z0-9_.\-/]}, "_")
      name.empty? ? "ruby" : name
    end

    def parse_tags(raw)
      raw.split(",").map(&:strip).reject(&:empty?).to_h do |pair|
        key, value = pair.split("=", 2)
        raise ArgumentError, "PYROSCOPE_TAGS entry #{pair.inspect} is not key=value" if value.nil? || key.empty?

        [key.strip, value.strip]
      end
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
