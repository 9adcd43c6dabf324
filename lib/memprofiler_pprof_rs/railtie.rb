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

      # A setting as its variable would read (a file mode as octal digits).
      def variable(name, value)
        name.to_sym == :file_mode && value.is_a?(Integer) ? value.to_s(8) : value.to_s
      end

      # Starts the collector and flusher the wrapper would, with the config's
      # settings in place of the variables they name. Problems are reported
      # and the app boots unprofiled.
      def start(settings)
        overrides = settings.to_h.except(:enabled, :labels)
        unknown = overrides.keys - EnvConfig::SETTINGS.keys
        unless unknown.empty?
          raise ArgumentError, "config.memprofiler_pprof.#{unknown.first} is not a setting " \
                               "(settings: #{EnvConfig::SETTINGS.keys.join(', ')})"
        end

        env = ENV.to_h.merge(overrides.to_h { |name, value| ["MEMPROFILER_PPROF_RS_#{name.upcase}", variable(name, value)] })
        EnvProfiler.start(env)
      rescue StandardError => e
        EnvProfiler.report("profiling is off for this process: #{e.class}: #{e.message}")
      end
    end
  end
end
