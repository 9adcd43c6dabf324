# frozen_string_literal: true

# What binding the gem's Ruby methods through magnus would cost a call
# (issue 35's question, ARCHITECTURE.md "The binding layer"): builds
# bench/magnus_probe (magnus 0.8 on the gem's rb-sys), then counts under
# valgrind's callgrind the instructions of a million calls of a method bound
# by magnus's `method!`, of the same method bound by hand, and of the loop
# alone. Needs cargo, valgrind and crates.io.
#
#   ruby bench/magnus_probe.rb

require "rbconfig"
require "tmpdir"

PROBE = File.expand_path("magnus_probe", __dir__)
CALLS = 1_000_000

def run!(*command, **options)
  system(*command, **options) || abort("magnus_probe: #{command.join(' ')} failed")
end

def instructions(script, dir)
  out = File.join(dir, "callgrind.out")
  run!("valgrind", "--tool=callgrind", "--callgrind-out-file=#{out}", RbConfig.ruby, "-e", script,
       err: File::NULL, out: File::NULL)
  File.foreach(out).grep(/^summary:/).first.split.last.to_i
end

Dir.mktmpdir("magnus_probe") do |dir|
  # Built against the Ruby that runs the loops (rb-sys reads RUBY).
  run!({ "RUBY" => RbConfig.ruby }, "cargo", "build", "--release", "--locked", "--quiet",
       "--manifest-path", File.join(PROBE, "Cargo.toml"), "--target-dir", File.join(dir, "target"))
  library = File.join(dir, "magnus_probe.so")
  File.rename(File.join(dir, "target", "release", "libmagnus_probe.so"), library)
  loop_of = lambda do |call|
    "require #{library.dump}; o = Probe.new; x = 0; i = 0; " \
      "while i < #{CALLS}; x = #{call}; i += 1; end; exit(x == #{CALLS + 1} ? 0 : 1)"
  end
  base = instructions(loop_of.call("i + 2"), dir)
  rows = { "magnus method!" => "o.add(i, 2)", "raw extern \"C\"" => "o.raw_add(i, 2)" }
  puts "#{RUBY_DESCRIPTION}; #{CALLS} calls, instructions per call over the loop alone (callgrind)"
  rows.each do |name, call|
    per_call = (instructions(loop_of.call(call), dir) - base) / CALLS.to_f
    puts format("%-26<name>s %6.0<per_call>f", name: name, per_call: per_call)
  end
end
