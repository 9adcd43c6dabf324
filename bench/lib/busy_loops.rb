# frozen_string_literal: true

require "rbconfig"

# Busy loops beside a measurement (a loaded machine), one Ruby process each,
# killed when the benchmark's process exits, however it ends.
module BusyLoops
  module_function

  def start(count)
    pids = []
    at_exit do
      pids.each do |pid|
        Process.kill(:KILL, pid)
        Process.wait(pid)
      rescue Errno::ESRCH, Errno::ECHILD
        nil
      end
    end
    count.times { pids << Process.spawn(RbConfig.ruby, "-e", "loop {}") }
    pids
  end
end
