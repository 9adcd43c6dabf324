# frozen_string_literal: true

# A Rails app called in this process, without puma or a socket, for bench/run
# callgrind rails and rails-ar: instructions per request do not move with
# the machine's load the way requests a second do. APP: rails (the
# Rails-depth app of rails_app.ru, the default) or rails-ar (the
# ActiveRecord app of rails_ar_app.ru).
#
#   ruby -Ilib bench/lib/rails_requests.rb "CONFIGURATION" REQUESTS [APP]
#
# The app is loaded and warmed up (templates compiled, inline caches
# filled) before the profiler starts; REQUESTS requests follow, then the
# profiler stops without reading out its results. Prints one JSON line.

require "json"
require "memprofiler_pprof_rs"
require_relative "configs"
require_relative "in_process_app"

config, requests, target = ARGV
requests = Integer(requests)
target ||= "rails"
abort "rails_requests.rb: unknown app #{target.inspect} (rails or rails-ar)" unless InProcessApp::TARGETS.include?(target)
request = InProcessApp.request_for(target)
3.times { request.call }
GC.start
stop = BenchConfigs.fetch(config).call
allocated_before = GC.stat(:total_allocated_objects)
requests.times { request.call }
allocated = GC.stat(:total_allocated_objects) - allocated_before
extra = stop&.call(report: false) || {}
puts JSON.generate({ allocated: allocated, requests: requests, **extra })
