# frozen_string_literal: true

require "fileutils"

# exe/memprofiler_pprof_rs_profile: any program, profiled from its first line.
RSpec.describe "memprofiler_pprof_rs_profile" do
  let(:root) { PROJECT_ROOT }
  let(:wrapper) { File.join(root, "exe", "memprofiler_pprof_rs_profile") }

  include_context "in a temporary directory"

  # A script whose allocations are easy to find: it keeps 3,000 Strings from
  # WrappedApp#fill, optionally sleeps, then exits with `status`. The app is
  # held by a constant: a GC before the exit flush must not free the Strings
  # (with less loaded at boot, Ruby 3.4 sometimes collects there).
  def write_script(sleep_seconds: 0, status: 0, extra: "")
    path = File.join(@dir, "app.rb")
    File.write(path, <<~RUBY)
      class WrappedApp
        def fill
          @kept = Array.new(3_000) { |i| "kept \#{i}" }
        end
      end
      KEPT_APP = WrappedApp.new.tap(&:fill)
      #{extra}
      sleep #{sleep_seconds}
      puts "app ran in \#{Process.pid}"
      exit #{status}
    RUBY
    path
  end

  def run_wrapped(*command, env: {})
    base = {
      "MEMPROFILER_PPROF_RS_FILE_PATTERN" => "#{@dir}/profiles/mem-%{pid}-%{index}.pprof",
      "RUBYOPT" => nil, "RUBYLIB" => nil
    }
    Open3.capture3(base.merge(env), wrapper, *command, chdir: @dir)
  end

  def profile_paths
    Dir["#{@dir}/profiles/*.pprof"].sort_by { |path| path[/-(\d+)\.pprof\z/, 1].to_i }
  end

  it "profiles a program from its first line, flushing every interval and once more at exit" do
    script = write_script(sleep_seconds: 1.3)
    out, err, status = run_wrapped(RbConfig.ruby, script, env: {
                                     "MEMPROFILER_PPROF_RS_SAMPLE_RATE" => "1",
                                     "MEMPROFILER_PPROF_RS_FLUSH_INTERVAL" => "0.5"
                                   })
    expect(status).to be_success, err
    expect(err).to eq("")
    pid = out[/app ran in (\d+)/, 1]
    paths = profile_paths
    expect(paths.size).to be_between(3, 4) # at ~0.5 s, ~1.0 s, and at exit
    expect(paths).to all(include("mem-#{pid}-"))
    profiles = paths.map { |path| parse_profile(File.binread(path)) } # each read by go tool pprof
    expect(total_through(profiles.first, "WrappedApp#fill", "alloc_objects")).to be >= 3_000
    expect(total_through(profiles.last, "WrappedApp#fill", "inuse_objects")).to be >= 3_000
    expect(profiles.last.period).to eq(1)
  end

  it "leaves a profile behind for a program that exits after two seconds" do
    script = write_script(sleep_seconds: 2)
    _out, err, status = run_wrapped(RbConfig.ruby, script)
    expect(status).to be_success, err
    expect(profile_paths.size).to eq(1) # no 30 s interval passed: the exit flush
    profile = parse_profile(File.binread(profile_paths.first))
    expect(profile.period).to eq(100) # the default rate, 0.01
    expect(total_through(profile, "WrappedApp#fill", "inuse_objects")).to be_positive
  end

  it "passes the exit status through and profiles child processes separately" do
    script = write_script(status: 3, extra: <<~RUBY)
      child = fork { WrappedApp.new.fill; exit 0 }
      Process.wait(child)
      File.write("#{@dir}/child_pid", child.to_s)
    RUBY
    _out, err, status = run_wrapped(RbConfig.ruby, script, env: { "RUBY_MEMPROFILER_PPROF_SAMPLE_RATE" => "1.0" })
    expect(status.exitstatus).to eq(3), err
    child_pid = File.read("#{@dir}/child_pid")
    pids = profile_paths.map { |path| path[/mem-(\d+)-/, 1] }.uniq
    expect(pids.size).to eq(2)
    expect(pids).to include(child_pid)
    child_profile = parse_profile(File.binread(profile_paths.find { |p| p.include?("mem-#{child_pid}-") }))
    # The C gem's variable name works; at rate 1 the child's own fill counts exactly.
    expect(total_through(child_profile, "WrappedApp#fill", "alloc_objects")).to be_between(3_000, 6_100)
  end

  it "reports bad settings by variable name and still runs, profiled with defaults" do
    script = write_script
    out, err, status = run_wrapped(RbConfig.ruby, script, env: {
                                     "MEMPROFILER_PPROF_RS_SAMPLE_RATE" => "lots",
                                     "RUBY_MEMPROFILER_PPROF_MAX_HEAP_SAMPLES" => "-5",
                                     "MEMPROFILER_PPROF_RS_FLUSH_INTERVAL" => "0",
                                     "MEMPROFILER_PPROF_RS_FLUSH_AT_EXIT" => "maybe"
                                   })
    expect(status).to be_success, err
    expect(out).to include("app ran in")
    expect(err).to include('ignoring MEMPROFILER_PPROF_RS_SAMPLE_RATE="lots": must be a number from 0 to 1; using 0.01')
    expect(err).to include('ignoring RUBY_MEMPROFILER_PPROF_MAX_HEAP_SAMPLES="-5"')
    expect(err).to include('ignoring MEMPROFILER_PPROF_RS_FLUSH_INTERVAL="0"')
    expect(err).to include('ignoring MEMPROFILER_PPROF_RS_FLUSH_AT_EXIT="maybe"')
    expect(profile_paths.size).to eq(1)
  end

  it "rejects an unknown pattern key with the key's name and falls back to the default pattern" do
    script = write_script
    _out, err, status = run_wrapped(RbConfig.ruby, script, env: {
                                      "MEMPROFILER_PPROF_RS_FILE_PATTERN" => "#{@dir}/x-%{hostname}.pprof"
                                    })
    expect(status).to be_success, err
    expect(err).to include("unknown key %{hostname}")
    expect(Dir["#{@dir}/tmp/profiles/mem-*.pprof"].size).to eq(1)
  end

  it "prefers this gem's variable over the C gem's, and can skip the exit flush" do
    script = write_script
    _out, err, status = run_wrapped(RbConfig.ruby, script, env: {
                                      "MEMPROFILER_PPROF_RS_FLUSH_AT_EXIT" => "no",
                                      "RUBY_MEMPROFILER_PPROF_FLUSH_AT_EXIT" => "yes"
                                    })
    expect(status).to be_success, err
    expect(profile_paths).to be_empty
  end

  it "runs the program unprofiled when the extension cannot be loaded" do
    copy = File.join(@dir, "copy")
    FileUtils.mkdir_p(File.join(copy, "exe"))
    FileUtils.cp(wrapper, File.join(copy, "exe"))
    FileUtils.cp_r(File.join(root, "lib"), copy)
    Dir[File.join(copy, "lib", "**", "*.so")].each { |so| File.delete(so) }
    script = write_script
    out, err, status = Open3.capture3({ "RUBYOPT" => nil, "RUBYLIB" => nil, "GEM_PATH" => @dir, "GEM_HOME" => @dir },
                                      File.join(copy, "exe", "memprofiler_pprof_rs_profile"), RbConfig.ruby, script,
                                      chdir: @dir)
    expect(status).to be_success, err
    expect(out).to include("app ran in")
    expect(err).to match(/memprofiler_pprof_rs: profiling is off for this process: LoadError/)
  end

  it "runs a single-word command directly, never through a shell" do
    spaced = File.join(@dir, "dir with space")
    FileUtils.mkdir_p(spaced)
    program = File.join(spaced, "app")
    File.write(program, "#!#{RbConfig.ruby}\nputs :ran\n")
    File.chmod(0o755, program)
    out, err, status = run_wrapped(program)
    expect(status).to be_success, err
    expect(out).to eq("ran\n")
    _out, _err, status = run_wrapped("echo $HOME;")
    expect(status.exitstatus).to eq(127)
  end

  it "falls back to the C gem's variable when this gem's is empty" do
    script = write_script
    _out, err, status = run_wrapped(RbConfig.ruby, script, env: {
                                      "MEMPROFILER_PPROF_RS_SAMPLE_RATE" => "",
                                      "RUBY_MEMPROFILER_PPROF_SAMPLE_RATE" => "1",
                                      "MEMPROFILER_PPROF_RS_FLUSH_INTERVAL" => "0.01"
                                    })
    expect(status).to be_success, err
    expect(err).to include('ignoring MEMPROFILER_PPROF_RS_FLUSH_INTERVAL="0.01": must be a number of seconds >= 0.1')
    expect(parse_profile(File.binread(profile_paths.last)).period).to eq(1)
  end

  it "sends the profiles to Pyroscope when PYROSCOPE_SERVER_ADDRESS is set, and writes no files" do
    server = FakePyroscope.new
    script = write_script
    _out, err, status = run_wrapped(RbConfig.ruby, script, env: {
                                      "PYROSCOPE_SERVER_ADDRESS" => server.url,
                                      "PYROSCOPE_APPLICATION_NAME" => "wrapped",
                                      "PYROSCOPE_TAGS" => "env=test,team=core",
                                      "MEMPROFILER_PPROF_RS_FILE_PATTERN" => nil,
                                      "MEMPROFILER_PPROF_RS_SAMPLE_RATE" => "1"
                                    })
    expect(status).to be_success, err
    requests = server.all_requests
    expect(requests.map(&:status)).to eq([200]) # the exit flush
    expect(requests.first.labels).to eq([%w[__name__ memory], %w[service_name wrapped], %w[__delta__ false],
                                         %w[env test], %w[team core]])
    profile = requests.first.profiles.first
    expect(total_through(profile, "WrappedApp#fill", "inuse_objects")).to be >= 3_000
    expect(Dir["#{@dir}/**/*.pprof"]).to be_empty
  ensure
    server&.stop
  end

  it "also writes files when a file pattern is set together with Pyroscope" do
    server = FakePyroscope.new
    script = write_script
    _out, err, status = run_wrapped(RbConfig.ruby, script, env: { "PYROSCOPE_SERVER_ADDRESS" => server.url })
    expect(status).to be_success, err
    expect(server.all_requests.map(&:status)).to eq([200])
    expect(profile_paths.size).to eq(1)
    expect(total_through(parse_profile(File.binread(profile_paths.first)), "WrappedApp#fill", "alloc_objects"))
      .to be_positive
  ensure
    server&.stop
  end

  it "reports an unusable Pyroscope setting by name and still runs" do
    script = write_script
    out, err, status = run_wrapped(RbConfig.ruby, script, env: {
                                     "PYROSCOPE_SERVER_ADDRESS" => "http://127.0.0.1:9",
                                     "PYROSCOPE_TAGS" => "not-a-pair"
                                   })
    expect(status).to be_success, err
    expect(out).to include("app ran in")
    expect(err).to include('not sending profiles to Pyroscope: PYROSCOPE_TAGS entry "not-a-pair" is not key=value')
  end

  it "never prints a Pyroscope password, whatever characters it holds" do
    script = write_script
    ["/", "#", "?", "@", "%"].each do |char|
      out, err, status = run_wrapped(RbConfig.ruby, script, env: {
                                       "PYROSCOPE_SERVER_ADDRESS" => "ftp://123456:ab#{char}SECRET@host"
                                     })
      expect(status).to be_success, err
      expect(out).to include("app ran in")
      expect(err).to include("not sending profiles to Pyroscope: server_address must be an http(s) URL")
      expect(err).not_to include("SECRET", "123456")
    end
  end

  it "sends with a password holding '#' taken from the address, and prints nothing" do
    server = FakePyroscope.new
    address = server.url.sub("http://", "http://123456:ab#SECRET@")
    _out, err, status = run_wrapped(RbConfig.ruby, write_script, env: {
                                      "PYROSCOPE_SERVER_ADDRESS" => address,
                                      "MEMPROFILER_PPROF_RS_FILE_PATTERN" => nil
                                    })
    expect(status).to be_success, err
    expect(err).to eq("")
    requests = server.all_requests
    expect(requests.map(&:status)).to eq([200])
    expect(requests.first.headers["authorization"]).to eq("Basic #{['123456:ab#SECRET'].pack('m0')}")
  ensure
    server&.stop
  end

  it "explains its usage, and fails like a shell for a missing command" do
    _out, err, status = Open3.capture3(wrapper)
    expect(status.exitstatus).to eq(2)
    expect(err).to include("usage: memprofiler_pprof_rs_profile COMMAND")
    out, _err, status = Open3.capture3(wrapper, "--help")
    expect(status).to be_success
    expect(out).to include("MEMPROFILER_PPROF_RS_SAMPLE_RATE")
    _out, err, status = Open3.capture3(wrapper, "no-such-command-here")
    expect(status.exitstatus).to eq(127)
    expect(err).to include("no-such-command-here: command not found")
  end
end
