# frozen_string_literal: true

RSpec.describe MemprofilerPprof::Atfork do
  it "reports a failing handler on $stderr instead of failing the fork, and removes handlers" do
    code = <<~RUBY
      require "memprofiler_pprof_rs"
      calls = []
      failing = MemprofilerPprof::Atfork.at_fork(:parent) { raise "handler broke" }
      MemprofilerPprof::Atfork.at_fork(:parent) { calls << :parent }
      MemprofilerPprof::Atfork.at_fork(:prepare) { calls << :prepare }
      Process.wait(fork { exit!(0) })
      failing.remove!
      Process.wait(fork { exit!(0) })
      puts calls.join(",")
    RUBY
    out, err, status = run_ruby(code)
    expect(status).to be_success, err
    expect(out.strip).to eq("prepare,parent,prepare,parent")
    expect(err.scan(/at_fork\(:parent\) handler failed: RuntimeError: handler broke/).size).to eq(1)
  end

  it "rejects an unknown stage or a missing block" do
    expect { described_class.at_fork(:later) { nil } }.to raise_error(ArgumentError, /stage.*:later/)
    expect { described_class.at_fork(:child) }.to raise_error(ArgumentError, /block/)
  end
end
