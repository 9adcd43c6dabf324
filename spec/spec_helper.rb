# frozen_string_literal: true

require "memprofiler_pprof_rs"
require "tmpdir"
require "open3"

Dir[File.join(__dir__, "support", "**", "*.rb")].sort.each { |f| require f }
require_relative "fixtures/workload"

RSpec.configure do |config|
  config.disable_monkey_patching!
  config.order = :random
  Kernel.srand config.seed
  config.expect_with(:rspec) { |c| c.syntax = :expect }
  config.include PprofHelpers
  config.include RackServer
end
