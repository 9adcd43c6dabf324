# frozen_string_literal: true

module MemprofilerPprof
  # The result of Collector#flush: a gzipped pprof profile plus counts that
  # say how complete it is.
  class ProfileData
    # The gzipped pprof profile (binary String).
    attr_reader :pprof_data
    # Sampled allocations in this interval, and sampled objects alive at flush.
    attr_reader :allocation_samples_count, :heap_samples_count
    # Samples not taken, by reason: lock busy, allocation buffer full, heap
    # buffer full (max_allocation_samples / max_heap_samples reached).
    attr_reader :dropped_samples_nolock, :dropped_samples_allocation_bufsize,
                :dropped_samples_heap_bufsize
    # How long the flush took, and the part spent building the pprof.
    attr_reader :flush_duration_nsecs, :pprof_serialization_nsecs
    # The longest the flush held the GVL at a stretch: how long it may have
    # stopped the program's other threads (with proactively_yield_gvl:
    # false, the whole flush but the part built without the GVL).
    attr_reader :longest_gvl_hold_nsecs
    # The sample rate in force at flush time.
    attr_reader :sample_rate
    # The interval the allocation samples cover (Time).
    attr_reader :started_at, :finished_at

    # Samples folded into one "(other)" sample to respect max_profile_bytes.
    attr_reader :folded_samples_count
    # Label sets (with_labels) that folded into "(other)" since the
    # collector's previous flush (or first start!): the process had
    # max_label_sets distinct ones already.
    attr_reader :label_sets_folded
    # Share of the interval's allocations made while the NEWOBJ hook was on:
    # 1.0 without sampling windows (Collector's window_probability and
    # window_budget).
    attr_reader :window_coverage
    # Where the flush put each sample's class and GC age (Collector#flush's
    # sample_labels: :keep, :class_frame or :drop); nil if not known.
    attr_reader :sample_labels
    # How sure each total is, by sample type (:alloc_objects, :alloc_space,
    # :inuse_objects, :inuse_space): the estimated relative standard error
    # (0.05: the total is within about 5% two times in three), and the
    # effective sample count (as many samples as a plain random sample with
    # that error would have; Float::INFINITY when exact). nil where it is
    # unknown: no sample, or (alloc_*) no allocation of the interval hooked.
    attr_reader :relative_standard_errors, :effective_samples

    SAMPLE_TYPES = %i[alloc_objects alloc_space inuse_objects inuse_space].freeze

    def self.from_native(values, sample_labels: nil, label_sets_folded: 0)
      pprof, allocs, heap, nolock, alloc_buf, heap_buf, flush_ns, ser_ns, folded, rate, start_ns, end_ns,
        coverage, errors, effective, longest_hold = values
      new(
        pprof_data: pprof, allocation_samples_count: allocs, heap_samples_count: heap,
        dropped_samples_nolock: nolock, dropped_samples_allocation_bufsize: alloc_buf,
        dropped_samples_heap_bufsize: heap_buf, flush_duration_nsecs: flush_ns,
        pprof_serialization_nsecs: ser_ns, folded_samples_count: folded, sample_rate: rate,
        started_at: Time.at(Rational(start_ns, 1_000_000_000)),
        finished_at: Time.at(Rational(end_ns, 1_000_000_000)), window_coverage: coverage,
        sample_labels: sample_labels,
        relative_standard_errors: errors, effective_samples: effective, longest_gvl_hold_nsecs: longest_hold,
        label_sets_folded: label_sets_folded
      )
    end

    def initialize(pprof_data:, allocation_samples_count: 0, heap_samples_count: 0,
                   dropped_samples_nolock: 0, dropped_samples_allocation_bufsize: 0,
                   dropped_samples_heap_bufsize: 0, flush_duration_nsecs: 0,
                   pprof_serialization_nsecs: 0, folded_samples_count: 0, sample_rate: nil, started_at: nil,
                   finished_at: nil, window_coverage: 1.0, sample_labels: nil,
                   relative_standard_errors: {}, effective_samples: {}, longest_gvl_hold_nsecs: 0,
                   label_sets_folded: 0)
      Validation.instance(pprof_data, String, :pprof_data)

      { allocation_samples_count: allocation_samples_count, heap_samples_count: heap_samples_count,
        dropped_samples_nolock: dropped_samples_nolock,
        dropped_samples_allocation_bufsize: dropped_samples_allocation_bufsize,
        dropped_samples_heap_bufsize: dropped_samples_heap_bufsize, flush_duration_nsecs: flush_duration_nsecs,
        pprof_serialization_nsecs: pprof_serialization_nsecs, longest_gvl_hold_nsecs: longest_gvl_hold_nsecs,
        folded_samples_count: folded_samples_count, label_sets_folded: label_sets_folded }.each do |name, value|
        Validation.integer(value, name, min: 0)
      end
      unless sample_rate.nil? || (sample_rate.is_a?(Numeric) && sample_rate.real?)
        Validation.type_error!(:sample_rate, "a real number or nil", sample_rate)
      end
      unless window_coverage.is_a?(Numeric) && window_coverage.real? && window_coverage.between?(0, 1)
        Validation.type_error!(:window_coverage, "a real number between 0 and 1", window_coverage)
      end
      { started_at: started_at, finished_at: finished_at }.each do |name, value|
        Validation.instance(value, Time, name, nil_ok: true)
      end
      Validation.one_of(sample_labels, [nil, *Collector::SAMPLE_LABELS], :sample_labels)
      relative_standard_errors = spread_figures(relative_standard_errors, :relative_standard_errors)
      effective_samples = spread_figures(effective_samples, :effective_samples)

      @pprof_data = pprof_data
      @allocation_samples_count = allocation_samples_count
      @heap_samples_count = heap_samples_count
      @dropped_samples_nolock = dropped_samples_nolock
      @dropped_samples_allocation_bufsize = dropped_samples_allocation_bufsize
      @dropped_samples_heap_bufsize = dropped_samples_heap_bufsize
      @flush_duration_nsecs = flush_duration_nsecs
      @pprof_serialization_nsecs = pprof_serialization_nsecs
      @longest_gvl_hold_nsecs = longest_gvl_hold_nsecs
      @folded_samples_count = folded_samples_count
      @label_sets_folded = label_sets_folded
      @sample_rate = sample_rate
      @started_at = started_at
      @finished_at = finished_at
      @window_coverage = window_coverage
      @sample_labels = sample_labels
      @relative_standard_errors = relative_standard_errors
      @effective_samples = effective_samples
    end

    # A Hash of SAMPLE_TYPES to non-negative numbers or nil (missing: nil),
    # frozen.
    def spread_figures(figures, name)
      Validation.instance(figures, Hash, name)
      figures.each do |type, value|
        raise ArgumentError, "#{name}: unknown sample type #{type.inspect}" unless SAMPLE_TYPES.include?(type)
        next if value.nil? || (value.is_a?(Numeric) && value.real? && value >= 0)

        Validation.type_error!(name, "non-negative numbers or nil", value)
      end
      figures = SAMPLE_TYPES.to_h { |type| [type, figures[type]] } unless figures.size == SAMPLE_TYPES.size
      figures.frozen? ? figures : figures.dup.freeze
    end
    private :spread_figures

    # Total samples dropped for any reason.
    def dropped_samples_count
      dropped_samples_nolock + dropped_samples_allocation_bufsize + dropped_samples_heap_bufsize
    end

    # Writes the gzipped profile to `path`, whole or not at all (see
    # FileOutput.write): owner-only (0600) unless `mode` says otherwise, a
    # missing directory created 0700, an existing one refused if another
    # user owns it. Binary, whatever the process's default encodings. With
    # `overwrite: false` an existing `path` is never replaced
    # (Errno::EEXIST is raised instead), even if another process creates it
    # at the same moment. Returns `path`.
    def write(path, overwrite: true, mode: FileOutput::FILE_MODE)
      path = Validation.path(path, :path)
      Validation.flag(overwrite, :overwrite)

      FileOutput.write(path, pprof_data, mode: FileOutput.validate_mode(mode), overwrite: overwrite)
    end

    # Length of the interval the allocation samples cover, in seconds.
    def duration
      return nil unless started_at && finished_at

      (finished_at - started_at).to_f
    end

    def to_s
      format("#<%s %d allocation samples, %d heap samples, %d dropped, %d bytes of pprof, " \
             "sample_rate=%s, %s>",
             self.class.name, allocation_samples_count, heap_samples_count,
             dropped_samples_count, pprof_data.bytesize, sample_rate.inspect, interval_text)
    end
    alias inspect to_s

    private

    def interval_text
      return "no interval" unless started_at && finished_at

      format("%.3fs from %s", duration, started_at.utc.strftime("%Y-%m-%dT%H:%M:%S.%LZ"))
    end
  end
end
