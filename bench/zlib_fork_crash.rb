# frozen_string_literal: true

# Reproduces, WITHOUT this gem, the crash that bench/torture.rb's own profile
# checks hit in forked children on Ruby 3.1: Ruby's zlib (2.1.1, bundled with
# 3.1) resizes its output String (rb_str_modify_expand, rb_str_set_len)
# while it has released the GVL. A fork from another thread at that moment
# gives the child a String whose pointer is the buffer realloc() just freed;
# when the child's GC frees that String, glibc aborts with "double free or
# corruption", or a later GC trips over the damage.
#
#   ruby bench/zlib_fork_crash.rb [seconds]   # default 300
#
# Prints how many forked children crashed. Nothing here loads
# memprofiler_pprof_rs; the gem no longer uses Ruby's zlib anywhere
# (PprofReader gunzips in Rust, with the GVL held).

require "zlib"
require "securerandom"

seconds = Float(ARGV[0] || 300)
# Compressible but not trivially: many output-buffer expansions per inflate.
payload = Array.new(4_000) { |i| "sample #{i} #{SecureRandom.hex(4)} " * 4 }.join
gz = Zlib.gzip(payload)
stop = false

inflaters = Array.new(3) do
  Thread.new do
    Zlib.gunzip(gz) until stop
  end
end

deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + seconds
children = crashed = 0
while Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
  pid = fork do
    # Garbage, then GC: frees whatever the vanished threads left behind.
    3.times do
      Array.new(20_000) { |i| "x#{i}" }
      GC.start
    end
    exit!(0)
  end
  _, status = Process.wait2(pid)
  children += 1
  unless status.success?
    crashed += 1
    warn "child #{pid}: #{status.inspect}"
  end
end
stop = true
inflaters.each(&:join)
puts "zlib_fork_crash: #{children} forked children, #{crashed} crashed (#{RUBY_DESCRIPTION}, zlib #{Zlib::VERSION})"
exit(crashed.zero? ? 0 : 1)
