# frozen_string_literal: true

# Says whether a crashed torture run's output is one of the two Ruby 3.1.2
# GC.compact bugs the torture hits without this gem being involved
# (docs/known-ruby-bugs.md), by the crash's own signature: Debian 12's
# libruby3.1, the faulting frame and its callers as offsets into libruby,
# and no frame of this gem.
#
#   ruby stress/known_ruby_crash.rb LOG    # exit 0 and name the bug if known, 1 otherwise
#
# script/test uses it to run the 2-minute torture once more after such a
# crash instead of failing CI on a Ruby bug; any other crash still fails.
#
# Where Ruby's own report crashed too (a second SIGSEGV in rb_bug's
# rb_source_location_cstr over the corrupted heap: the process dies with no
# [BUG] line), script/test appends a report gdb made from the core dump
# (GDB_MARKER, then the crashing thread's `bt` and `info proc mappings`),
# and the same signature is read from that.

# Debian 12's build of 3.1.2; the offsets below are for exactly this build.
DEBIAN_LIBRUBY = "3.1.7+really3.1.2-0+deb12u1"
KNOWN = {
  # check_stack_for_moved -> rb_vm_each_stack_value reads one slot past a VM
  # stack top (ruby/ruby#7081, repro/ruby31_compaction_crash.rb).
  %w[cf4b6 24caef cea19] => "ruby/ruby#7081: GC.compact's stack check reads past a thread's VM stack",
  # gc_update_references -> st_foreach_with_replace over RubyVM::FrozenCore's
  # never-marked __classpath__ entry (repro/ruby31_frozencore_classpath.rb).
  %w[c8528 1e2c2b cb6ff] => "RubyVM::FrozenCore's unmarked __classpath__, followed by GC.compact into a freed page"
}.freeze

GDB_MARKER = "== gdb report of the core dump"

log = File.binread(ARGV.fetch(0)).force_encoding(Encoding::BINARY)
gdb = log.split(GDB_MARKER, 2)[1]
# The crashing thread's frames: `bt`'s, the first run of "#N" lines (the
# mappings and `thread apply all` come after).
gdb_crashing = gdb && gdb.lines.drop_while { |l| !l.start_with?("#") }.take_while { |l| l.start_with?("#") }
unless log.include?("[BUG]") || gdb
  puts "no Ruby [BUG] report nor core dump report in #{ARGV[0]}"
  exit 1
end
installed = `dpkg-query -W -f='${Version}' libruby3.1 2>/dev/null`
unless log.include?("ruby 3.1.2p20") && installed == DEBIAN_LIBRUBY
  puts "not Debian 12's Ruby 3.1.2 (libruby3.1 #{installed.empty? ? 'not installed' : installed})"
  exit 1
end
if log.include?("memprofiler_pprof_rs.so(") || gdb_crashing&.any? { |l| l.include?("memprofiler_pprof_rs") }
  puts "a frame of this gem is on the crashing stack"
  exit 1
end

if log.include?("[BUG]")
  # Ruby's report: its memory map, and its C backtrace past the signal frame.
  base = log[/^(\h+)-\h+ r--p 00000000 \S+ \d+\s+\S*libruby-3\.1\.so[^\n]*$/, 1]&.to_i(16)
  frames = log.lines.drop_while { |l| !l.include?("__restore_rt") }.drop(1).first(3)
  addresses = frames.map { |l| l[/\[0x(\h+)\]/, 1] }
else
  # gdb's: `info proc mappings` (start, end, size, file offset, path), then
  # the crashing thread's frames past the first "<signal handler called>".
  base = gdb[/^\s*0x(\h+)\s+0x\h+\s+0x\h+\s+0x0\s+\S*libruby-3\.1\.so\S*\s*$/, 1]&.to_i(16)
  frames = gdb_crashing.drop_while { |l| !l.include?("<signal handler called>") }.drop(1).first(3)
  addresses = frames.map { |l| l[/^#\d+\s+0x(\h+) in /, 1] }
end
offsets = addresses.map { |a| a ? (a.to_i(16) - base).to_s(16) : "?" } if base
bug = offsets && KNOWN[offsets]
if bug
  puts "known Ruby 3.1.2 bug: #{bug} (faulting frames libruby+0x#{offsets.join(', +0x')})"
  exit 0
end
puts "not a known Ruby bug (faulting frames: #{offsets ? "libruby+0x#{offsets.join(', +0x')}" : 'not found'})"
exit 1
