# frozen_string_literal: true

require "fileutils"
require "pathname"

RSpec.describe MemprofilerPprof::ProfileData do
  let(:data) { MemprofilerPprof::Collector.new(sample_rate: 1.0).profile { Array.new(100) { "x" * 20 } } }

  it "writes atomically in binary mode, whatever the default encodings" do
    Dir.mktmpdir("profile-data-spec") do |dir|
      path = File.join(dir, "deep/er/heap.pprof")
      code = <<~RUBY
        require "memprofiler_pprof_rs"
        bytes = File.binread(ARGV[0])
        data = MemprofilerPprof::ProfileData.new(pprof_data: bytes)
        Encoding.default_external = Encoding::UTF_16LE
        Encoding.default_internal = Encoding::UTF_8
        data.write(ARGV[1])
      RUBY
      source = File.join(dir, "source.pprof")
      File.binwrite(source, data.pprof_data)
      _out, err, status = run_ruby("#{code}\n", args: [source, path])
      expect(status).to be_success, err
      expect(File.binread(path)).to eq(data.pprof_data)
      expect(Dir.children(File.dirname(path))).to eq(["heap.pprof"])
    end
  end

  it "replaces an existing file and leaves no temporary file when it fails" do
    Dir.mktmpdir("profile-data-spec") do |dir|
      path = File.join(dir, "heap.pprof")
      File.write(path, "old")
      expect(data.write(Pathname.new(path))).to eq(path)
      expect(File.binread(path)).to eq(data.pprof_data)
      FileUtils.mkdir_p(File.join(dir, "taken/inner"))
      expect { data.write(File.join(dir, "taken")) }.to raise_error(SystemCallError)
      expect(Dir.children(dir).sort).to eq(%w[heap.pprof taken])
      expect { data.write(nil) }.to raise_error(TypeError, /path.*nil/)
    end
  end

  it "describes itself without dumping the profile" do
    text = data.inspect
    expect(text).to start_with("#<MemprofilerPprof::ProfileData ")
    expect(text).to include("allocation samples", "heap samples", "sample_rate=1.0", "bytes of pprof")
    expect(text).to be_ascii_only
    expect(text.size).to be < 250
    expect(data.to_s).to eq(text)
    expect(data.duration).to be >= 0
  end
end
