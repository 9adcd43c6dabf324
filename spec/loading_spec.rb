# frozen_string_literal: true

RSpec.describe "loading the gem" do
  it "defines the module, version and classes in a fresh process" do
    out, err, status = run_ruby(<<~RUBY)
      require "memprofiler_pprof_rs"
      puts MemprofilerPprof::VERSION
      puts MemprofilerPprof::Collector.private_instance_methods(false).grep(/_native_/).size > 5
      puts MemprofilerPprof::ProfileData.name
    RUBY
    expect(status).to be_success, err
    expect(out.lines.map(&:chomp)).to eq([MemprofilerPprof::VERSION, "true", "MemprofilerPprof::ProfileData"])
  end

  it "has a version matching the gemspec" do
    spec = Gem::Specification.load(File.expand_path("../memprofiler_pprof_rs.gemspec", __dir__))
    expect(spec.version.to_s).to eq(MemprofilerPprof::VERSION)
    expect(spec.files).to include("Cargo.toml", "Cargo.lock", "build.rs", "proto/profile.proto",
                                  "ext/memprofiler_pprof_rs/extconf.rb", "src/lib.rs")
    expect(spec.files.grep(/\.so\z/)).to be_empty
  end

  it "exits cleanly when required and never used" do
    _out, err, status = run_ruby('require "memprofiler_pprof_rs"')
    expect(status).to be_success, err
    expect(err).to be_empty
  end
end
