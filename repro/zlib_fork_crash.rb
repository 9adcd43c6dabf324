# frozen_string_literal: true

# Upstream: Ruby bug #20863, https://bugs.ruby-lang.org/issues/20863, fixed
# in zlib by https://github.com/ruby/zlib/pull/88 ("Don't call
# `rb_str_set_len` while released the GVL", November 2024).
# Forensics: docs/known-ruby-bugs.md.
#
# Reproduces, WITHOUT this gem, the crash that stress/torture.rb's own profile
# checks hit in forked children on Ruby 3.1: Ruby's zlib (2.1.1, bundled with
# 3.1) resizes its output String (rb_str_modify_expand, rb_str_set_len)
# while it has released the GVL. A fork from another thread at that moment
# gives the child a String whose pointer is the buffer realloc() just freed;
# when the child's GC frees that String, glibc aborts with "double free or
# corruption", or a later GC trips over the damage.
#
#   ruby repro/zlib_fork_crash.rb [seconds]             # default 300
#   ruby -Ilib repro/zlib_fork_crash.rb 300 native      # the control
#
# Prints how many forked children crashed. Without "native" nothing here
# loads memprofiler_pprof_rs. With it, the threads gunzip with
# MemprofilerPprof::Profile.gunzip (Rust, GVL held), which the gem uses
# instead of Ruby's zlib everywhere: its children should not crash.

require "zlib"
require "securerandom"

seconds = Float(ARGV[0] || 300)
native = ARGV[1] == "native"
require "memprofiler_pprof_rs" if native
# Compressible but not trivially: many output-buffer expansions per inflate.
payload = Array.new(4_000) { |i| "sample #{i} #{SecureRandom.hex(4)} " * 4 }.join
gz = Zlib.gzip(payload)
stop = false

inflaters = Array.new(3) do
  Thread.new do
    if native
      MemprofilerPprof::Profile.gunzip(gz) until stop
    else
      Zlib.gunzip(gz) until stop
    end
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
gunzip = native ? "MemprofilerPprof::Profile.gunzip" : "Ruby's zlib #{Zlib::VERSION}"
puts "zlib_fork_crash: #{children} forked children, #{crashed} crashed (#{RUBY_DESCRIPTION}; #{gunzip})"
exit(crashed.zero? ? 0 : 1)
