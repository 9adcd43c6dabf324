# frozen_string_literal: true

require "rack/mock"

# A Rails app of bench/lib called in this process, without puma or a
# socket (bench/lib/rails_requests.rb, bench/request_cost.rb): "rails" (the
# Rails-depth app of rails_app.ru) or "rails-ar" (the ActiveRecord app of
# rails_ar_app.ru).
module InProcessApp
  TARGETS = %w[rails rails-ar].freeze

  module_function

  # A lambda that makes one request to the app TARGET and reads its whole
  # body, as a server would; raises unless the app answered 200.
  def request_for(target)
    app, path = load(target)
    lambda do
      env = Rack::MockRequest.env_for("http://127.0.0.1#{path}", "REMOTE_ADDR" => "127.0.0.1",
                                                                 "HTTP_HOST" => "127.0.0.1")
      status, _headers, body = app.call(env)
      body.each(&:bytesize)
      body.close if body.respond_to?(:close)
      raise "the app answered #{status}" unless status == 200
    end
  end

  # Calls REQUEST for SECONDS of the monotonic clock; returns how many.
  def run_for(request, seconds)
    began = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    count = 0
    while Process.clock_gettime(Process::CLOCK_MONOTONIC) - began < seconds
      request.call
      count += 1
    end
    count
  end

  def load(target)
    case target
    when "rails"
      require_relative "rails_app/app"
      [BenchRails.app, "/products"]
    when "rails-ar"
      require_relative "rails_ar_app/app"
      [BenchRailsAr.app, "/orders?page=3"]
    else raise ArgumentError, "unknown app #{target.inspect} (rails or rails-ar)"
    end
  end
end
