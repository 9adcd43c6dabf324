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
    attr_reader :collector, :interval, :logger, :on_flush, :priority, :flush_on_stop
    # Flushes done (including a final one), and errors logged.
    attr_reader :flush_count, :error_count
    # The last error caught (flush or on_flush), or nil.
    attr_reader :last_error

    # stop_timeout: how long stop! waits for a flush (or an on_flush, say an
    # upload) under way before killing the thread, so that a hung callback
    # cannot hang the application's shutdown.
    def initialize(collector, interval: 30, logger: nil, on_flush: nil, priority: nil,
                   yield_gvl: true, proactively_yield_gvl: true, flush_on_stop: false,
                   stop_timeout: 10)
      Validation.responds_to(collector, :flush, :collector)
      @interval = Validation.seconds(interval, :interval)
      Validation.responds_to(logger, :error, :logger, nil_ok: true, hint: "e.g. a Logger")
      Validation.responds_to(on_flush, :call, :on_flush, nil_ok: true)
      @stop_timeout = Validation.seconds(stop_timeout, :stop_timeout, positive: false)
      Validation.integer(priority, :priority, nil_ok: true)

      @collector = collector
      @logger = logger
      @on_flush = on_flush
      # Thread#priority= clamps to -3..3 but raises RangeError on an Integer
      # beyond a C long, which start! would only find out too late.
      @priority = priority&.clamp(-3, 3)
      @yield_gvl = Validation.flag(yield_gvl, :yield_gvl)
      @proactively_yield_gvl = Validation.flag(proactively_yield_gvl, :proactively_yield_gvl)
      @flush_on_stop = Validation.flag(flush_on_stop, :flush_on_stop)
      @flush_count = 0
      @error_count = 0
      @last_error = nil
      @thread = nil
      @fork_handler = nil
      reset_synchronization
    end

    # Starts the background thread. Does nothing (returns false) if it runs.
    def start!
      return in_helper_thread { start! } if trap_context?

      @state_lock.synchronize do
        # (A thread killed from outside counts as not running.)
        next false if @running && @thread&.alive?

        @running = true
        @paused = false
        @generation += 1
        @thread = spawn_thread(@generation)
        @fork_handler ||= Atfork.at_fork(:child) { restart_in_child }
        true
      end
    end

    # Stops the thread, returning as soon as it has: at once while it waits;
    # after the flush under way, if any, but never later than `stop_timeout`
    # (then the thread is killed and that is logged). With `flush: true`
    # (default: the `flush_on_stop` option) flushes once more so the last
    # interval is not lost; that flush goes to on_flush like the others, and
    # is bounded by `stop_timeout` too. Returns false if it was not running.
    # Safe to call from a signal trap, at_exit, or on_flush itself.
    def stop!(flush: @flush_on_stop)
      Validation.flag(flush, :flush)
      return in_helper_thread { stop!(flush: flush) } if trap_context?

      thread = @state_lock.synchronize do
        next :not_running unless @running

        @running = false
        @generation += 1
        @fork_handler&.remove!
        @fork_handler = nil
        @wakeup.broadcast
        stopping = @thread
        @thread = nil
        stopping
      end
      return false if thread == :not_running

      # From on_flush itself (the flusher thread), joining would deadlock:
      # the thread ends after the callback returns, and makes the final
      # flush itself (another thread would wait for the flush lock it holds).
      if thread.equal?(Thread.current)
        @final_flush_in_loop = flush
        return true
      end
      join_or_kill(thread, "the flush under way") unless thread.nil?
      if flush
        final = Thread.new { flush_once }
        final.name = "memprofiler_pprof_rs #{log_name} final flush"
        final.report_on_exception = false
        join_or_kill(final, "the final flush")
      end
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

    # While paused no flush starts (one under way finishes); the collector
    # keeps sampling, so the first flush after unpause covers the whole time
    # since the last one.
    def pause
      return in_helper_thread { pause } if trap_context?

      @state_lock.synchronize do
        @paused = true
        @wakeup.broadcast
      end
      nil
    end

    def unpause
      return in_helper_thread { unpause } if trap_context?

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
      state = if !running?
                "stopped"
              elsif paused?
                "paused"
              else
                "running"
              end
      format("#<%s interval=%gs %s flushes=%d errors=%d>", self.class.name, @interval, state, flush_count, error_count)
    end
    alias to_s inspect

    # true or false (see Validation.flag); kept for code that called it.
    def self.check_flag(value, name)
      Validation.flag(value, name)
    end

    private

    # Keywords for Collector#flush; subclasses may add to them.
    def flush_options
      { yield_gvl: @yield_gvl, proactively_yield_gvl: @proactively_yield_gvl }
    end

    # Called with each ProfileData; subclasses write or upload it.
    def handle_flush(data)
      @on_flush&.call(data)
    end

    # Used in log lines, so subclasses name themselves.
    def log_name
      self.class.name.split("::").last
    end

    # Mutex#synchronize raises in a signal trap handler; a helper thread
    # may take locks, so trap handlers get their work done there.
    def trap_context?
      @state_lock.synchronize { false }
    rescue ThreadError => e
      raise unless e.message.include?("trap context")

      true
    end

    def in_helper_thread(&block)
      Thread.new(&block).value
    end

    # Joins `thread` for at most stop_timeout seconds, then kills it. An
    # exception the thread died of is logged, never raised here.
    def join_or_kill(thread, what)
      finished = begin
        thread.join(@stop_timeout)
      rescue Exception => e # rubocop:disable Lint/RescueException
        report_error("#{what} failed", e)
        true
      end
      return if finished

      thread.kill
      thread.join(1)
      report_error("stop!", RuntimeError.new("#{what} did not end within #{@stop_timeout}s; its thread was killed"))
    end

    def reset_synchronization
      @state_lock = Mutex.new
      @wakeup = ConditionVariable.new
      @flush_lock = Mutex.new
      @running = false
      @paused = false
      @generation = 0
      @final_flush_in_loop = false
    end

    def spawn_thread(generation)
      thread = Thread.new { flusher_loop(generation) }
      thread.name = "memprofiler_pprof_rs #{log_name}"
      thread.report_on_exception = false
      thread.priority = @priority unless @priority.nil?
      thread
    end

    def flusher_loop(generation)
      next_at = now + @interval
      loop do
        return unless wait_until(next_at, generation)

        flush_once
        if @final_flush_in_loop
          # stop!(flush: true) was called from on_flush.
          @final_flush_in_loop = false
          flush_once
          return
        end
        # Counted from the planned time, so a slow flush shortens the next
        # wait; after a very slow one the next starts at once, not in a burst.
        next_at = [next_at + @interval, now].max
      end
    rescue Exception => e # rubocop:disable Lint/RescueException
      # Not expected (flush_once logs its own errors); never let the thread
      # die silently or hand its exception to whoever joins it.
      report_error("flusher thread stopped", e)
      @state_lock.synchronize { @running = false if @generation == generation }
    end

    # Waits until `deadline` (and not paused); false once this thread's
    # generation was stopped or replaced.
    def wait_until(deadline, generation)
      @state_lock.synchronize do
        loop do
          return false unless @running && @generation == generation

          remaining = deadline - now
          return true if remaining <= 0 && !@paused

          # Waits are chunked: a huge interval must not overflow Ruby's
          # timeout arithmetic.
          @wakeup.wait(@state_lock, @paused ? MAX_WAIT : [remaining, MAX_WAIT].min)
        end
      end
    end

    MAX_WAIT = 3600.0

    # One flush and its handling; every error is logged and counted. Flushes
    # of one flusher never overlap (a restarted thread, the final flush).
    def flush_once
      @flush_lock.synchronize do
        data = begin
          @collector.flush(**flush_options)
        rescue Exception => e # rubocop:disable Lint/RescueException
          report_error("flush failed", e)
          next nil
        end
        @flush_count += 1
        begin
          handle_flush(data)
        rescue Exception => e # rubocop:disable Lint/RescueException
          report_error("handling the flushed profile failed", e)
        end
        data
      end
    end

    def report_error(what, error)
      @error_count += 1
      @last_error = error
      ErrorLog.write(@logger, log_name, "#{what}: #{error.class}: #{error.message}")
    rescue StandardError
      # An error whose #message raises must not take the flusher down either.
      nil
    end

    # In a forked child: the thread did not survive the fork; start another
    # if this flusher was running in the parent. (The parent's Atfork
    # handler is inherited, so it is kept.)
    def restart_in_child
      was_running = @running
      handler = @fork_handler
      reset_synchronization
      @thread = nil
      @fork_handler = handler
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
