# frozen_string_literal: true

# The Rails-depth app of bench/lib/rails_app.ru called in this process,
# without puma or a socket, for bench/run callgrind rails: instructions per
# request do not move with the machine's load the way requests a second do.
#
#   ruby -Ilib bench/lib/rails_requests.rb "CONFIGURATION" REQUESTS
#
# The app is loaded and warmed up (templates compiled, inline caches
# filled) before the profiler starts; REQUESTS requests follow, then the
# profiler stops without reading out its results. Prints one JSON line.

require "json"
require "rack/mock"
require "memprofiler_pprof_rs"
require_relative "rails_app/app"
require_relative "configs"

config, requests = ARGV
requests = Integer(requests)
app = BenchRails.app
request = lambda do
  env = Rack::MockRequest.env_for("http://127.0.0.1/products", "REMOTE_ADDR" => "127.0.0.1", "HTTP_HOST" => "127.0.0.1")
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
