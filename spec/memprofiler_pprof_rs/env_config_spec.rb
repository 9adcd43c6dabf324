# frozen_string_literal: true

# MemprofilerPprof::EnvConfig: the MEMPROFILER_PPROF_RS_* variables the
# wrapper and the Railtie read, each to a setting or, when bad, to a warning
# that names it and the value used instead. (Where a variable's value must
# not leak, Pyroscope credentials, see spec/memprofiler_pprof_rs/pyroscope/address_spec.rb and
# spec/integration/hostile_input_spec.rb; the documented defaults,
# spec/integration/documented_defaults_spec.rb.)
RSpec.describe MemprofilerPprof::EnvConfig do
  describe "the collector's settings" do
    it "chooses the mode and sampling windows, and reports a bad value instead of raising it" do
      config = described_class.new("MEMPROFILER_PPROF_RS_MODE" => "light",
                                   "MEMPROFILER_PPROF_RS_WINDOW_PROBABILITY" => "0.25")
      collector = MemprofilerPprof::Collector.new(**config.collector_options)
      expect([collector.mode, collector.window_probability]).to eq([:light, 0.25])
      bad = described_class.new("MEMPROFILER_PPROF_RS_MODE" => "fast",
                                "MEMPROFILER_PPROF_RS_WINDOW_PROBABILITY" => "0")
      expect([bad.mode, bad.window_probability]).to eq([:light, 1.0])
      expect(bad.warnings.join("\n")).to include("MEMPROFILER_PPROF_RS_MODE=\"fast\"",
                                                 "MEMPROFILER_PPROF_RS_WINDOW_PROBABILITY=\"0\"")
    end

    it "takes a window budget, which wins over a window probability" do
      config = described_class.new("MEMPROFILER_PPROF_RS_WINDOW_BUDGET" => "50000",
                                   "MEMPROFILER_PPROF_RS_WINDOW_PROBABILITY" => "0.25")
      collector = MemprofilerPprof::Collector.new(**config.collector_options)
      expect([collector.window_budget, collector.window_probability]).to eq([50_000, 1.0])
      expect(config.warnings).to eq(["ignoring MEMPROFILER_PPROF_RS_WINDOW_PROBABILITY=\"0.25\": " \
                                     "a window budget is set; using 1.0"])
      bad = described_class.new("MEMPROFILER_PPROF_RS_WINDOW_BUDGET" => "lots")
      expect(bad.window_budget).to eq(:auto)
      expect(bad.warnings.join).to include("MEMPROFILER_PPROF_RS_WINDOW_BUDGET=\"lots\"")
      expect(MemprofilerPprof::Collector.new(**bad.collector_options).window_budget).to eq(100_000)
      # "none" turns the default budget off; "auto" is the default; the
      # warm-up is a count.
      none = described_class.new("MEMPROFILER_PPROF_RS_WINDOW_BUDGET" => "none",
                                 "MEMPROFILER_PPROF_RS_WINDOW_WARM_UP" => "0")
      collector = MemprofilerPprof::Collector.new(**none.collector_options)
      expect([collector.window_budget, collector.window_warm_up, none.warnings]).to eq([nil, 0, []])
      auto = described_class.new("MEMPROFILER_PPROF_RS_WINDOW_BUDGET" => "Auto")
      expect(MemprofilerPprof::Collector.new(**auto.collector_options).window_budget).to eq(100_000)
    end

    it "reads MEMPROFILER_PPROF_RS_INUSE_AS_OF, and warns of a bad value" do
      expect(described_class.new("MEMPROFILER_PPROF_RS_INUSE_AS_OF" => "flush").collector_options[:inuse_as_of])
        .to eq(:flush)
      config = described_class.new("MEMPROFILER_PPROF_RS_INUSE_AS_OF" => "now")
      expect(config.collector_options[:inuse_as_of]).to eq(:last_gc)
      expect(config.warnings.join).to include("MEMPROFILER_PPROF_RS_INUSE_AS_OF", "now")
    end
  end

  describe "the file flusher's settings" do
    it "ignores a MEMPROFILER_PPROF_RS_FILE_MODE that lets group or others write, saying so by name" do
      %w[777 666 0660 620 002].each do |value|
        config = described_class.new("MEMPROFILER_PPROF_RS_FILE_MODE" => value)
        expect(config.file_flusher_options[:mode]).to eq(0o600)
        expect(config.warnings).to eq(["ignoring MEMPROFILER_PPROF_RS_FILE_MODE=#{value.inspect}: must be an octal " \
                                       "file permission that neither group nor others may write, such as 600, 640 " \
                                       "or 644; using 0600"])
      end
      %w[640 0644 600 400].each do |value|
        config = described_class.new("MEMPROFILER_PPROF_RS_FILE_MODE" => value)
        expect(config.warnings).to be_empty
        expect(config.file_flusher_options[:mode]).to eq(Integer(value, 8))
      end
    end
  end
end
