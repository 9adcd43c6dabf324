# frozen_string_literal: true

module MemprofilerPprof
  # Where the gem's background parts (flushers, the uploader, the Rack
  # endpoint) report what went wrong: the user's logger (#error), or $stderr
  # through Kernel#warn without one. A broken logger is ignored: reporting
  # an error must never raise into the thread or request that had it.
  module ErrorLog
    module_function

    # "memprofiler_pprof_rs SOURCE: MESSAGE" to `logger` or $stderr.
    def write(logger, source, message)
      text = "memprofiler_pprof_rs #{source}: #{message}"
      logger ? logger.error(text) : warn(text)
      nil
    rescue StandardError
      nil
    end
  end
end
