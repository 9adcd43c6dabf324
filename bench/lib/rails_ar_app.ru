# frozen_string_literal: true

# (9) A Rails app as `rails new` makes one, for bench/run rails-ar:
# railties, ActiveRecord on SQLite and a rendered view
# (rails_ar_app/app.rb). BENCH_PROFILER names a configuration of
# bench/lib/configs.rb; when it is this gem, a FileFlusher writes a profile
# every second into BENCH_PROFILE_DIR (as in rails_app.ru).

require "memprofiler_pprof_rs"
require_relative "rails_ar_app/app"
require_relative "configs"

app = BenchRailsAr.app
BenchConfigs::ALL.fetch(ENV.fetch("BENCH_PROFILER")).call
if $bench_collector
  MemprofilerPprof::FileFlusher.new($bench_collector, pattern: File.join(ENV.fetch("BENCH_PROFILE_DIR"), "mem-%{index}.pprof"),
                                                      interval: 1, keep: 3).start!
end

run app
