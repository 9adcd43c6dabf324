# frozen_string_literal: true

# (7) A Rails-depth Rack application for bench/run rails: Rails 6.1's
# ActionDispatch middleware stack (production's, less what needs railties),
# its router, an ActionController::Base controller and ActionView templates
# with a layout, nested partials and the usual helpers, all from Debian's
# ruby-actionpack. Each request to /products runs 120+ Ruby frames deep and
# allocates 20,000+ objects, as a Rails page does; puma_app.ru is a flat app
# of ~2,000 allocations a request.
#
# BENCH_PROFILER names a configuration of bench/lib/configs.rb; when it is
# this gem, a FileFlusher writes profiles into BENCH_PROFILE_DIR (as in
# puma_app.ru).
#
# A request with the header X-Bench-Probe answers, in x-bench-allocated and
# x-bench-depth, how many objects it allocated inside this app and how deep
# the Ruby stack was (frames, with caller's C frames) at the deepest helper.

require "objspace"
require "memprofiler_pprof_rs"
require_relative "rails_app/app"
require_relative "configs"

BenchConfigs.fetch(ENV.fetch("BENCH_PROFILER")).call
BenchConfigs.start_flusher

use MemprofilerPprof::RackLabels if BenchConfigs.rack_labels
run BenchRails.app
