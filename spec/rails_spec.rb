# frozen_string_literal: true

require "net/http"
require "tmpdir"

# The Railtie in a real Rails app (spec/apps/rails_app, Debian's Rails,
# served by WEBrick in its own process): profiles written every second by
# the flusher it starts name the leaking action, endpoint and job by label.
# Debian builds Rails for its suite's default Ruby only, so the Debian
# roots of script/test-debian skip this (MEMPROFILER_SKIP_FRAMEWORKS=1).
RSpec.describe "MemprofilerPprof::Railtie in a Rails app" do
  before do
    skip "Rails is not installed in this root (MEMPROFILER_SKIP_FRAMEWORKS=1)" if ENV["MEMPROFILER_SKIP_FRAMEWORKS"]
  end

  def by_label(profile, key, type)
    profile.samples.each_with_object(Hash.new(0)) do |s, sums|
      sums[s.labels.find { |l| l.key == key }&.str] += s.value(profile, type)
    end
  end

  it "names the leaking action, endpoint and job in inuse_space after 3 flushes" do
    Dir.mktmpdir("rails-app") do |dir|
      env = {
        "MEMPROFILER_PPROF_RS_FILE_PATTERN" => File.join(dir, "heap-%{index}.pprof"),
        "MEMPROFILER_PPROF_RS_SAMPLE_RATE" => "0.2",
        "MEMPROFILER_PPROF_RS_SEED" => "11"
      }
      log = File.join(dir, "server.log")
      config = File.expand_path("apps/rails_app/config.ru", __dir__)
      pid = Process.spawn(env, RbConfig.ruby, File.expand_path("fixtures/serve_rack.rb", __dir__), config,
                          chdir: dir, out: log, err: [:child, :out])
      begin
        deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 60
        until (port = File.read(log)[%r{Listening on http://127\.0\.0\.1:(\d+)}, 1])
          raise "the app did not start:\n#{File.read(log)}" if Process.waitpid(pid, Process::WNOHANG)
          raise "the app did not start in 60 s:\n#{File.read(log)}" if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline

          sleep 0.1
        end
        Net::HTTP.start("127.0.0.1", port) do |http|
          3.times do |round|
            40.times do |i|
              id = (round * 40) + i
              %W[/orders/#{id} /pages/#{id}].each { |path| expect(http.get(path).code).to eq("200") }
              expect(http.get("/import/#{id}").code).to eq("200") if i.even?
            end
            sleep 1.2 # a flush between rounds
          end
        end
        files = Dir[File.join(dir, "heap-*.pprof")].sort_by { |f| f[/(\d+)\.pprof\z/, 1].to_i }
        expect(files.size).to be >= 3
        profile = parse_profile(File.binread(files.last))
        actions = by_label(profile, "action", "inuse_space")
        expect(actions["OrdersController#show"]).to be > 100_000
        # The pages' garbage counts until a GC frees it (in-use is as of the
        # flush), so it is not 0; it does not grow, though (the diff below).
        expect(actions["OrdersController#show"]).to be > 2 * actions.fetch("PagesController#show", 0)
        expect(by_label(profile, "endpoint", "inuse_space")["GET /orders/:id"]).to be >= actions["OrdersController#show"]
        expect(by_label(profile, "job", "inuse_space")["ImportJob"]).to be > 20_000
        expect(by_label(profile, "queue", "inuse_space")["imports"]).to eq(by_label(profile, "job", "inuse_space")["ImportJob"])

        exe = File.expand_path("../exe/memprofiler_pprof_rs", __dir__)
        lib = File.expand_path("../lib", __dir__)
        out, err, status = Open3.capture3(RbConfig.ruby, "-I", lib, exe, "diff", *files, "--by", "action")
        expect(status).to be_success, err
        expect(out).to match(/^By action: OrdersController#show grew most, \+/), out
      ensure
        Process.kill("TERM", pid)
        Process.wait(pid)
      end
    end
  end

  it "boots unprofiled, saying why, when a setting is unknown" do
    out, err, status = run_ruby(<<~RUBY)
      require "rails"
      require "action_controller/railtie"
      require "memprofiler_pprof_rs"
      class BadSettingApp < Rails::Application
        config.eager_load = false
        config.logger = Logger.new(nil)
        config.secret_key_base = "spec" * 16
        config.memprofiler_pprof.enabled = true
        config.memprofiler_pprof.sample_rat = 0.5
      end
      BadSettingApp.initialize!
      p [MemprofilerPprof::EnvProfiler.collector, BadSettingApp.middleware.include?(MemprofilerPprof::RackLabels)]
    RUBY
    expect(status).to be_success, err
    expect(err).to include("memprofiler_pprof_rs: profiling is off for this process: ArgumentError: " \
                           "config.memprofiler_pprof.sample_rat is not a setting")
    expect(out).to eq("[nil, true]\n")
  end

  it "loads nothing of Rails' unless the app uses Rails" do
    out, err, status = run_ruby('require "memprofiler_pprof_rs"; p [defined?(Rails), defined?(MemprofilerPprof::Railtie)]')
    expect(status).to be_success, err
    expect(out).to eq("[nil, nil]\n")
  end
end
