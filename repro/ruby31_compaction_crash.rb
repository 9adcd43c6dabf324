# frozen_string_literal: true

# Upstream: https://github.com/ruby/ruby/pull/7081 ("Fix off-by-one error in
# rb_vm_each_stack_value", merged January 2023). No bugs.ruby-lang.org issue
# is known for it: the fix went in as a pull request only.
# Forensics: docs/known-ruby-bugs.md.
#
# Tries to reproduce, WITHOUT this gem, the one crash stress/torture.rb hit on
# Ruby 3.1.2 that the harness could not avoid: "[BUG] system stack overflow
# during GC" inside GC.compact. Its core dump pointed at Ruby's
# check_stack_for_moved -> rb_vm_each_stack_value reading the VALUE one slot
# past a thread's VM stack top (fixed upstream in ruby/ruby#7081, Jan 2023;
# Debian 12's 3.1.2 predates it).
#
#   ruby repro/ruby31_compaction_crash.rb [seconds] [seconds_per_child]
#
# Runs children (fresh `ruby` processes, nothing of this gem loaded) whose
# threads do what the torture's workers do -- deep recursion, exceptions,
# eval'd methods, runtime classes, fibers, short threads -- while their main
# thread compacts the heap in a loop. Prints how many children crashed and,
# for each crash, whether stress/known_ruby_crash.rb recognises it (the
# torture's crash faulted at libruby+0xcf4b6, called from +0x24caef).

require "rbconfig"
require "tmpdir"

CHILD = <<~'RUBY'
  class Expected < StandardError; end
  stop = false
  retained = Array.new(3_000)
  keep = ->(o) { retained[rand(retained.size)] = o }

  def recurse(depth, raise_at_bottom)
    return bottom(raise_at_bottom) if depth.zero?
    recurse(depth - 1, raise_at_bottom)
  end

  def bottom(raise_at_bottom)
    objects = Array.new(100) { |i| "deep#{i}" }
    raise Expected, "bottom" if raise_at_bottom
    objects
  end

  steps = [
    -> { 500.times { |i| s = "w-#{i}-" * rand(1..40); keep.(s) if (i % 7).zero? } },
    -> { 200.times { |i| keep.({ a: Array.new(rand(0..64)) { |j| j.to_s }, i => [i, i.to_f] }) } },
    lambda do
      klass = Class.new { define_method(:fill) { |n| Array.new(n) { |i| "dyn#{i}" } } }
      keep.(klass.new.fill(rand(1..100)))
    end,
    lambda do
      mod = Module.new
      mod.module_eval("def self.make(n) = Array.new(n) { |i| \"e\#{i}\" * 3 }\n" \
                      "def self.nest(n) = n.zero? ? make(20) : nest(n - 1)", "(eval)", 1)
      keep.(mod.nest(rand(1..60)))
    end,
    lambda do
      keep.(recurse(10_000, rand < 0.3))
    rescue Expected => e
      keep.(e)
    end,
    lambda do
      50.times do |i|
        raise Expected, "boom" if i.odd?
        Integer("nope #{i}")
      rescue Expected, ArgumentError => e
        keep.(e) if (i % 10).zero?
      end
    end,
    -> { e = Enumerator.new { |y| 100.times { |i| y << "f#{i}" } }; 20.times { keep.(e.next) } },
    -> { keep.(Thread.new { Array.new(200) { |i| "t#{i}" } }.value) },
  ]

  workers = Array.new(4) { Thread.new { steps.sample.call until stop } }
  # Threads that leave fresh garbage just above their VM stack top and then
  # block for a while, as the torture's flusher, validator and forker
  # threads do: the stale slot the buggy check reads.
  workers += Array.new(4) do
    Thread.new do
      until stop
        Array.new(rand(1..500)) { |i| "stale#{i}" }.map(&:upcase).size
        sleep rand * 0.5
      end
    end
  end
  deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + Float(ARGV[0])
  while Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
    sleep rand * 0.05
    if rand < 0.3
      GC.verify_compaction_references(double_heap: rand < 0.5, toward: :empty)
    else
      GC.compact
    end
  end
  stop = true
  workers.each(&:join)
RUBY

seconds = Float(ARGV[0] || 600)
per_child = Float(ARGV[1] || 60)
abort "#{$PROGRAM_NAME}: meant for Ruby 3.1 (this is #{RUBY_VERSION})" unless RUBY_VERSION.start_with?("3.1.")

env = { "RUBY_THREAD_VM_STACK_SIZE" => (64 * 1024 * 1024).to_s }
deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + seconds
children = crashed = 0
Dir.mktmpdir do |dir|
  script = File.join(dir, "child.rb")
  File.write(script, CHILD)
  while Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
    log = File.join(dir, "child.log")
    pid = Process.spawn(env, RbConfig.ruby, "-W0", script, per_child.to_s, %i[out err] => log)
    _, status = Process.wait2(pid)
    children += 1
    next if status.success?

    crashed += 1
    report = File.read(log)
    first = report.lines.find { |l| l.include?("[BUG]") }&.strip || status.inspect
    verdict = IO.popen([RbConfig.ruby, File.expand_path("../stress/known_ruby_crash.rb", __dir__), log], &:read).strip
    warn "child #{children}: #{first}; #{verdict}"
    File.write("tmp/ruby31_compaction_crash-#{pid}.log", report) if Dir.exist?("tmp")
  end
end
puts "ruby31_compaction_crash: #{crashed} of #{children} children crashed " \
     "(#{per_child.round}s each, GC.compact in a loop, Ruby #{RUBY_VERSION}, nothing of this gem loaded)"
