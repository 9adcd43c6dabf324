# frozen_string_literal: true

module MemprofilerPprof
  # A collector and its flusher configured from the environment (see
  # EnvConfig): what the wrapper (exe/memprofiler_pprof_rs_profile, through
  # profile_app.rb) and the Railtie start. One per process: a second start
  # (the wrapper's, then the Railtie's) is a no-op.
  module EnvProfiler
    class << self
      attr_reader :collector, :flusher

      # Starts them, unless already started; true if this call did.
      # flusher: :now starts the flusher's thread at once; :when_serving
      # waits for `serving!` (a first request or job) or a fork (in the
      # child), so that a preforking server's master holds no profiler
      # thread when it forks, and writes no profiles of its own.
      def start(env = ENV, flusher: :now)
        return false if @collector # loaded twice (e.g. -r and require): one profiler

        Validation.one_of(flusher, %i[now when_serving], :flusher)

        config = EnvConfig.new(env)
        pyroscope = config.pyroscope_options
        config.warnings.each { |message| report(message) }
        @collector = Collector.new(**config.collector_options)
        @flusher = if pyroscope
                     # One flusher per collector (each flush ends an
                     # interval); files too only if a pattern was set.
                     files = config.file_pattern_set? ? file_writer(config) : nil
                     PyroscopeFlusher.new(@collector, **pyroscope, on_flush: files)
                   else
                     FileFlusher.new(@collector, **config.file_flusher_options)
                   end
        @collector.start!
        @serving_lock = Mutex.new
        @serving = false
        if flusher == :now
          serving!
        else
          # Until the flusher runs: once it does, it restarts itself in a
          # forked child.
          @waiting_for_fork = Atfork.at_fork(:child) do
            @serving_lock = Mutex.new
            serving!
          end
        end
        # at_exit handlers run last-registered first: registered at boot, this
        # one runs after the program's own, so their allocations count too.
        # The last profile, at exit, follows a full GC: its in-use is what
        # the program left alive (in-use counts what a GC has seen live).
        at_exit do
          GC.start if @serving && !@stopped && @flusher.flush_on_stop && @collector.inuse_as_of == :last_gc
          @flusher.stop!
        end
        true
      end

      # This process serves (a request, a job): its flusher starts if it
      # waits. Cheap enough for every request.
      def serving!
        return if @serving || @flusher.nil? || @stopped

        @serving_lock.synchronize do
          next if @serving

          @flusher.start!
          @serving = true
          @waiting_for_fork&.remove!
          @waiting_for_fork = nil
        end
      rescue StandardError => e
        # (From a request: the request goes on; the next one tries again.)
        report("could not start the flusher: #{e.class}: #{e.message}")
      end

      # Whether the flusher's thread has been started in this process.
      def serving?
        @serving == true
      end

      # Stops profiling this process (the collector and a started flusher,
      # without a last profile).
      def stop
        @stopped = true
        @flusher&.stop!(flush: false)
        @collector&.stop!
      end

      # An on_flush that also writes each profile to the configured files.
      def file_writer(config)
        files = FileFlusher.new(@collector, **config.file_flusher_options)
        files.method(:write)
      end

      # The wrapper loads the gem before the program, so before a Rails
      # app's Rails: in a Rails app's directory (config/application.rb),
      # the Railtie is loaded when the app's class is defined, so that its
      # config.memprofiler_pprof exists. The watch (a TracePoint on class
      # bodies) ends there; elsewhere it is never set.
      def load_railtie_with_rails(dir = Dir.pwd)
        return if defined?(::Rails::Railtie) || !File.file?(File.join(dir, "config", "application.rb"))

        watch = TracePoint.new(:class) do |tp|
          next unless defined?(::Rails::Application) && tp.self.is_a?(Class) && tp.self < ::Rails::Application

          watch.disable
          begin
            require_relative "railtie"
          rescue ScriptError, StandardError => e
            report("config.memprofiler_pprof is not available: #{e.class}: #{e.message}")
          end
        end
        watch.enable
      end

      def report(message)
        $stderr.puts("memprofiler_pprof_rs: #{message}")
      end
    end
  end
end
