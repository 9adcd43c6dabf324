# frozen_string_literal: true

module MemprofilerPprof
  # Flushes a collector every `interval` seconds from a background thread and
  # hands each ProfileData to `on_flush`.
  #
  #   flusher = MemprofilerPprof::BlockFlusher.new(collector, interval: 30,
  #                                                on_flush: ->(data) { upload(data) })
  #   flusher.start!
  #   ...
  #   flusher.stop!(flush: true)   # returns at once; flushes the last interval
  #
  # The time a flush (and on_flush) takes counts against the interval. Errors
  # from the flush or from on_flush are logged (to `logger`, or $stderr
  # without one) and counted, never raised into the application; the thread
  # keeps flushing. After fork the thread is restarted in the child (see
  # Atfork); the parent's flusher is unaffected.
  class BlockFlusher
    attr_reader :collector, :interval, :logger, :on_flush, :priority
    # Flushes done (including a final one), and errors logged.
    attr_reader :flush_count, :error_count
    # The last error caught (flush or on_flush), or nil.
    attr_reader :last_error

    # stop_timeout: how long stop! waits for a flush (or an on_flush, say an
    # upload) under way before killing the thread, so that a hung callback
    # cannot hang the application's shutdown.
    def initialize(collector, interval: 30, logger: nil, on_flush: nil, priority: nil,
                   yield_gvl: false, proactively_yield_gvl: false, flush_on_stop: false,
                   stop_timeout: 10)
      unless collector.respond_to?(:flush)
        raise ArgumentError, "collector must respond to #flush, got #{collector.inspect}"
      end
      unless interval.is_a?(Numeric) && interval.real? && interval.to_f.finite? && interval.positive?
        raise ArgumentError, "interval must be a positive number of seconds, got #{interval.inspect}"
      end
      unless logger.nil? || logger.respond_to?(:error)
        raise ArgumentError, "logger must respond to #error (e.g. a Logger), got #{logger.inspect}"
      end
      unless on_flush.nil? || on_flush.respond_to?(:call)
        raise ArgumentError, "on_flush must respond to #call, got #{on_flush.inspect}"
      end
      unless stop_timeout.is_a?(Numeric) && stop_timeout.real? && !stop_timeout.negative? &&
             stop_timeout.to_f.finite?
        raise ArgumentError, "stop_timeout must be a number of seconds >= 0, got #{stop_timeout.inspect}"
      end
      unless priority.nil? || priority.is_a?(Integer)
        raise ArgumentError, "priority must be an Integer or nil, got #{priority.inspect}"
      end

      @collector = collector
      @interval = interval.to_f
      @stop_timeout = stop_timeout.to_f
      @logger = logger
      @on_flush = on_flush
      @priority = priority
      @yield_gvl = self.class.check_flag(yield_gvl, :yield_gvl)
      @proactively_yield_gvl = self.class.check_flag(proactively_yield_gvl, :proactively_yield_gvl)
      @flush_on_stop = self.class.check_flag(flush_on_stop, :flush_on_stop)
      @flush_count = 0
      @error_count = 0
      @last_error = nil
      @thread = nil
      @fork_handler = nil
      reset_synchronization
    end

    # Starts the background thread. Does nothing (returns false) if it runs.
    def start!
      @state_lock.synchronize do
        # (A thread killed from outside counts as not running.)
        return false if @running && @thread&.alive?

        @running = true
        @paused = false
        @thread = spawn_thread
      end
      @fork_handler ||= Atfork.at_fork(:child) { restart_in_child }
      true
    end

    # Stops the thread, returning as soon as it has (at once while it waits;
    # after the flush in progress, if any). With `flush: true` (default: the
    # `flush_on_stop` option) flushes once more so the last interval is not
    # lost; that flush goes to on_flush like the others. Returns false if the
    # flusher was not running.
    def stop!(flush: @flush_on_stop)
      self.class.check_flag(flush, :flush)
      thread = nil
      @state_lock.synchronize do
        return false unless @running

        @running = false
        thread = @thread
        @thread = nil
        @wakeup.broadcast
      end
      @fork_handler&.remove!
      @fork_handler = nil
      # From on_flush itself (the flusher thread), joining would deadlock;
      # the thread ends after the callback returns.
      join_or_kill(thread) unless thread.equal?(Thread.current)
      flush_once if flush
      true
    end

    # start!, yields, then stop! (even if the block raises). Returns the
    # block's value.
    def run(flush: @flush_on_stop)
      raise ArgumentError, "#{self.class}#run needs a block" unless block_given?

      start!
      begin
        yield
      ensure
        stop!(flush: flush)
      end
    end

    # While paused no flush happens; the collector keeps sampling, so the
    # first flush after unpause covers the whole time since the last one.
    def pause
      @state_lock.synchronize do
        @paused = true
        @wakeup.broadcast
      end
      nil
    end

    def unpause
      @state_lock.synchronize do
        @paused = false
        @wakeup.broadcast
      end
      nil
    end

    def running?
      @running
    end

    def paused?
      @paused
    end

    def inspect
      format("#<%s interval=%gs %s flushes=%d errors=%d>", self.class.name, @interval,
             running? ? (paused? ? "paused" : "running") : "stopped", flush_count, error_count)
    end
    alias to_s inspect

    def self.check_flag(value, name)
      return value if value == true || value == false

      raise ArgumentError, "#{name} must be true or false, got #{value.inspect}"
    end

    private

    # Called with each ProfileData; subclasses write or upload it.
    def handle_flush(data)
      @on_flush&.call(data)
    end

    # Used in log lines, so subclasses name themselves.
    def log_name
      self.class.name.split("::").last
    end

    def join_or_kill(thread)
      return if thread.join(@stop_timeout)

      thread.kill
      thread.join(1)
      report_error("stop!", RuntimeError.new("the flush under way did not end within #{@stop_timeout}s; " \
                                              "its thread was killed"))
    end

    def reset_synchronization
      @state_lock = Mutex.new
      @wakeup = ConditionVariable.new
      @running = false
      @paused = false
    end

    def spawn_thread
      thread = Thread.new { flusher_loop }
      thread.name = "memprofiler_pprof_rs #{log_name}"
      thread.report_on_exception = false
      thread.priority = @priority unless @priority.nil?
      thread
    end

    def flusher_loop
      next_at = now + @interval
      loop do
        return unless wait_until(next_at)

        flush_once
        # Counted from the planned time, so a slow flush shortens the next
        # wait; after a very slow one the next starts at once, not in a burst.
        next_at = [next_at + @interval, now].max
      end
    end

    # Waits until `deadline` (and not paused); false once stopped.
    def wait_until(deadline)
      @state_lock.synchronize do
        loop do
          return false unless @running

          remaining = deadline - now
          return true if remaining <= 0 && !@paused

          @wakeup.wait(@state_lock, @paused ? nil : remaining)
        end
      end
    end

    def flush_once
      data = begin
        @collector.flush(yield_gvl: @yield_gvl, proactively_yield_gvl: @proactively_yield_gvl)
      rescue StandardError => e
        report_error("flush failed", e)
        return nil
      end
      @flush_count += 1
      begin
        handle_flush(data)
      rescue StandardError => e
        report_error("handling the flushed profile failed", e)
      end
      data
    end

    def report_error(what, error)
      @error_count += 1
      @last_error = error
      message = "memprofiler_pprof_rs #{log_name}: #{what}: #{error.class}: #{error.message}"
      if @logger
        @logger.error(message)
      else
        warn(message)
      end
    rescue StandardError
      # A broken logger must not take the flusher down either.
      nil
    end

    # In a forked child: the thread did not survive the fork; start another
    # if this flusher was running in the parent.
    def restart_in_child
      was_running = @running
      reset_synchronization
      @thread = nil
      child_forked
      start! if was_running
    end

    # Hook for subclasses: per-process state to reset in a forked child.
    def child_forked; end

    def now
      Process.clock_gettime(Process::CLOCK_MONOTONIC)
    end
  end
end
