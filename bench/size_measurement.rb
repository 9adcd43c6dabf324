# frozen_string_literal: true

# How much the two ways of sizing new samples cost, as ratios against the
# same workload with no profiler, in the same process (medians of 5
# alternating runs).
#
#   ruby -Ilib bench/size_measurement.rb
#
# Workloads: a compute loop that allocates nothing (where a C_RETURN hook
# still fires on every C method return) and an allocation loop (4 small
# objects per iteration through 3 call levels).

require "memprofiler_pprof_rs"

RUNS = 5
SAMPLE_RATE = 0.01

def compute_loop(n)
  array = [1, 2, 3, 4, 5, 6, 7, 8]
  sum = 0
  n.times do |i|
    sum += array[i & 7] * 3
    sum = sum.abs % 1_000_003
  end
  sum
end

def level3(i) = ["s#{i}", { k: i }]
def level2(i) = level3(i)
def level1(i) = level2(i)

def alloc_loop(n)
  n.times { |i| level1(i) }
end

WORKLOADS = {
  "compute loop (no allocations), 3M iterations" => -> { compute_loop(3_000_000) },
  "allocation loop, 500k iterations (~2M objects)" => -> { alloc_loop(500_000) }
}.freeze

CONFIGS = {
  "no profiler" => nil,
  "size_measurement: :postponed_job (default)" => :postponed_job,
  "size_measurement: :c_return (C gem's way)" => :c_return
}.freeze

def timed
  GC.start
  t0 = Process.clock_gettime(Process::CLOCK_MONOTONIC)
  yield
  Process.clock_gettime(Process::CLOCK_MONOTONIC) - t0
end

def run(workload, mode)
  return timed(&workload) if mode.nil?

  collector = MemprofilerPprof::Collector.new(sample_rate: SAMPLE_RATE, size_measurement: mode)
  collector.start!
  seconds = timed(&workload)
  collector.flush
  collector.stop!
  seconds
end

puts "Ruby #{RUBY_VERSION}, sample_rate #{SAMPLE_RATE}, median of #{RUNS} alternating runs"
WORKLOADS.each do |name, workload|
  times = Hash.new { |h, k| h[k] = [] }
  workload.call # warm up
  RUNS.times do
    CONFIGS.each { |label, mode| times[label] << run(workload, mode) }
  end
  medians = times.transform_values { |list| list.sort[list.size / 2] }
  base = medians["no profiler"]
  puts "\n#{name}"
  medians.each do |label, seconds|
    printf("  %-45s %7.3f s   %5.2fx\n", label, seconds, seconds / base)
  end
end
