# frozen_string_literal: true

require "tmpdir"

# Each example of a group that includes this runs with @dir, a fresh
# temporary directory removed after it.
RSpec.shared_context "in a temporary directory" do
  around do |example|
    Dir.mktmpdir("memprofiler-spec") do |dir|
      @dir = dir
      example.run
    end
  end
end
