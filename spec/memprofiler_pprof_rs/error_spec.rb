# frozen_string_literal: true

require "spec_helper"

RSpec.describe MemprofilerPprof::Error do
  it "is included by every exception the gem raises on its own account, which keep their superclasses" do
    classes = [MemprofilerPprof::StateError, MemprofilerPprof::InternalError, MemprofilerPprof::UnsupportedRuntimeError,
               MemprofilerPprof::ProfileFormatError, MemprofilerPprof::ProfileMemoryLimitError,
               MemprofilerPprof::PprofReader::FormatError, MemprofilerPprof::PprofReader::MemoryLimitError,
               MemprofilerPprof::CLI::UsageError, MemprofilerPprof::RetentionError]
    expect(classes).to all(be < described_class)
    expect([MemprofilerPprof::StateError, MemprofilerPprof::InternalError]).to all(be < RuntimeError)
  end

  it "catches what the native code and the readers raise, in one rescue" do
    collector = MemprofilerPprof::Collector.new
    collector.start!
    expect { collector.mode = :exact }.to raise_error(MemprofilerPprof::StateError, /stopped/)
    expect { collector.mode = :exact }.to raise_error(described_class)
    expect { collector.window_warm_up = 0 }.to raise_error(RuntimeError)
    collector.stop!
    profile = MemprofilerPprof::Profile.parse(collector.flush.pprof_data)
    merger = MemprofilerPprof::Profile::Merger.new
    merger << profile
    merger.finish
    expect { merger << profile }.to raise_error(MemprofilerPprof::StateError, /finished/)
    expect { MemprofilerPprof::Profile.parse("not a profile") }.to raise_error(described_class)
    expect { MemprofilerPprof::PprofReader.parse("not a profile") }.to raise_error(described_class)
    expect { collector.sample_rate = 2 }.to raise_error(ArgumentError)
  end
end
