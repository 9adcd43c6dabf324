# frozen_string_literal: true

require_relative "lib/memprofiler_pprof_rs/version"

Gem::Specification.new do |spec|
  spec.name = "memprofiler_pprof_rs"
  spec.version = MemprofilerPprof::VERSION
  spec.summary = "Sampling heap and allocation profiler for Ruby that writes pprof profiles"
  spec.description = <<~DESC
    Samples allocations in a running Ruby process, tracks which sampled objects are
    still alive, and writes gzipped pprof profiles readable by go tool pprof and
    Grafana Pyroscope. API-compatible with ruby_memprofiler_pprof; the native core
    is written in Rust.
  DESC
  spec.authors = ["memprofiler_pprof_rs developers"]
  spec.license = "MIT"
  spec.required_ruby_version = ">= 3.1"

  # Everything cargo needs to build the crate, plus the Ruby code. Listed
  # explicitly (not from git) so the gem also builds from an unpacked tarball.
  # vendor/crates (gitignored) exists only while `rake build` runs: the crates
  # cargo needs (script/vendor-crates), so that installing the gem needs no network.
  spec.files = Dir.chdir(__dir__) do
    Dir["{Cargo.toml,Cargo.lock,build.rs,README.md,ARCHITECTURE.md,CHANGELOG.md,LICENSE}"] + Dir["docs/*.md"] +
      Dir["proto/**/*.proto"] + Dir["{src,crates}/**/*.{rs,js,css}"] + Dir["crates/*/Cargo.toml"] +
      Dir["ext/**/*.rb"] + Dir["lib/**/*.rb"] + Dir["exe/*"] +
      Dir.glob("vendor/crates/**/*", File::FNM_DOTMATCH).select { |f| File.file?(f) }
  end
  spec.bindir = "exe"
  spec.executables = ["memprofiler_pprof_rs", "memprofiler_pprof_rs_profile"]
  spec.require_paths = ["lib"]
  spec.extensions = ["ext/memprofiler_pprof_rs/extconf.rb"]
  spec.metadata["rubygems_mfa_required"] = "true"
end
