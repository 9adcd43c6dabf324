# frozen_string_literal: true

# Loaded through RUBYOPT by exe/memprofiler_pprof_rs_profile, before the
# program's first line: starts a collector and a FileFlusher (or, with
# PYROSCOPE_SERVER_ADDRESS set, a PyroscopeFlusher) configured from the
# environment (see MemprofilerPprof::EnvConfig) and flushes once more at
# exit. Any problem is reported on $stderr and the program runs unprofiled:
# profiling must never stop a program from booting.

module MemprofilerPprof
  # The wrapper's in-process half.
  module ProfileApp
    class << self
      attr_reader :collector, :flusher

      def start(env = ENV)
        return if @collector # loaded twice (e.g. -r and require): one profiler

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
      end

      # An on_flush that also writes each profile to the configured files.
      def file_writer(config)
        files = FileFlusher.new(@collector, **config.file_flusher_options)
        files.method(:write)
      end

      def report(message)
        $stderr.puts("memprofiler_pprof_rs: #{message}")
      end
    end
  end
end

begin
  require_relative "../memprofiler_pprof_rs"
  MemprofilerPprof::ProfileApp.start
rescue ScriptError, StandardError => e
  MemprofilerPprof::ProfileApp.report("profiling is off for this process: #{e.class}: #{e.message}")
end
