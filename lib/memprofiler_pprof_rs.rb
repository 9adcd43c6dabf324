# frozen_string_literal: true

require_relative "memprofiler_pprof_rs/version"
require_relative "memprofiler_pprof_rs/error"

# The native extension: the platform gem's build for this Ruby, a
# checkout's (`rake compile`), or the one `gem install` built from source.
require_relative "memprofiler_pprof_rs/native_extension"
MemprofilerPprof::NativeExtension.load

# Loaded now: what the collector needs while it samples, flushes and forks.
# Nothing here may be left to autoload: MethodBlocks is called by the
# native flush, Atfork's hooks run around fork(2), and a flush or a write
# may be asked for from a signal trap, where `require` cannot take its
# lock. Profile is the Ruby half of a class the extension defines, so it
# cannot be autoloaded either.
# Every process that loads the gem pays for these files, so they use core
# Ruby only and require no library (fileutils and securerandom alone were
# 33M of the 63M instructions the require cost; spec/integration/loading_spec.rb
# checks that nothing from outside the gem is loaded).
require_relative "memprofiler_pprof_rs/validation"
require_relative "memprofiler_pprof_rs/error_log"
require_relative "memprofiler_pprof_rs/file_output"
require_relative "memprofiler_pprof_rs/profile_data"
require_relative "memprofiler_pprof_rs/collector"
require_relative "memprofiler_pprof_rs/labels"
require_relative "memprofiler_pprof_rs/method_blocks"
require_relative "memprofiler_pprof_rs/atfork"
require_relative "memprofiler_pprof_rs/readers/profile"

# Loaded on first use of the constant (Module#autoload is thread-safe), so
# a process that only profiles never loads net/http, openssl, zlib, the
# readers, the command line or the Rack endpoint. None of these is needed
# by a hook, a fork handler or a trap: objects of these classes exist (and
# so their files are loaded) before any of their code runs there.
module MemprofilerPprof
  lib = File.expand_path("memprofiler_pprof_rs", __dir__)

  autoload :BlockFlusher, File.join(lib, "flushers/block_flusher")
  autoload :FileFlusher, File.join(lib, "flushers/file_flusher")
  autoload :PyroscopeFlusher, File.join(lib, "flushers/pyroscope_flusher")
  autoload :PyroscopeUploader, File.join(lib, "pyroscope/uploader")
  autoload :PyroscopeAddress, File.join(lib, "pyroscope/address")
  autoload :EnvConfig, File.join(lib, "env_config")
  autoload :EnvProfiler, File.join(lib, "env_profiler")
  autoload :PprofReader, File.join(lib, "readers/pprof_reader")
  autoload :RackApp, File.join(lib, "rack_app")
  autoload :RackLabels, File.join(lib, "rack_labels")
  autoload :SidekiqLabels, File.join(lib, "sidekiq_labels")
  autoload :SinatraLabels, File.join(lib, "sinatra_labels")
  autoload :CLI, File.join(lib, "cli")
  autoload :Retention, File.join(lib, "retention")
  autoload :RetentionError, File.join(lib, "retention")
  autoload :RetentionReport, File.join(lib, "retention_report")
end

# Rails, when it is loaded first (as Bundler.require does after `require
# "rails"`): the Railtie (config.memprofiler_pprof).
require_relative "memprofiler_pprof_rs/railtie" if defined?(::Rails::Railtie)
