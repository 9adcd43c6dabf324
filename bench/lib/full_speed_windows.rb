# frozen_string_literal: true

# What the defaults' windows choose for a Rails app of bench/lib at full
# speed (no valgrind): the share of allocations they hook (q) and the rate
# they sample at inside them. Under callgrind the program runs ~50 times
# slower and a budget, which follows the clock, would hook everything;
# with these two, `window_probability: q` and `sample_rate: rate x q`
# make the same windows by allocation counts (bench/run callgrind
# --at-full-speed).
#
#   ruby -Ilib bench/lib/full_speed_windows.rb rails|rails-ar [SECONDS]
#
# Prints one line of JSON. The rate inside windows is the samples taken
# over the allocations the windows hooked, flush by flush (a profile a
# second, as bench/run's servers write: short enough that the allocation
# list's cap of 10,000 thins none of them).

require "json"
require "memprofiler_pprof_rs"
require_relative "in_process_app"

target, seconds = ARGV
abort "full_speed_windows.rb: unknown app #{target.inspect} (rails or rails-ar)" unless InProcessApp::TARGETS.include?(target)
seconds = Float(seconds || 8, exception: false)
abort "full_speed_windows.rb: SECONDS must be a positive number, got #{ARGV[1].inspect}" unless seconds&.positive?
request = InProcessApp.request_for(target)
3.times { request.call }

collector = MemprofilerPprof::Collector.new(window_warm_up: 0)
if collector.mode != :light || (collector.window_budget.nil? && collector.window_probability >= 1.0)
  abort "full_speed_windows.rb: the defaults use no sampling windows here (mode #{collector.mode.inspect})"
end
collector.start!
# Past the second of budget each start grants (bench/request_cost.rb
# leaves out 1.25 s for it; this a little more).
InProcessApp.run_for(request, 1.5)
collector.flush
requests = allocated = samples = hooked = 0
seconds.ceil.times do
  before = GC.stat(:total_allocated_objects)
  requests += InProcessApp.run_for(request, seconds / seconds.ceil)
  made = GC.stat(:total_allocated_objects) - before
  data = collector.flush
  abort "full_speed_windows.rb: a flush dropped samples (#{data})" if data.dropped_samples_count.positive?
  allocated += made
  samples += data.allocation_samples_count
  hooked += data.window_coverage * made
end
collector.stop!
abort "full_speed_windows.rb: the windows hooked nothing in #{seconds} s" unless hooked.positive?
puts JSON.generate({ target: target, requests: requests, allocated: allocated, q: hooked / allocated,
                     in_window_rate: samples / hooked, samples: samples })
