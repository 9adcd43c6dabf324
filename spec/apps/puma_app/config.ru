# frozen_string_literal: true

# A Rails app for spec/integration/puma_cluster_spec.rb, served by puma in cluster mode
# (puma.rb: 2 workers, preload_app!) and profiled through the Railtie as its
# README says: /leaky keeps 2,000 Strings of about 100 bytes a request,
# /clean makes as many and keeps none. Each worker writes what it keeps
# (ObjectSpace.memsize_of, summed) to truth-PID in PUMA_APP_TRUTH_DIR: the
# ground truth its profiles are checked against.
$LOAD_PATH.unshift(File.expand_path("../../../lib", __dir__))
require "rails"
require "action_controller/railtie"
require "logger"
require "objspace"
require "memprofiler_pprof_rs" # after Rails: loads the Railtie

class PumaApp < Rails::Application
  config.root = __dir__
  config.eager_load = false
  config.logger = Logger.new(nil)
  config.secret_key_base = "spec" * 16
  config.hosts.clear
  config.memprofiler_pprof.enabled = true

  routes.append do
    get "/leaky" => "leak#leaky"
    get "/clean" => "leak#clean"
  end
end

class LeakController < ActionController::Base
  PAD = "." * 90
  KEPT = [] # rubocop:disable Style/MutableConstant (the leak)
  TRUTH = File.join(ENV.fetch("PUMA_APP_TRUTH_DIR"), "truth-%d")
  LOCK = Mutex.new
  @kept_bytes = 0

  class << self
    attr_accessor :kept_bytes
  end

  def leaky
    kept = Array.new(2_000) { |i| "leak #{i} #{PAD}" }
    bytes = kept.sum { |s| ObjectSpace.memsize_of(s) } + ObjectSpace.memsize_of(kept)
    LOCK.synchronize do
      KEPT << kept
      self.class.kept_bytes += bytes
      File.write(format(TRUTH, Process.pid), self.class.kept_bytes.to_s)
    end
    render plain: "ok"
  end

  def clean
    made = Array.new(2_000) { |i| "clean #{i} #{PAD}" }
    render plain: made.size.to_s
  end
end

PumaApp.initialize!
run PumaApp
