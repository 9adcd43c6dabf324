# frozen_string_literal: true

# The profiler configurations bench/run compares. Each `start` returns a
# stopper lambda (which may return extra numbers to report).
module BenchConfigs
  # The events the gem hooks (NEWOBJ + FREEOBJ), for the empty-hook floor.
  GEM_EVENTS = 1 | 2
  MECHANISMS = { tracepoint: 0, event_hook: 1 }.freeze

  def self.empty_hooks(mechanism, events)
    unless defined?(MemprofilerPprof::EmptyHooks)
      abort "bench: this build has no empty hooks; build with `rake compile` " \
            "(or MEMPROFILER_PPROF_RS_BENCH_HOOKS=1 when installing the gem)"
    end
    MemprofilerPprof::EmptyHooks._native_enable(MECHANISMS.fetch(mechanism), events)
    -> { MemprofilerPprof::EmptyHooks._native_disable && {} }
  end

  def self.gem(rate, **options)
    collector = MemprofilerPprof::Collector.new(sample_rate: rate, **options)
    collector.start!
    $bench_collector = collector
    lambda do
      memsize = ObjectSpace.memsize_of(collector)
      data = collector.flush
      collector.stop!
      { collector_bytes: memsize, allocation_samples: data.allocation_samples_count,
        heap_samples: data.heap_samples_count, dropped: data.dropped_samples_count }
    end
  end

  def self.stackprof(interval)
    require "stackprof"
    StackProf.start(mode: :object, interval: interval, raw: true)
    lambda do
      StackProf.stop
      result = StackProf.results
      { samples: result[:samples] }
    end
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
    }
  }.freeze

  DEFAULT = ALL.keys.first(8).freeze
end
