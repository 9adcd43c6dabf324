# frozen_string_literal: true

require "rails/railtie"
require_relative "../memprofiler_pprof_rs"

module MemprofilerPprof
  # Rails: profiling and labels from the app's config.
  #
  #   # config/application.rb (or an environment's file)
  #   config.memprofiler_pprof.enabled = true
  #   config.memprofiler_pprof.sample_rate = 0.01       # any of EnvConfig::SETTINGS
  #   config.memprofiler_pprof.flush_interval = 60
  #
  # or MEMPROFILER_PPROF_RS_ENABLED=1 and the wrapper's variables. Enabled,
  # it starts a collector and a flusher as the wrapper does (files, or
  # Pyroscope with PYROSCOPE_SERVER_ADDRESS; settings from the config first,
  # then the environment), unless the wrapper already did; and labels each
  # request (RackLabels: `endpoint`), each controller action (`action`:
  # "UsersController#show"), each Active Job and, when Sidekiq is loaded,
  # each Sidekiq job (SidekiqLabels: `job`, `queue`), so
  # `top --by action` names what is alive. `labels = false` keeps the
  # labels off; labels alone (`enabled = false, labels = true`) suit an app
  # profiled by the wrapper or its own collector.
  #
  # Which processes: those that serve. A server (puma, unicorn, Passenger,
  # `rails server`), a job worker (Sidekiq, `rake jobs:work` and the like:
  # WORKER_TASKS) and any other process profile; `rails console`,
  # `rails runner`, generators, other `bin/rails` commands and other rake
  # tasks (`db:migrate`, `assets:precompile`) do not (one line on $stderr
  # says so), unless `config.memprofiler_pprof.processes = :all` (or
  # MEMPROFILER_PPROF_RS_PROCESSES=all).
  #
  # No thread before fork: in a server that forks its workers after the
  # app boots (`rails server`, puma with workers, unicorn, Passenger) the
  # flusher's thread starts with the process's first request, or right
  # after a fork in the child; so a preforking master forks with no Ruby
  # thread of the gem's (puma's "Thread(s) started in app boot" warning
  # names none) and writes no profiles of its own, while each worker
  # profiles from the fork on.
  #
  # Loaded by `require "memprofiler_pprof_rs"` when Rails is loaded first
  # (as Bundler.require does after `require "rails"`), or required as
  # "memprofiler_pprof_rs/railtie".
  class Railtie < ::Rails::Railtie
    config.memprofiler_pprof = ActiveSupport::OrderedOptions.new

    # After config/initializers/*.rb, which may set these too.
    initializer "memprofiler_pprof_rs.settings", after: :load_config_initializers,
                                                 before: :build_middleware_stack do |app|
      settings = app.config.memprofiler_pprof
      settings.enabled = Railtie.flag(settings, :enabled) { ENV.fetch("MEMPROFILER_PPROF_RS_ENABLED", nil) }
      settings.labels = Railtie.flag(settings, :labels) { settings.enabled }
      app.middleware.insert(0, RackLabels) if settings.labels
      app.middleware.insert(0, FirstRequest) if settings.enabled
    end

    initializer "memprofiler_pprof_rs.labels", after: "memprofiler_pprof_rs.settings" do |app|
      next unless app.config.memprofiler_pprof.labels

      ActiveSupport.on_load(:action_controller) do
        around_action { |controller, action| Railtie.label_action(controller, &action) }
      end
      ActiveSupport.on_load(:active_job) do
        around_perform { |job, perform| Railtie.label_job(job, &perform) }
      end
      if defined?(::Sidekiq) && ::Sidekiq.respond_to?(:configure_server)
        ::Sidekiq.configure_server do |sidekiq|
          sidekiq.server_middleware { |chain| chain.add(SidekiqLabels) }
        end
      end
    end

    config.after_initialize do |app|
      Railtie.start(app.config.memprofiler_pprof) if app.config.memprofiler_pprof.enabled
    end

    # The commands that do not serve, which Rails runs after
    # after_initialize: a backstop to `Railtie.not_serving`.
    console { Railtie.not_serving!("rails console") }
    runner { Railtie.not_serving!("rails runner") }
    generators { Railtie.not_serving!("a generator") }

    # Starts the flusher with the process's first request (see above).
    class FirstRequest
      def initialize(app)
        @app = app
      end

      def call(env)
        EnvProfiler.serving! unless EnvProfiler.serving? # (never raises)
        @app.call(env)
      end
    end

    # Commands loaded before the app boots, which say the process will not
    # serve. (Any other `bin/rails` command but the server, too: see
    # `not_serving`.)
    NOT_SERVING = {
      "Rails::Console" => "rails console",
      "Rails::Command::ConsoleCommand" => "rails console",
      "Rails::Command::RunnerCommand" => "rails runner",
      "Rails::Command::GenerateCommand" => "a generator",
      "Rails::Command::DestroyCommand" => "a generator",
      "Rails::DBConsole" => "rails dbconsole",
      "Rails::Command::DbconsoleCommand" => "rails dbconsole"
    }.freeze

    # Rake tasks that run a job worker: they serve.
    WORKER_TASKS = %w[jobs:work jobs:workoff resque:work resque:workers solid_queue:start sneakers:run
                      qu:work que:work backburner:work].freeze

    # Servers that fork their workers, where the flusher waits for the
    # first request or the fork: `rails server` (requests go through the
    # app), unicorn, Passenger, pitchfork; puma when it runs workers.
    FORKING_SERVER_PROGRAMS = /\A(?:unicorn|unicorn_rails|pitchfork|passenger)\z/

    class << self
      def label_action(controller, &action)
        Labels.with_if_valid({ action: "#{controller.class.name}##{controller.action_name}" }, &action)
      end

      def label_job(job, &perform)
        Labels.with_if_valid({ job: job.class.name, queue: job.queue_name }, &perform)
      end

      # true or false from a setting given as a flag, or as the wrapper's
      # variables spell one ("1", "true", "yes", "on"; nil: the default);
      # anything else is reported and reads false: a setting never stops
      # the app from booting.
      def flag(settings, name)
        value = settings.key?(name) ? settings[name] : yield
        case value
        when true, false then value
        when nil then false
        else
          text = value.to_s.strip.downcase
          return true if %w[1 true yes on].include?(text)
          return false if %w[0 false no off].include?(text)

          EnvProfiler.report("config.memprofiler_pprof.#{name} must be true or false, got #{Validation.show(value)}: " \
                             "taken as false")
          false
        end
      end

      # :servers (default) or :all, from the config or
      # MEMPROFILER_PPROF_RS_PROCESSES; anything else is reported and reads
      # :servers.
      def processes(settings)
        value = settings.key?(:processes) ? settings[:processes] : ENV.fetch("MEMPROFILER_PPROF_RS_PROCESSES", nil)
        return :servers if value.nil? || value.to_s.strip.empty?

        choice = value.to_s.strip.downcase.to_sym
        return choice if %i[servers all].include?(choice)

        EnvProfiler.report("config.memprofiler_pprof.processes must be :servers or :all, got " \
                           "#{Validation.show(value)}: taken as :servers")
        :servers
      end

      def profile_this_process?(settings)
        @processes = processes(settings)
        return true if @processes == :all

        what = not_serving
        EnvProfiler.report("not profiling #{what} (config.memprofiler_pprof.processes = :all profiles every process)") if what
        what.nil?
      end

      # What this process is, if it does not serve; nil for a server, a
      # worker, or anything else.
      def not_serving
        return @not_serving if @not_serving

        tasks = defined?(::Rake.application) ? ::Rake.application.top_level_tasks : []
        unless tasks.empty?
          return (tasks & WORKER_TASKS).empty? ? "rake #{tasks.join(' ')}" : nil
        end

        NOT_SERVING.find { |name, _| loaded?(name) }&.last ||
          (loaded?("Rails::Command::Base") && !loaded?("Rails::Command::ServerCommand") ? "a rails command" : nil)
      end

      # Called when Rails runs a command's blocks: a profiler this Railtie
      # started in such a process stops (unless processes is :all).
      def not_serving!(what)
        @not_serving ||= what
        return unless @started && @processes != :all

        EnvProfiler.stop
        EnvProfiler.report("not profiling #{what} (config.memprofiler_pprof.processes = :all profiles every process)")
      end

      # A server that forks its workers after the app boots: the flusher
      # then waits for a request or the fork (the master never holds its
      # thread). Other processes, puma in single mode included, start it at
      # once: their requests may not all go through the Rails app.
      def forking_server?
        return true if loaded?("Rails::Server") || loaded?("PhusionPassenger")
        return true if File.basename($PROGRAM_NAME.to_s).match?(FORKING_SERVER_PROGRAMS)

        puma_workers.positive?
      end

      # puma's configured workers (0 in single mode, or when puma's CLI did
      # not start this process).
      def puma_workers
        return 0 unless defined?(::Puma) && ::Puma.respond_to?(:cli_config) && ::Puma.cli_config

        ::Puma.cli_config.options[:workers].to_i
      rescue StandardError
        0
      end

      # A constant defined and loaded (an autoload not yet triggered, as
      # `require "puma"` leaves Puma::Launcher, is not loaded).
      def loaded?(path)
        path.split("::").reduce(Object) do |scope, name|
          return false unless scope.const_defined?(name, false) && scope.autoload?(name).nil?

          scope.const_get(name, false)
        end
        true
      end

      # A setting as its variable would read (a file mode as octal digits).
      def variable(name, value)
        name.to_sym == :file_mode && value.is_a?(Integer) ? value.to_s(8) : value.to_s
      end

      # Starts the collector and flusher the wrapper would, with the config's
      # settings in place of the variables they name. Problems are reported
      # and the app boots unprofiled.
      def start(settings)
        return unless profile_this_process?(settings)

        overrides = settings.to_h.except(:enabled, :labels, :processes)
        unknown = overrides.keys - EnvConfig::SETTINGS.keys
        unless unknown.empty?
          raise ArgumentError, "config.memprofiler_pprof.#{unknown.first} is not a setting " \
                               "(settings: #{EnvConfig::SETTINGS.keys.join(', ')})"
        end

        env = ENV.to_h.merge(overrides.to_h { |name, value| ["MEMPROFILER_PPROF_RS_#{name.upcase}", variable(name, value)] })
        @started = EnvProfiler.start(env, flusher: forking_server? ? :when_serving : :now)
      rescue StandardError => e
        EnvProfiler.report("profiling is off for this process: #{e.class}: #{e.message}")
      end
    end
  end
end
