# frozen_string_literal: true

require_relative "memprofiler_pprof_rs/version"

# The native extension: lib/memprofiler_pprof_rs/memprofiler_pprof_rs.so
# during development (`rake compile`), or wherever `gem install` put it.
begin
  require_relative "memprofiler_pprof_rs/memprofiler_pprof_rs"
rescue LoadError
  require "memprofiler_pprof_rs/memprofiler_pprof_rs"
end

require_relative "memprofiler_pprof_rs/file_output"
require_relative "memprofiler_pprof_rs/profile_data"
require_relative "memprofiler_pprof_rs/collector"
require_relative "memprofiler_pprof_rs/method_blocks"
require_relative "memprofiler_pprof_rs/pprof_reader"
require_relative "memprofiler_pprof_rs/profile"
require_relative "memprofiler_pprof_rs/atfork"
require_relative "memprofiler_pprof_rs/block_flusher"
require_relative "memprofiler_pprof_rs/file_flusher"
require_relative "memprofiler_pprof_rs/env_config"
require_relative "memprofiler_pprof_rs/pyroscope_uploader"
require_relative "memprofiler_pprof_rs/pyroscope_flusher"
require_relative "memprofiler_pprof_rs/rack_app"
