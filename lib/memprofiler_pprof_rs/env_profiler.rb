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
      def start(env = ENV)
        return false if @collector # loaded twice (e.g. -r and require): one profiler

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
        @flusher.start!
        # at_exit handlers run last-registered first: registered at boot, this
        # one runs after the program's own, so their allocations count too.
        at_exit { @flusher.stop! }
        true
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
