# frozen_string_literal: true

# Loaded through RUBYOPT by exe/memprofiler_pprof_rs_profile, before the
# program's first line: starts a collector and a FileFlusher (or, with
# PYROSCOPE_SERVER_ADDRESS set, a PyroscopeFlusher) configured from the
# environment (see MemprofilerPprof::EnvConfig and EnvProfiler) and flushes
# once more at exit. Any problem is reported on $stderr and the program
# runs unprofiled: profiling must never stop a program from booting.

begin
  require_relative "../memprofiler_pprof_rs"
  MemprofilerPprof::EnvProfiler.start
  MemprofilerPprof::EnvProfiler.load_railtie_with_rails
rescue ScriptError, StandardError => e
  warn("memprofiler_pprof_rs: profiling is off for this process: #{e.class}: #{e.message}")
end
