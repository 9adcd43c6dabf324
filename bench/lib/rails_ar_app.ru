# frozen_string_literal: true

# (9) A Rails app as `rails new` makes one, for bench/run rails-ar:
# railties, ActiveRecord on SQLite and a rendered view
# (rails_ar_app/app.rb). BENCH_PROFILER names a configuration of
# bench/lib/configs.rb; when it is this gem, a FileFlusher writes profiles
# into BENCH_PROFILE_DIR (as in puma_app.ru).

require "memprofiler_pprof_rs"
require_relative "rails_ar_app/app"
require_relative "configs"

app = BenchRailsAr.app
BenchConfigs.fetch(ENV.fetch("BENCH_PROFILER")).call
BenchConfigs.start_flusher

run app
