# frozen_string_literal: true

require "fileutils"
require "find"

# The path a user takes: gem build, then gem install --local of the result
# (no RubyGems server), then require. Slow (a cold cargo build), so it runs
# once, building in its own temporary directory.
RSpec.describe "gem build and gem install --local", :slow do
  root = PROJECT_ROOT

  before(:all) do
    @dir = Dir.mktmpdir("memprofiler-gem-spec")
    @tmp = File.join(@dir, "tmp")
    @gem_home = File.join(@dir, "gems")
    FileUtils.mkdir_p(@tmp)
    gem_file = File.join(@dir, "memprofiler_pprof_rs.gem")
    env = {
      "TMPDIR" => @tmp, "GEM_HOME" => @gem_home, "GEM_PATH" => @gem_home,
      "MEMPROFILER_PPROF_RS_TARGET_DIR" => nil, "RUBYOPT" => nil
    }
    Dir.chdir(root) do
      @build_out, @build_status = Open3.capture2e(env, "gem", "build", "memprofiler_pprof_rs.gemspec",
                                                  "--output", gem_file)
    end
    @install_out, @install_status = Open3.capture2e(
      env, "gem", "install", "--local", "--no-document", "--install-dir", @gem_home, gem_file
    )
    @env = env
  end

  after(:all) { FileUtils.rm_rf(@dir) }

  it "builds and installs offline" do
    expect(@build_status).to be_success, @build_out
    expect(@install_status).to be_success, @install_out
  end

  it "loads and profiles from the installed gem, not from this checkout" do
    code = <<~RUBY
      require "memprofiler_pprof_rs"
      data = MemprofilerPprof::Collector.new(sample_rate: 1.0).profile { Array.new(100) { "x" * 10 } }
      puts $LOADED_FEATURES.grep(/memprofiler_pprof_rs\\.so/).first
      puts data.allocation_samples_count >= 100
      puts defined?(MemprofilerPprof::EmptyHooks).inspect
    RUBY
    out, err, status = Open3.capture3(@env.merge("RUBYLIB" => nil), RbConfig.ruby, "-e", code, chdir: @dir)
    expect(status).to be_success, err
    so_path, profiled, empty_hooks = out.lines.map(&:chomp)
    expect(so_path).to start_with(@gem_home)
    expect(profiled).to eq("true")
    # bench/'s empty hooks are a development build's only.
    expect(empty_hooks).to eq("nil")
  end

  it "installs the wrapper executable, which profiles a program with the installed gem" do
    wrapper = File.join(@gem_home, "bin", "memprofiler_pprof_rs_profile")
    expect(File.executable?(wrapper)).to be(true)
    pattern = File.join(@dir, "profiles", "mem-%{pid}.pprof")
    # Ruby code for -e: the child interpolates "x#{i}".
    code = 'kept = Array.new(1000) { |i| "x#{i}" }; puts $LOADED_FEATURES.grep(/memprofiler_pprof_rs\\.so/).first' # rubocop:disable Lint/InterpolationCheck
    env = @env.merge("RUBYLIB" => nil, "MEMPROFILER_PPROF_RS_FILE_PATTERN" => pattern)
    out, err, status = Open3.capture3(env, wrapper, RbConfig.ruby, "-e", code, chdir: @dir)
    expect(status).to be_success, err
    expect(out.strip).to start_with(@gem_home)
    profiles = Dir[File.join(@dir, "profiles", "*.pprof")]
    expect(profiles.size).to eq(1)
    parse_profile(File.binread(profiles.first))
  end

  it "installs the memprofiler_pprof_rs executable, which reads a profile with the installed gem" do
    exe = File.join(@gem_home, "bin", "memprofiler_pprof_rs")
    expect(File.executable?(exe)).to be(true)
    profile = File.join(@dir, "heap.pprof")
    File.binwrite(profile, MemprofilerPprof::Collector.new(sample_rate: 1.0).profile { Array.new(100) { "x" * 10 } }.pprof_data)
    out, err, status = Open3.capture3(@env.merge("RUBYLIB" => nil), exe, "top", profile, "-i", "alloc_objects", chdir: @dir)
    expect(status).to be_success, err
    expect(out).to include("Type: alloc_objects (count)")
    html = File.join(@dir, "heap.html")
    _out, err, status = Open3.capture3(@env.merge("RUBYLIB" => nil), exe, "flamegraph", profile, "-o", html, chdir: @dir)
    expect(status).to be_success, err
    expect(File.read(html)).to include("<canvas")
  end

  it "leaves no cargo build output behind, in the gem or in TMPDIR" do
    expect(@install_status).to be_success, @install_out
    installed_bytes = 0
    Find.find(@gem_home) { |path| installed_bytes += File.size(path) if File.file?(path) }
    # The gem is ~13 MB (the extension twice, ~4 MB each with the regex
    # crate's engines and Unicode tables, and the vendored crates' sources);
    # a cargo target/ left behind would be hundreds.
    expect(installed_bytes).to be < 20 * 1024 * 1024
    expect(Dir.glob(File.join(@gem_home, "**", "target", "release"))).to be_empty
    expect(Dir.children(@tmp).grep(/cargo/)).to be_empty
  end
end
