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
    spec = Gem::Specification.load(File.join(PROJECT_ROOT, "memprofiler_pprof_rs.gemspec"))
    expect(spec.version.to_s).to eq(MemprofilerPprof::VERSION)
    expect(spec.files).to include("Cargo.toml", "Cargo.lock", "build.rs", "proto/profile.proto",
                                  "ext/memprofiler_pprof_rs/extconf.rb", "src/lib.rs")
    # Every member of the workspace: cargo reads them all to build any one.
    members = File.read(File.join(PROJECT_ROOT, "Cargo.toml"))[/^members = \[(.*)\]$/, 1].scan(/"([^"]+)"/).flatten
    expect(members).to include("crates/sampler", "crates/analysis")
    (members - ["."]).each do |member|
      expect(spec.files).to include("#{member}/Cargo.toml", "#{member}/src/lib.rs")
    end
    expect(spec.files.grep(/\.so\z/)).to be_empty
  end

  it "exits cleanly when required and never used" do
    _out, err, status = run_ruby('require "memprofiler_pprof_rs"')
    expect(status).to be_success, err
    expect(err).to be_empty
  end
end

RSpec.describe "lazy loading" do
  # Constants loaded on first use (Module#autoload), with a library each
  # brings that a profiling-only process must not load.
  # (PyroscopeFlusher loads the uploader, and net/http, when it makes one.)
  autoloaded = {
    "BlockFlusher" => nil, "FileFlusher" => nil, "EnvConfig" => nil,
    "PyroscopeFlusher" => nil, "PyroscopeUploader" => "net/http", "PyroscopeAddress" => "uri",
    "PprofReader" => "stringio", "RackApp" => "openssl", "CLI" => "optparse"
  }.freeze

  it "loads no network, TLS, zlib, reader, CLI or Rack code on require" do
    out, err, status = run_ruby(<<~RUBY)
      require "memprofiler_pprof_rs"
      heavy = $LOADED_FEATURES.grep(%r{/(net/|openssl|zlib|optparse|ipaddr)})
      ours = $LOADED_FEATURES.grep(%r{memprofiler_pprof_rs/(flushers|pyroscope|rack_app|cli|env_config|readers/pprof_reader)})
      puts heavy.inspect, ours.inspect
      puts #{autoloaded.keys.inspect}.map { |name| MemprofilerPprof.autoload?(name) ? "autoload" : "loaded" }.uniq.inspect
    RUBY
    expect(status).to be_success, err
    expect(out.lines.map(&:chomp)).to eq(["[]", "[]", '["autoload"]'])
  end

  # Every library the require pulls in is paid for by every process that
  # loads the gem (fileutils and securerandom alone were half of its cost).
  it "loads no file from outside the gem on require" do
    out, err, status = run_ruby(<<~RUBY)
      before = $LOADED_FEATURES.dup
      require "memprofiler_pprof_rs"
      lib = #{File.join(PROJECT_ROOT, 'lib/memprofiler_pprof_rs').inspect}
      puts ($LOADED_FEATURES - before).reject { |f| f.start_with?(lib) }.inspect
    RUBY
    expect(status).to be_success, err
    expect(out.chomp).to eq("[]")
  end

  it "resolves each autoloaded constant in a fresh process" do
    autoloaded.each do |name, library|
      out, err, status = run_ruby(<<~RUBY)
        require "memprofiler_pprof_rs"
        klass = MemprofilerPprof::#{name}
        puts klass.name, MemprofilerPprof.autoload?(:#{name}).inspect
        puts #{library.inspect}.nil? || $LOADED_FEATURES.any? { |f| f.include?("/#{library}") }
      RUBY
      expect(status).to be_success, "#{name}: #{err}"
      expect(out.lines.map(&:chomp)).to eq(["MemprofilerPprof::#{name}", "nil", "true"]), name
    end
  end

  it "autoloads from threads at once, and in a forked child" do
    out, err, status = run_ruby(<<~RUBY)
      require "memprofiler_pprof_rs"
      names = %i[FileFlusher PyroscopeFlusher RackApp PprofReader CLI EnvConfig]
      threads = 8.times.map { |i| Thread.new { MemprofilerPprof.const_get(names[i % names.size]).name } }
      puts threads.map(&:value).uniq.size
      pid = fork { exit!(MemprofilerPprof::PyroscopeUploader.name == "MemprofilerPprof::PyroscopeUploader" ? 0 : 1) }
      Process.wait(pid)
      puts $?.success?
    RUBY
    expect(status).to be_success, err
    expect(out.lines.map(&:chomp)).to eq(["6", "true"])
  end
end
