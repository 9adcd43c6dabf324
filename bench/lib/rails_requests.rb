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
require "rack/mock"
require "memprofiler_pprof_rs"
require_relative "configs"

config, requests, target = ARGV
requests = Integer(requests)
target ||= "rails"
app, path = case target
            when "rails"
              require_relative "rails_app/app"
              [BenchRails.app, "/products"]
            when "rails-ar"
              require_relative "rails_ar_app/app"
              [BenchRailsAr.app, "/orders?page=3"]
            else abort "rails_requests.rb: unknown app #{target.inspect} (rails or rails-ar)"
            end
request = lambda do
  env = Rack::MockRequest.env_for("http://127.0.0.1#{path}", "REMOTE_ADDR" => "127.0.0.1", "HTTP_HOST" => "127.0.0.1")
  status, _headers, body = app.call(env)
  body.each(&:bytesize) # read the whole body, as a server would
  body.close if body.respond_to?(:close)
  raise "the app answered #{status}" unless status == 200
end
3.times { request.call }
GC.start
stop = BenchConfigs::ALL.fetch(config).call
allocated_before = GC.stat(:total_allocated_objects)
requests.times { request.call }
allocated = GC.stat(:total_allocated_objects) - allocated_before
extra = stop&.call(report: false) || {}
puts JSON.generate({ allocated: allocated, requests: requests, **extra })
