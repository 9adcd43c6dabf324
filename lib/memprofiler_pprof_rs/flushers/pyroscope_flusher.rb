# frozen_string_literal: true

module MemprofilerPprof
  # A BlockFlusher that sends every flush to Grafana Pyroscope.
  #
  #   MemprofilerPprof::PyroscopeFlusher.new(collector,
  #     server_address: "http://pyroscope:4040", application_name: "shop",
  #     labels: { env: "prod" }).start!
  #
  # Flushing and uploading are separate: each flush goes into a bounded
  # queue (`max_pending`, oldest dropped first, counted in `dropped_uploads`)
  # that an upload thread drains, so a slow or unreachable server never
  # delays the next flush, never blocks the application, and never makes
  # memory grow. Upload options (auth, tenant, headers, api, timeouts,
  # retries) are PyroscopeUploader's. Nothing is raised into the application.
  #
  # sample_labels (Collector#flush's) is :class_frame by default here: the
  # allocated class is the leaf of each stack, not a `class` label, because
  # Pyroscope makes every label value a series of its own (300 classes gave
  # 1,204 series; 3,000 classes were refused for exceeding its default
  # 5,000 active series). :keep restores the labels, :drop leaves only
  # stacks (a Go heap profile's shape).
  class PyroscopeFlusher < BlockFlusher
    UPLOADER_OPTIONS = %i[labels api basic_auth_username basic_auth_password tenant_id headers
                          open_timeout read_timeout retries retry_base_delay spy_name].freeze

    attr_reader :uploader, :max_pending, :max_profile_bytes, :max_profile_samples, :sample_labels
    # Uploads that succeeded, that failed (after their retries), and flushes
    # dropped because max_pending uploads were already waiting.
    attr_reader :uploads_succeeded, :uploads_failed, :dropped_uploads

    # Uncompressed bytes, as the collector folds (the gzip sent is several
    # times smaller). Pyroscope's limits count the uncompressed profile too:
    # its rate limiter takes the profile's size plus the series labels'
    # bytes, and with the default 2 MiB (2,097,152) burst refuses anything
    # larger with 429 on every retry, before its 4 MiB size limit is even
    # looked at; 2,000,000 leaves room for 30 labels of the longest values.
    DEFAULT_MAX_PROFILE_BYTES = 2_000_000
    # Pyroscope refuses (400) a profile of more than 16,000 samples whatever
    # its size (docs/pyroscope-protocol.md, "Limits of a real server"); a
    # shallow-stack program flushed 18,000 in 0.6 MB.
    DEFAULT_MAX_PROFILE_SAMPLES = 16_000

    def initialize(collector, server_address:, application_name:, interval: 15, logger: nil, max_pending: 4,
                   max_profile_bytes: DEFAULT_MAX_PROFILE_BYTES, max_profile_samples: DEFAULT_MAX_PROFILE_SAMPLES,
                   sample_labels: :class_frame, **options)
      uploader_options = options.slice(*UPLOADER_OPTIONS)
      # :keep here is a choice: the uploader need not warn about it.
      @uploader = PyroscopeUploader.new(server_address: server_address, application_name: application_name,
                                        logger: logger, warn_class_labels: sample_labels != :keep,
                                        **uploader_options)
      @max_pending = Validation.integer(max_pending, :max_pending, min: 1)
      @max_profile_bytes = Validation.integer(max_profile_bytes, :max_profile_bytes, min: 1)
      @max_profile_samples = Validation.integer(max_profile_samples, :max_profile_samples, min: 1)
      @sample_labels = Validation.one_of(sample_labels, Collector::SAMPLE_LABELS, :sample_labels)
      @uploads_succeeded = 0
      @uploads_failed = 0
      @dropped_uploads = 0
      reset_upload_queue
      super(collector, interval: interval, logger: logger, **options.except(*UPLOADER_OPTIONS))
    end

    # For an initializer: a flusher configured from the PYROSCOPE_*
    # variables (see EnvConfig#pyroscope_options), or nil when
    # PYROSCOPE_SERVER_ADDRESS is not set or a value is unusable (reported
    # to `logger`, or $stderr). Keywords given here override the variables.
    #
    #   MemprofilerPprof::PyroscopeFlusher.from_env(collector)&.start!
    def self.from_env(collector, env: ENV, logger: nil, **overrides)
      config = EnvConfig.new(env)
      options = config.pyroscope_options
      config.warnings.each do |message|
        text = "memprofiler_pprof_rs: #{message}"
        begin
          logger ? logger.error(text) : warn(text)
        rescue StandardError
          warn(text)
        end
      end
      options && new(collector, logger: logger, **options, **overrides)
    end

    def start!
      started = super
      ensure_upload_thread
      started
    end

    # Stops flushing (see BlockFlusher#stop!), then gives the uploads still
    # queued (the final flush's included) up to stop_timeout to go out.
    def stop!(flush: @flush_on_stop)
      return in_helper_thread { stop!(flush: flush) } if trap_context?

      stopped = super
      finish_uploads
      stopped
    end

    # Flushes waiting to be uploaded.
    def pending_uploads
      @upload_lock.synchronize { @pending.size }
    end

    def inspect
      format("#<%s %s interval=%gs %s sent=%d failed=%d dropped=%d>", self.class.name, @uploader.inspect,
             interval, running? ? "running" : "stopped", uploads_succeeded, uploads_failed, dropped_uploads)
    end
    alias to_s inspect

    private

    def flush_options
      super.merge(max_profile_bytes: @max_profile_bytes, max_profile_samples: @max_profile_samples,
                  sample_labels: @sample_labels)
    end

    def handle_flush(data)
      @upload_lock.synchronize do
        if @pending.size >= @max_pending
          @pending.shift
          @dropped_uploads += 1
        end
        @pending << data
        @upload_ready.signal
      end
      ensure_upload_thread
      super
    end

    def reset_upload_queue
      @upload_lock = Mutex.new
      @upload_ready = ConditionVariable.new
      @pending = []
      @upload_thread = nil
      @uploads_closing = false
      @uploading = false
    end

    def ensure_upload_thread
      @upload_lock.synchronize do
        return if @upload_thread&.alive?

        @uploads_closing = false
        @upload_thread = Thread.new { upload_loop }
        @upload_thread.name = "memprofiler_pprof_rs PyroscopeFlusher uploads"
        @upload_thread.report_on_exception = false
      end
    end

    def upload_loop
      loop do
        data = @upload_lock.synchronize do
          @upload_ready.wait(@upload_lock, 1.0) while @pending.empty? && !@uploads_closing
          @pending.shift
        end
        return if data.nil? # closing, nothing left

        @upload_lock.synchronize { @uploading = true }
        result = @uploader.upload(data)
        @upload_lock.synchronize do
          @uploading = false
          result.ok? ? @uploads_succeeded += 1 : @uploads_failed += 1
        end
      end
    rescue Exception => e # rubocop:disable Lint/RescueException
      report_error("upload thread stopped", e)
    end

    def finish_uploads
      thread = @upload_thread
      return unless thread

      @upload_lock.synchronize do
        @uploads_closing = true
        @upload_ready.broadcast
      end
      return if thread.join(@stop_timeout)

      thread.kill
      thread.join(1)
      # What could not go out is counted, not kept for a later start!.
      lost = @upload_lock.synchronize do
        queued = @pending.size
        @dropped_uploads += queued
        @uploads_failed += 1 if @uploading
        @pending.clear
        queued + (@uploading ? 1 : 0)
      end
      @uploading = false
      report_error("stop!", RuntimeError.new("uploads did not finish within #{@stop_timeout}s; " \
                                             "#{lost} not sent (the one under way counted as failed)"))
    end

    # In a forked child: the parent's queued uploads are the parent's.
    def child_forked
      reset_upload_queue
      super
    end
  end
end
