# frozen_string_literal: true

# A Rails app of one file for spec/integration/rails_spec.rb: two endpoints, one of
# which keeps what it allocates, and an Active Job that does too, with the
# gem's pprof endpoint in front. Profiled
# through the Railtie (config.memprofiler_pprof), with the settings the
# spec passes as environment variables (MEMPROFILER_PPROF_RS_*).
$LOAD_PATH.unshift(File.expand_path("../../../lib", __dir__))
require "rails"
require "action_controller/railtie"
require "active_job/railtie"
require "logger"
require "memprofiler_pprof_rs" # after Rails: loads the Railtie

class RailsApp < Rails::Application
  config.root = __dir__
  config.eager_load = false
  config.logger = Logger.new(nil)
  config.secret_key_base = "spec" * 16
  config.hosts.clear
  config.active_job.queue_adapter = :inline
  config.memprofiler_pprof.enabled = true
  config.memprofiler_pprof.flush_interval = 1

  routes.append do
    get "/orders/:id" => "orders#show"
    get "/pages/:id" => "pages#show"
    get "/import/:id" => "imports#create"
    get "/gc" => "gc#create"
  end
end

# Keeps a cache line per order it shows: the leak.
class OrdersController < ActionController::Base
  CACHE = [] # rubocop:disable Style/MutableConstant (the leak)

  def show
    CACHE << Array.new(20) { |i| "order #{params[:id]} line #{i}" * 4 }
    render plain: "ok"
  end
end

class PagesController < ActionController::Base
  def show
    Array.new(20) { |i| "page #{params[:id]} line #{i}" * 4 }
    render plain: "ok"
  end
end

# Keeps what it imports.
class ImportJob < ActiveJob::Base
  queue_as :imports
  KEPT = [] # rubocop:disable Style/MutableConstant (the leak)

  def perform(id)
    KEPT << Array.new(20) { |i| "import #{id} row #{i}" * 4 }
  end
end

class ImportsController < ActionController::Base
  def create
    ImportJob.perform_now(params[:id])
    render plain: "ok"
  end
end

# Collects what the requests left behind, so that the next profile's
# in-use holds only what is kept.
class GcController < ActionController::Base
  def create
    GC.start
    render plain: "ok"
  end
end

RailsApp.initialize!
# The pprof endpoint, with what keeps memory alive at /debug/pprof/retainers.
use MemprofilerPprof::RackApp::Middleware, MemprofilerPprof::EnvProfiler.collector, token: "rails-spec-token-0123"
run RailsApp
