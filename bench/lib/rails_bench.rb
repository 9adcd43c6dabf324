# frozen_string_literal: true

require "net/http"
require_relative "report"
require_relative "configs"
require_relative "puma_bench"

# (7) The Rails-depth app (rails_app.ru) under puma, loaded by wrk, as (4)
# does with puma_app.ru: requests/s and p50/p99 latency per configuration,
# each in a fresh puma. Before the runs, one server without a profiler is
# asked (X-Bench-Probe) how much one request allocates and how deep it runs.
module RailsBench
  PATH = "/products?page=3"
  # One connection per puma thread: with more, a busy puma thread serves up
  # to 10 requests in a row on one keep-alive connection (max_fast_inline)
  # while the others wait, which at ~25 ms a request put ~1.3 s of queueing
  # into every configuration's p99 alike (8 connections, no profiler).
  CONNECTIONS = PumaBench::THREADS

  module_function

  def run(runs, configs = BenchConfigs::DEFAULT)
    version = actionpack_version
    unless version
      puts "\n(7) rails: skipped, ruby-actionpack is not installed (script/bootstrap --bench installs it)"
      return
    end
    probe = PumaBench.serve("no profiler", "rails_app.ru") { |base_url| probe(base_url) }
    results = PumaBench.compare(runs, configs, "(7) rails", "rails_app.ru", PATH, connections: CONNECTIONS) or return
    puts
    puts "(7) Rails-depth app: puma #{PumaBench.puma_version}, #{PumaBench::THREADS} threads, bench/lib/rails_app.ru " \
         "(ActionPack #{version}: Rails' production middleware stack, router, a controller, a layout and 3 levels " \
         "of partials with ActionView helpers); per request #{probe[:allocated]} objects allocated inside the app, " \
         "#{probe[:depth]} frames deep at the deepest view helper (puma's included); wrk, #{CONNECTIONS} " \
         "connections, #{PumaBench.setup_text}"
    PumaBench.report(results, configs)
  end

  # (9) The ActiveRecord app (rails_ar_app.ru) under puma, loaded by wrk.
  def run_active_record(runs, configs = BenchConfigs::DEFAULT)
    unless system(RbConfig.ruby, "-e", 'require "rails"; require "sqlite3"', err: File::NULL)
      puts "\n(9) rails-ar: skipped, ruby-rails or ruby-sqlite3 is not installed (script/bootstrap --bench installs them)"
      return
    end
    results = PumaBench.compare(runs, configs, "(9) rails-ar", "rails_ar_app.ru", "/orders?page=3",
                                connections: CONNECTIONS) or return
    puts
    puts "(9) ActiveRecord app: puma #{PumaBench.puma_version}, #{PumaBench::THREADS} threads, " \
         "bench/lib/rails_ar_app.ru (Rails #{actionpack_version} with its railties, production, ActiveRecord on " \
         "SQLite: 30 orders and their customers a request, rendered in a layout with a partial each); wrk, " \
         "#{CONNECTIONS} connections, #{PumaBench.setup_text}"
    PumaBench.report(results, configs)
  end

  # The app's own measurement of one request, taken after a first request
  # has compiled the templates. Nothing else runs on the server meanwhile,
  # so GC's allocation count is this request's.
  def probe(base_url)
    uri = URI(base_url)
    response = Net::HTTP.start(uri.host, uri.port) do |http|
      Array.new(3) { http.get(PATH, "X-Bench-Probe" => "1") }.last
    end
    raise "rails_app.ru answered #{response.code}:\n#{response.body}" unless response.code == "200"

    { allocated: Integer(response["x-bench-allocated"]), depth: Integer(response["x-bench-depth"]) }
  end

  def actionpack_version
    require "action_pack/version"
    ActionPack::VERSION::STRING
  rescue LoadError
    nil
  end
end
