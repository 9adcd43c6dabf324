# frozen_string_literal: true

require "fileutils"
require "tmpdir"

# Which extension `require "memprofiler_pprof_rs"` loads, in the layouts of
# the platform gem (lib/memprofiler_pprof_rs/<major.minor>/), a checkout and
# a source gem; and the LoadError a user gets when none fits.
# script/verify-native-gem checks the real platform gem on every Ruby.
RSpec.describe MemprofilerPprof::NativeExtension do
  project_lib = File.join(PROJECT_ROOT, "lib")
  ruby_minor = RUBY_VERSION[/\A\d+\.\d+/]

  around do |example|
    Dir.mktmpdir("memprofiler-native-ext") do |dir|
      @lib = File.join(dir, "lib")
      Dir.glob("**/*.rb", base: project_lib).each do |file|
        FileUtils.mkdir_p(File.dirname(File.join(@lib, file)))
        FileUtils.cp(File.join(project_lib, file), File.join(@lib, file))
      end
      example.run
    end
  end

  # Runs code with only the copied lib/ on the load path.
  def require_copy(code = "")
    Open3.capture3({ "RUBYLIB" => nil, "RUBYOPT" => nil }, RbConfig.ruby, "-I", @lib, "-e",
                   "require 'memprofiler_pprof_rs'\n#{code}")
  end

  def precompiled(version, so_contents)
    dir = File.join(@lib, "memprofiler_pprof_rs", version)
    FileUtils.mkdir_p(dir)
    File.binwrite(File.join(dir, "memprofiler_pprof_rs.so"), so_contents)
  end

  let(:built_so) { File.binread(File.join(project_lib, "memprofiler_pprof_rs", "memprofiler_pprof_rs.so")) }

  it "loads the platform gem's extension for this Ruby" do
    precompiled("2.9", "not an extension")
    precompiled(ruby_minor, built_so)
    out, err, status = require_copy(<<~RUBY)
      puts $LOADED_FEATURES.grep(/memprofiler_pprof_rs\\.so/)
      puts MemprofilerPprof::Collector.new(sample_rate: 1.0).profile { Array.new(50) { "x" * 10 } }.allocation_samples_count >= 50
    RUBY
    expect(status).to be_success, err
    expect(out.lines.map(&:chomp)).to eq([File.join(@lib, "memprofiler_pprof_rs", ruby_minor, "memprofiler_pprof_rs.so"), "true"])
  end

  it "names the Rubies it has and the source gem when none is for this Ruby" do
    precompiled("9.10", built_so)
    precompiled("9.9", built_so)
    _out, err, status = require_copy
    expect(status).not_to be_success
    expect(err).to include("has precompiled extensions for Ruby 9.9, 9.10, not for Ruby #{RUBY_VERSION}")
    expect(err).to include("(LoadError)", "gem install memprofiler_pprof_rs --platform ruby", "BUNDLE_FORCE_RUBY_PLATFORM")
    expect(err).not_to include("cannot load such file")
  end

  it "says what the loader said and what to do when this Ruby's extension does not load" do
    precompiled(ruby_minor, "not an ELF file")
    _out, err, status = require_copy
    expect(status).not_to be_success
    expect(err).to include("the precompiled extension #{File.join(@lib, 'memprofiler_pprof_rs', ruby_minor)}")
    expect(err).to include("could not be loaded", "glibc 2.28", "--platform ruby")
  end

  it "says how to build it when there is none at all" do
    _out, err, status = require_copy
    expect(status).not_to be_success
    expect(err).to include("its native extension is not built", "rake compile")
  end

  it "ignores version-like directories without an extension" do
    FileUtils.mkdir_p(File.join(@lib, "memprofiler_pprof_rs", "3.0"))
    FileUtils.cp(File.join(project_lib, "memprofiler_pprof_rs", "memprofiler_pprof_rs.so"),
                 File.join(@lib, "memprofiler_pprof_rs", "memprofiler_pprof_rs.so"))
    out, err, status = require_copy("puts $LOADED_FEATURES.grep(/memprofiler_pprof_rs\\.so/)")
    expect(status).to be_success, err
    expect(out.chomp).to eq(File.join(@lib, "memprofiler_pprof_rs", "memprofiler_pprof_rs.so"))
  end
end
