# frozen_string_literal: true

require "net/http"
require "tmpdir"

# The Railtie in a real Rails app (spec/apps/rails_app, Debian's Rails,
# served by WEBrick in its own process): profiles written every second by
# the flusher it starts name the leaking action, endpoint and job by label.
# Debian builds Rails for its suite's default Ruby only, so the Debian
# roots of script/test-debian skip this (MEMPROFILER_SKIP_FRAMEWORKS=1).
RSpec.describe "MemprofilerPprof::Railtie in a Rails app", :slow do
  before do
    skip "Rails is not installed in this root (MEMPROFILER_SKIP_FRAMEWORKS=1)" if ENV["MEMPROFILER_SKIP_FRAMEWORKS"]
  end

  it "names the leaking action, endpoint and job in inuse_space after 3 flushes" do
    Dir.mktmpdir("rails-app") do |dir|
      env = {
        "MEMPROFILER_PPROF_RS_FILE_PATTERN" => File.join(dir, "heap-%{index}.pprof"),
        "MEMPROFILER_PPROF_RS_SAMPLE_RATE" => "0.2",
        "MEMPROFILER_PPROF_RS_SEED" => "11"
      }
      config = File.join(SPEC_ROOT, "apps/rails_app/config.ru")
      serve_rackup(config, dir: dir, env: env, timeout: 60) do |port|
        Net::HTTP.start("127.0.0.1", port) do |http|
          3.times do |round|
            40.times do |i|
              id = (round * 40) + i
              %W[/orders/#{id} /pages/#{id}].each { |path| expect(http.get(path).code).to eq("200") }
              expect(http.get("/import/#{id}").code).to eq("200") if i.even?
            end
            sleep 1.2 # a flush between rounds
          end
          expect(http.get("/gc").code).to eq("200")
          sleep 1.2 # a flush after it
        end
        files = Dir[File.join(dir, "heap-*.pprof")].sort_by { |f| f[/(\d+)\.pprof\z/, 1].to_i }
        expect(files.size).to be >= 3
        profile = parse_profile(File.binread(files.last))
        actions = sums_by_label(profile, "action", "inuse_space")
        expect(actions["OrdersController#show"]).to be > 100_000
        # (The pages' garbage would count until a GC frees it: in-use is as
        # of the flush. /gc collected it.)
        expect(actions["OrdersController#show"]).to be > 10 * actions.fetch("PagesController#show", 0)
        expect(sums_by_label(profile, "endpoint", "inuse_space")["GET /orders/:id"]).to be >= actions["OrdersController#show"]
        jobs = sums_by_label(profile, "job", "inuse_space")
        expect(jobs["ImportJob"]).to be > 20_000
        expect(sums_by_label(profile, "queue", "inuse_space")["imports"]).to eq(jobs["ImportJob"])

        exe = File.join(PROJECT_ROOT, "exe/memprofiler_pprof_rs")
        lib = File.join(PROJECT_ROOT, "lib")
        out, err, status = Open3.capture3(RbConfig.ruby, "-I", lib, exe, "diff", *files, "--by", "action")
        expect(status).to be_success, err
        expect(out).to match(/^By action: OrdersController#show grew most, \+/), out

        # What holds the leaks, from the running server.
        report = Net::HTTP.get(URI("http://127.0.0.1:#{port}/debug/pprof/retainers?token=rails-spec-token-0123&top=4"))
        expect(report).to match(/^   String: OrdersController::CACHE \(constant\) -> Array\[\d+\] -> Array\[\d+\] -> String$/)
        expect(report).to match(/^   String: ImportJob::KEPT \(constant\) -> Array\[\d+\] -> Array\[\d+\] -> String$/)
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

  # A Rails app's directory with config/application.rb (and an initializer
  # file): what the wrapper, an initializer and a full label set do.
  def rails_app_dir(dir, initializer: nil, config: "")
    FileUtils.mkdir_p(File.join(dir, "config", "initializers"))
    File.write(File.join(dir, "config", "initializers", "memprofiler.rb"), initializer.to_s)
    File.write(File.join(dir, "config", "application.rb"), <<~RUBY)
      require "rails"
      require "action_controller/railtie"
      require "logger"
      require "memprofiler_pprof_rs"
      class SpecApp < Rails::Application
        config.root = File.expand_path("..", __dir__)
        config.eager_load = false
        config.logger = Logger.new(nil)
        config.secret_key_base = "spec" * 16
        config.hosts.clear
        config.memprofiler_pprof.file_pattern = File.join(config.root, "heap-%{index}.pprof")
        config.memprofiler_pprof.flush_at_exit = false
        #{config}
        routes.append { get "/labels" => "labels#show" }
      end
      class LabelsController < ActionController::Base
        def show = render(plain: MemprofilerPprof.labels.keys.sort.join(","))
      end
      SpecApp.initialize!
      status, _, body = Rack::MockRequest.new(SpecApp).get("/labels").then { |r| [r.status, nil, r.body] }
      puts [MemprofilerPprof::EnvProfiler.collector.class, SpecApp.middleware.include?(MemprofilerPprof::RackLabels),
            status, body].inspect
    RUBY
  end

  it "is loaded under the wrapper, read after config/initializers, and never stops a boot or a request" do
    Dir.mktmpdir("rails-settings") do |dir|
      wrapper = File.join(PROJECT_ROOT, "exe/memprofiler_pprof_rs_profile")
      lib = File.join(PROJECT_ROOT, "lib")
      run = lambda do |*command|
        out, err, status = Open3.capture3({ "RUBYLIB" => lib }, *command, chdir: dir)
        expect(status).to be_success, err
        [out.lines.last, err]
      end
      # The wrapper loads the gem before Rails: its config must still exist.
      rails_app_dir(dir, config: "config.memprofiler_pprof.labels = true")
      out, = run.call(RbConfig.ruby, wrapper, "ruby", "config/application.rb")
      expect(out).to eq(%([MemprofilerPprof::Collector, true, 200, "action,endpoint"]\n))
      # Enabled in an initializer file, which Rails runs after config/application.rb.
      rails_app_dir(dir, initializer: "Rails.application.config.memprofiler_pprof.enabled = true")
      out, = run.call(RbConfig.ruby, "config/application.rb")
      expect(out).to eq(%([MemprofilerPprof::Collector, true, 200, "action,endpoint"]\n))
      # A value that is no flag: reported, and the app boots unprofiled.
      rails_app_dir(dir, config: 'config.memprofiler_pprof.enabled = "sure"')
      out, err = run.call(RbConfig.ruby, "config/application.rb")
      expect(out).to eq(%([NilClass, false, 200, ""]\n))
      expect(err).to include('config.memprofiler_pprof.enabled must be true or false, got "sure": taken as false')
      # Eight labels current already: the action's ninth is left out, not raised.
      seven_labels = <<~'RUBY'
        config.memprofiler_pprof.labels = true
        config.middleware.use(Class.new do
          def initialize(app) = @app = app
          def call(env) = MemprofilerPprof.with_labels((1..7).to_h { |i| [:"k#{i}", i] }) { @app.call(env) }
        end)
      RUBY
      rails_app_dir(dir, config: seven_labels)
      out, = run.call(RbConfig.ruby, "config/application.rb")
      expect(out).to eq(%([NilClass, true, 200, "endpoint,k1,k2,k3,k4,k5,k6,k7"]\n))
    end
  end

  # A Rails app's directory as `rails new` lays it out (bin/rails,
  # config/environment.rb, Rakefile), for the commands that do not serve.
  def rails_commands_dir(dir)
    FileUtils.mkdir_p([File.join(dir, "bin"), File.join(dir, "config")])
    File.write(File.join(dir, "config", "application.rb"), <<~RUBY)
      $LOAD_PATH.unshift(#{File.join(PROJECT_ROOT, 'lib').inspect})
      require "rails"
      require "action_controller/railtie"
      require "logger"
      require "memprofiler_pprof_rs"
      class CommandsApp < Rails::Application
        config.root = File.expand_path("..", __dir__)
        config.eager_load = false
        config.logger = Logger.new(nil)
        config.secret_key_base = "spec" * 16
        config.hosts.clear
        config.memprofiler_pprof.enabled = true
        config.memprofiler_pprof.file_pattern = File.join(config.root, "heap-%{pid}-%{index}.pprof")
        config.memprofiler_pprof.flush_at_exit = false
        routes.append { get "/ok" => proc { [200, {}, ["ok"]] } }
      end
    RUBY
    File.write(File.join(dir, "config", "environment.rb"),
               %(require_relative "application"\nRails.application.initialize!\n))
    File.write(File.join(dir, "bin", "rails"), <<~RUBY)
      APP_PATH = File.expand_path("../config/application", __dir__)
      require "rails/commands"
    RUBY
    File.write(File.join(dir, "Rakefile"), <<~RUBY)
      require_relative "config/application"
      Rails.application.load_tasks
      task(probe: :environment) { print MemprofilerPprof::EnvProfiler.collector.class }
      # A job worker's task (Delayed Job's name): it serves.
      namespace(:jobs) { task(work: :environment) { print MemprofilerPprof::EnvProfiler.collector.class } }
    RUBY
  end

  it "profiles servers and workers, not rails runner, rails console or rake tasks, unless processes is :all" do
    Dir.mktmpdir("rails-commands") do |dir|
      rails_commands_dir(dir)
      run = lambda do |*command, env: {}, stdin: ""|
        out, err, status = Open3.capture3(env, RbConfig.ruby, *command, chdir: dir, stdin_data: stdin)
        expect(status).to be_success, err
        [out, err]
      end
      probe = "print MemprofilerPprof::EnvProfiler.collector.class"
      hint = "(config.memprofiler_pprof.processes = :all profiles every process)"
      expect(run.call("bin/rails", "runner", probe))
        .to eq(["NilClass", "memprofiler_pprof_rs: not profiling rails runner #{hint}\n"])
      expect(run.call("-S", "rake", "probe")).to eq(["NilClass", "memprofiler_pprof_rs: not profiling rake probe #{hint}\n"])
      expect(run.call("-S", "rake", "jobs:work")).to eq(["MemprofilerPprof::Collector", ""])
      console_input = "puts \"probe=\#{MemprofilerPprof::EnvProfiler.collector.inspect}\"\n"
      console, err = run.call("bin/rails", "console", stdin: console_input)
      expect(console).to include("probe=nil")
      expect(err).to include("not profiling rails console")
      _, err = run.call("bin/rails", "routes")
      expect(err).to include("not profiling a rails command")
      all = { "MEMPROFILER_PPROF_RS_PROCESSES" => "all" }
      expect(run.call("bin/rails", "runner", probe, env: all)).to eq(["MemprofilerPprof::Collector", ""])
      expect(run.call("-S", "rake", "probe", env: all)).to eq(["MemprofilerPprof::Collector", ""])
      # A process that is none of these (a job worker, a script) profiles,
      # its flusher running at once.
      script = <<~RUBY
        require "./config/environment"
        print [MemprofilerPprof::EnvProfiler.collector.class, MemprofilerPprof::EnvProfiler.serving?].inspect
      RUBY
      expect(run.call("-e", script)).to eq(["[MemprofilerPprof::Collector, true]", ""])
      out, err = run.call("-e", script, env: { "MEMPROFILER_PPROF_RS_PROCESSES" => "some" })
      expect(out).to eq("[MemprofilerPprof::Collector, true]")
      expect(err).to include('config.memprofiler_pprof.processes must be :servers or :all, got "some"')
    end
  end

  it "starts a forking server's flusher thread with its first request, or in a forked child, never before" do
    Dir.mktmpdir("rails-server") do |dir|
      rails_commands_dir(dir)
      script = <<~RUBY
        $PROGRAM_NAME = "unicorn" # a server that forks its workers
        require "./config/environment"
        flusher_threads = -> { Thread.list.count { |t| t.name.to_s.include?("memprofiler_pprof_rs") } }
        before = [MemprofilerPprof::EnvProfiler.serving?, flusher_threads.call]
        reader, writer = IO.pipe
        child = fork do
          writer.puts([MemprofilerPprof::EnvProfiler.serving?, flusher_threads.call].inspect)
          exit!(0)
        end
        Process.wait(child)
        in_child = reader.gets.chomp
        after_fork = [MemprofilerPprof::EnvProfiler.serving?, flusher_threads.call]
        status = Rack::MockRequest.new(Rails.application).get("/ok").status
        print [before, in_child, after_fork, status, [MemprofilerPprof::EnvProfiler.serving?, flusher_threads.call]].inspect
      RUBY
      out, err, status = Open3.capture3(RbConfig.ruby, "-e", script, chdir: dir)
      expect(status).to be_success, err
      expect(out).to eq('[[false, 0], "[true, 1]", [false, 0], 200, [true, 1]]')
    end
  end

  it "loads nothing of Rails' unless the app uses Rails" do
    out, err, status = run_ruby('require "memprofiler_pprof_rs"; p [defined?(Rails), defined?(MemprofilerPprof::Railtie)]')
    expect(status).to be_success, err
    expect(out).to eq("[nil, nil]\n")
  end
end
