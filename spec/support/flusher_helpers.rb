# frozen_string_literal: true

# A stand-in collector: records each flush's time and keywords, and can be
# told to be slow or to fail.
class FakeCollector
  attr_reader :flush_times, :flush_options
  attr_accessor :delay, :failure

  def initialize(delay: 0, failure: nil)
    @delay = delay
    @failure = failure
    @flush_times = Queue.new
    @flush_options = []
  end

  def flush(**options)
    @flush_times << Process.clock_gettime(Process::CLOCK_MONOTONIC)
    @flush_options << options
    sleep(delay) if delay.positive?
    raise failure if failure

    MemprofilerPprof::ProfileData.new(pprof_data: "fake".b)
  end
end

# Collects what a flusher logs.
class ListLogger
  attr_reader :errors

  def initialize
    @errors = Queue.new
  end

  def error(message)
    @errors << message
  end
end

module FlusherSpecHelpers
  # Polls until the block is true, for at most `timeout` seconds.
  def eventually(timeout: 5)
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + timeout
    until yield
      raise "condition not met within #{timeout}s" if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline

      sleep 0.01
    end
  end

  def elapsed
    started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    yield
    Process.clock_gettime(Process::CLOCK_MONOTONIC) - started
  end
end
