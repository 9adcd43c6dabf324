# frozen_string_literal: true

# The profiler configurations bench/run compares. Each `start` returns a
# stopper lambda (which may return extra numbers to report). The stopper
# takes `report: false` where only the hooks' cost counts (bench/run
# callgrind): it then stops without reading out what was recorded.
#
# A configuration of this gem with other Collector options is one line in
# ALL, named after its options by gem_config:
#
#   **gem_config(0.01, mode: :something),  # "memprofiler_pprof_rs 0.01, mode: :something"
#
# and `bench/run WORKLOAD --config NAME` adds it to a run.
module BenchConfigs
  class << self
    # Whether the Rack apps label each request (MemprofilerPprof::RackLabels).
    attr_accessor :rack_labels
  end

  # EmptyHooks' event bits (src/ruby/empty_hooks.rs; 4 is C_RETURN): the
  # gem hooks NEWOBJ and FREEOBJ, the single-hook floors one of them each.
  NEWOBJ = 1
  FREEOBJ = 2
  GEM_EVENTS = NEWOBJ | FREEOBJ
  MECHANISMS = { tracepoint: 0, event_hook: 1 }.freeze

  def self.empty_hooks(mechanism, events)
    unless defined?(MemprofilerPprof::EmptyHooks)
      abort "bench: this build has no empty hooks; build with `rake compile` " \
            "(or MEMPROFILER_PPROF_RS_BENCH_HOOKS=1 when installing the gem)"
    end
    MemprofilerPprof::EmptyHooks._native_enable(MECHANISMS.fetch(mechanism), events)
    ->(**) { MemprofilerPprof::EmptyHooks._native_disable && {} }
  end

  # In the Rack apps of bench/run: with this gem, a FileFlusher writing
  # into BENCH_PROFILE_DIR every BENCH_FLUSH_INTERVAL seconds (1 unless
  # given), the last 3 profiles kept.
  def self.start_flusher
    return unless $bench_collector

    pattern = File.join(ENV.fetch("BENCH_PROFILE_DIR"), "mem-%{index}.pprof")
    MemprofilerPprof::FileFlusher.new($bench_collector, pattern: pattern, interval: flush_interval, keep: 3).start!
  end

  def self.flush_interval
    Float(ENV.fetch("BENCH_FLUSH_INTERVAL", "1"))
  end

  def self.gem(rate, **options)
    collector = MemprofilerPprof::Collector.new(sample_rate: rate, **options)
    collector.start!
    $bench_collector = collector
    lambda do |report: true|
      unless report
        # With windows, the share of allocations sampled tells what a
        # count means; read without a flush, which would cost more
        # instructions than the windows save on a short loop.
        windows = collector.window_budget || collector.window_probability < 1.0
        coverage = collector.window_coverage if windows
        collector.stop!
        next coverage ? { window_coverage: coverage } : {}
      end

      memsize = ObjectSpace.memsize_of(collector)
      data = collector.flush
      collector.stop!
      { collector_bytes: memsize, allocation_samples: data.allocation_samples_count,
        heap_samples: data.heap_samples_count, dropped: data.dropped_samples_count,
        allocated_by_class: allocated_by_class(data.pprof_data) }
    end
  end

  # Estimated allocations by class (the profile's "class" label).
  def self.allocated_by_class(pprof)
    profile = MemprofilerPprof::PprofReader.parse(pprof)
    profile.samples.each_with_object(Hash.new(0)) do |sample, totals|
      klass = sample.labels.find { |label| label.key == "class" }&.str
      totals[klass] += sample.value(profile, "alloc_objects") if klass
    end
  end

  def self.stackprof(interval)
    require "stackprof"
    StackProf.start(mode: :object, interval: interval, raw: true)
    lambda do |report: true|
      StackProf.stop
      next {} unless report

      result = StackProf.results
      { samples: result[:samples] }
    end
  end

  # { name => starter } for this gem at `rate` with extra Collector options,
  # named "memprofiler_pprof_rs RATE, OPTION: VALUE, ...".
  def self.gem_config(rate, **options)
    name = ["memprofiler_pprof_rs #{rate}", *options.map { |key, value| "#{key}: #{value.inspect}" }].join(", ")
    { name => -> { gem(rate, **options) } }
  end

  ALL = {
    "no profiler" => -> {},
    # The same again, under another name: what a paired table reads where
    # nothing differs (the bench's own resolution and bias).
    "no profiler, control" => -> {},
    "floor: empty NEWOBJ+FREEOBJ TracePoint" => -> { empty_hooks(:tracepoint, GEM_EVENTS) },
    "floor: empty NEWOBJ+FREEOBJ event hook" => -> { empty_hooks(:event_hook, GEM_EVENTS) },
    # The defaults: mode :light, sampling windows with a budget of 100,000
    # hooked allocations a second after a warm-up of 250,000 (DEFAULTS).
    "memprofiler_pprof_rs 0.01" => -> { gem(0.01) },
    "memprofiler_pprof_rs 0.1" => -> { gem(0.1) },
    "memprofiler_pprof_rs 1.0" => -> { gem(1.0) },
    "stackprof object interval 100" => -> { stackprof(100) },
    "stackprof object interval 1" => -> { stackprof(1) },
    # Only where asked for (see bench/run):
    "empty C_RETURN TracePoint" => -> { empty_hooks(:tracepoint, 4) },
    "memprofiler_pprof_rs 1.0, caps lifted" => lambda {
      gem(1.0, max_allocation_samples: 100_000_000, max_heap_samples: 100_000_000)
    },
    # What one of the gem's two hooks costs by itself (bench/run deep and
    # callgrind): a profiler that hooked only NEWOBJ, or paid less for
    # FREEOBJ, could get below the two-hook floor.
    "floor: empty NEWOBJ event hook" => -> { empty_hooks(:event_hook, NEWOBJ) },
    "floor: empty FREEOBJ event hook" => -> { empty_hooks(:event_hook, FREEOBJ) },
    # The parts of the defaults (issue 19): both hooks always on (the
    # defaults before 0.2), no FREEOBJ hook with NEWOBJ always on, and
    # windows without a warm-up (the NEWOBJ hook on for a quarter, or a
    # tenth, of allocations, or as many as a budget allows).
    **gem_config(0.01, mode: :exact),
    # The defaults as they run at full speed on the loops (the budget
    # picks q of about 0.002 after the warm-up: windows of 1,000 hooked
    # allocations, ~30 a second), for callgrind: under valgrind the program
    # runs ~50 times slower and a budget, which follows the clock, would
    # keep the hook on far more often than it does for real.
    **gem_config(0.01, window_probability: 0.002),
    # (Before 0.3, when windows were GC cycles, q sat at its 0.01 floor.)
    **gem_config(0.01, window_probability: 0.01),
    # .. with longer warm-ups (1,000,000 was the first default).
    **gem_config(0.01, window_probability: 0.01, window_warm_up: 1_000_000),
    **gem_config(0.01, window_probability: 0.01, window_warm_up: 500_000),
    # .. and past the warm-up (a server's steady state).
    **gem_config(0.01, window_probability: 0.01, window_warm_up: 0),
    **gem_config(0.01, mode: :light, window_budget: nil),
    **gem_config(0.01, mode: :light, window_probability: 0.25, window_warm_up: 0),
    **gem_config(0.01, mode: :light, window_probability: 0.1, window_warm_up: 0),
    **gem_config(0.01, mode: :light, window_budget: 100_000, window_warm_up: 0),
    **gem_config(0.01, mode: :light, window_budget: 50_000, window_warm_up: 0),
    # Context labels (issue 33): the Rack apps put MemprofilerPprof::RackLabels
    # in front when rack_labels is set (bench/run puma|rails --only).
    "RackLabels, no profiler" => -> { self.rack_labels = true and nil },
    "memprofiler_pprof_rs 0.01 + RackLabels" => -> { (self.rack_labels = true) && gem(0.01) }
  }.freeze

  EXACT = "memprofiler_pprof_rs 0.01, mode: :exact"
  LIGHT = "memprofiler_pprof_rs 0.01, mode: :light, window_budget: nil"
  WINDOWED_TENTH = "memprofiler_pprof_rs 0.01, mode: :light, window_probability: 0.1, window_warm_up: 0"

  DEFAULT = [
    "no profiler", "floor: empty NEWOBJ+FREEOBJ TracePoint", "floor: empty NEWOBJ+FREEOBJ event hook",
    "memprofiler_pprof_rs 0.01", EXACT, LIGHT, WINDOWED_TENTH,
    "memprofiler_pprof_rs 0.1", "memprofiler_pprof_rs 1.0",
    "stackprof object interval 100", "stackprof object interval 1"
  ].freeze
  SINGLE_HOOK_FLOORS = ["floor: empty NEWOBJ event hook", "floor: empty FREEOBJ event hook"].freeze

  # Options a configuration named as gem_config names them may set, and
  # the values each takes as written there.
  INTEGER = /\A(?:\d+|\d{1,3}(?:_\d{3})+)\z/
  FRACTION = /\A\d+(?:\.\d+)?(?:e-\d+)?\z/
  NAMED_OPTIONS = {
    "mode" => /\A:(?:light|exact)\z/,
    "window_probability" => FRACTION,
    "window_budget" => /\A(?:nil|\d+|\d{1,3}(?:_\d{3})+)\z/,
    "window_warm_up" => INTEGER
  }.freeze
  PREFIX = "memprofiler_pprof_rs "

  # A configuration of ALL, or one written as gem_config names them
  # ("memprofiler_pprof_rs 0.001, window_probability: 0.047, window_warm_up: 0"):
  # bench/run callgrind --at-full-speed makes such names from what the
  # defaults chose. Collector.new checks the values further.
  def self.fetch(name)
    ALL.fetch(name) { parse(name) || raise(KeyError, "unknown bench configuration #{name.inspect}") }
  end

  def self.known?(name)
    ALL.key?(name) || !parse(name).nil?
  end

  def self.parse(name)
    return unless name.start_with?(PREFIX)

    rate, *pairs = name.delete_prefix(PREFIX).split(", ", -1)
    return unless rate.match?(FRACTION)

    options = {}
    pairs.each do |pair|
      key, value = pair.split(": ", 2)
      return nil unless NAMED_OPTIONS.key?(key) && value&.match?(NAMED_OPTIONS[key]) && !options.key?(key.to_sym)

      options[key.to_sym] = named_value(value)
    end
    return if options.key?(:window_probability) && options.key?(:window_budget)

    -> { gem(Float(rate), **options) }
  end

  def self.named_value(text)
    return nil if text == "nil"
    return text.delete_prefix(":").to_sym if text.start_with?(":")

    text.match?(INTEGER) ? Integer(text.delete("_")) : Float(text)
  end
end
