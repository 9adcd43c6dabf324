# frozen_string_literal: true

require "memprofiler_pprof_rs"
require "tmpdir"
require "open3"

# The project's root and spec/ folders, for spec files at any depth under
# spec/ (spec/memprofiler_pprof_rs/ mirrors lib/memprofiler_pprof_rs/;
# spec/integration/ holds what crosses the gem: real servers, processes,
# the wrapper, hostile use).
PROJECT_ROOT = File.expand_path("..", __dir__)
SPEC_ROOT = __dir__

Dir[File.join(__dir__, "support", "**", "*.rb")].sort.each { |f| require f }
require_relative "fixtures/workload"

# `:slow` marks what the fast loop (`rake spec:fast`) leaves out: real
# servers (Rails, puma, Sidekiq, Sinatra, WEBrick), a headless browser, and
# single examples of several seconds (statistics over many allocations,
# GC.stress). `rspec` and script/test run everything.
RSpec.configure do |config|
  config.disable_monkey_patching!
  config.order = :random
  Kernel.srand config.seed
  config.expect_with(:rspec) { |c| c.syntax = :expect }
  config.include PprofHelpers
  config.include RackServer
end
