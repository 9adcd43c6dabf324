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

    initializer "memprofiler_pprof_rs.settings", before: :build_middleware_stack do |app|
      settings = app.config.memprofiler_pprof
      enabled = settings.fetch(:enabled) { %w[1 true yes on].include?(ENV["MEMPROFILER_PPROF_RS_ENABLED"].to_s.downcase) }
      settings.enabled = Validation.flag(enabled, "config.memprofiler_pprof.enabled")
      settings.labels = Validation.flag(settings.fetch(:labels, settings.enabled), "config.memprofiler_pprof.labels")
      app.middleware.insert(0, RackLabels) if settings.labels
    end

    initializer "memprofiler_pprof_rs.labels" do |app|
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
        MemprofilerPprof.with_labels(action: "#{controller.class.name}##{controller.action_name}", &action)
      end

      def label_job(job, &perform)
        MemprofilerPprof.with_labels(job: job.class.name, queue: job.queue_name, &perform)
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
