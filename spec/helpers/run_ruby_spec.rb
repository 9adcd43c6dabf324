# frozen_string_literal: true

# The suite's own guard (spec/support/pprof_helpers.rb): a Ruby child that
# hangs fails its example rather than holding the suite until CI's limit.
# (spec/helpers/ holds the specs of spec/support/'s helpers: spec_helper
# loads every file in spec/support/.)
RSpec.describe "PprofHelpers#run_ruby" do
  it "returns what the child printed and how it ended, as Open3.capture3 does" do
    out, err, status = run_ruby('puts ARGV.first; warn "to stderr"; exit 3', args: ["an argument"])
    expect([out, err, status.exitstatus]).to eq(["an argument\n", "to stderr\n", 3])
    env = { "RUN_RUBY_SPEC" => "set" }
    expect(run_ruby('print ENV["RUN_RUBY_SPEC"]', env: env).first).to eq("set")
  end

  it "kills a child still running after its time, and fails the example" do
    expect { run_ruby("sleep 60", seconds: 1) }.to raise_error(RuntimeError, /ran over 1 s and was killed/)
  end
end
