# frozen_string_literal: true

# The jobs of spec/integration/sidekiq_spec.rb's Sidekiq process (profiled by the
# wrapper, exe/memprofiler_pprof_rs_profile): one keeps what it makes.
require "memprofiler_pprof_rs"

Sidekiq.configure_server do |config|
  config.server_middleware { |chain| chain.add MemprofilerPprof::SidekiqLabels }
end

# Keeps a row per import: the leak.
class ImportRowsJob
  include Sidekiq::Worker
  sidekiq_options queue: "imports"
  KEPT = [] # rubocop:disable Style/MutableConstant (the leak)

  def perform(id)
    KEPT << Array.new(20) { |i| "import #{id} row #{i}" * 4 }
  end
end

class SendMailJob
  include Sidekiq::Worker

  def perform(id)
    Array.new(20) { |i| "mail #{id} line #{i}" * 4 }
  end
end
