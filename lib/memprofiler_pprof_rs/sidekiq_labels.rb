# frozen_string_literal: true

module MemprofilerPprof
  # Sidekiq server middleware that labels each job's samples with its class
  # and queue (see Labels), so the profiles say which job allocated what and
  # whose objects are still alive:
  #
  #   Sidekiq.configure_server do |config|
  #     config.server_middleware { |chain| chain.add MemprofilerPprof::SidekiqLabels }
  #   end
  #
  # (The Railtie adds it when Sidekiq is loaded.) `job` is the job's class,
  # or for an Active Job the class it wraps; `queue` the queue. Both come
  # from the app's code and configuration, so they are bounded.
  class SidekiqLabels
    def call(_worker, job, queue, &block)
      name = job.is_a?(Hash) ? (job["wrapped"] || job["class"]).to_s : ""
      Labels.with_if_valid({ job: name.empty? ? nil : name, queue: queue.to_s }, &block)
    end
  end
end
