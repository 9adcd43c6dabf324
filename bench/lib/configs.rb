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

  def self.gem(rate, **options)
    collector = MemprofilerPprof::Collector.new(sample_rate: rate, **options)
    collector.start!
    $bench_collector = collector
    lambda do |report: true|
      unless report
        # With windows, the share of allocations sampled tells what a
        # count means (one flush: bench/run callgrind notes its cost).
        coverage = options[:window_probability] || options[:window_budget] ? collector.flush.window_coverage : nil
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
    "floor: empty NEWOBJ+FREEOBJ TracePoint" => -> { empty_hooks(:tracepoint, GEM_EVENTS) },
    "floor: empty NEWOBJ+FREEOBJ event hook" => -> { empty_hooks(:event_hook, GEM_EVENTS) },
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
    # The cheaper modes (issue 19): no FREEOBJ hook, then also sampling
    # windows (the NEWOBJ hook on in a quarter, or a tenth, of GC cycles).
    **gem_config(0.01, mode: :light),
    **gem_config(0.01, mode: :light, window_probability: 0.25),
    **gem_config(0.01, mode: :light, window_probability: 0.1),
    # Or q chosen to hook about 100,000 (or 50,000) allocations a second.
    **gem_config(0.01, mode: :light, window_budget: 100_000),
    **gem_config(0.01, mode: :light, window_budget: 50_000)
  }.freeze

  LIGHT = "memprofiler_pprof_rs 0.01, mode: :light"
  WINDOWED = "memprofiler_pprof_rs 0.01, mode: :light, window_probability: 0.25"
  WINDOWED_TENTH = "memprofiler_pprof_rs 0.01, mode: :light, window_probability: 0.1"
  BUDGETED = "memprofiler_pprof_rs 0.01, mode: :light, window_budget: 100000"

  DEFAULT = [
    "no profiler", "floor: empty NEWOBJ+FREEOBJ TracePoint", "floor: empty NEWOBJ+FREEOBJ event hook",
    "memprofiler_pprof_rs 0.01", LIGHT, WINDOWED, WINDOWED_TENTH, BUDGETED,
    "memprofiler_pprof_rs 0.1", "memprofiler_pprof_rs 1.0",
    "stackprof object interval 100", "stackprof object interval 1"
  ].freeze
  SINGLE_HOOK_FLOORS = ["floor: empty NEWOBJ event hook", "floor: empty FREEOBJ event hook"].freeze
end
