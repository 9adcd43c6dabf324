# frozen_string_literal: true

# Reads valgrind memcheck logs and keeps only what concerns this gem's
# extension (script/memcheck uses it). Ruby's conservative GC reads
# uninitialised stack words on purpose, and Ruby never frees its classes and
# symbols at exit, so an unfiltered report of a Ruby process has tens of
# thousands of entries that say nothing about the extension. Kept:
# - an error (invalid read/write/free, uninitialised value, ...) whose
#   innermost frame is in the extension;
# - a "definitely lost" block allocated by the extension itself: the first
#   frame under the allocator (malloc, calloc, realloc, ...) is in the
#   extension, not in libruby (which the extension calls to define classes).
#
#   ruby script/valgrind_report.rb LOG...   (exit 1 if anything was kept)

# The .so by name, the core test binary, or (builds with debug info, where
# valgrind prints source lines instead of the object) the crate's symbols.
OURS = /memprofiler_pprof_rs\.so|memprofiler_pprof_rs-[0-9a-f]+\)|memprofiler_pprof_rs::/
ALLOCATOR = %r{vgpreload_memcheck|/valgrind/}

def frames(record)
  record.lines.grep(/^==\d+==\s+(at|by) 0x/)
end

def ours?(frame) = frame.match?(OURS)

kept = []
counts = Hash.new(0)
ARGV.each do |log|
  text = File.read(log, encoding: "BINARY")
  text.split(/^==\d+== \n/).each do |record|
    head = record.lines.find { |l| l.match?(/^==\d+== \S/) }
    next unless head

    stack = frames(record)
    next if stack.empty?

    if head.include?("definitely lost")
      counts[:leaks] += 1
      first_caller = stack.find { |f| !f.match?(ALLOCATOR) }
      kept << [log, record] if first_caller && ours?(first_caller)
    elsif head.match?(/Invalid|uninitialised|Mismatched|overlap|Syscall param|Illegal|fishy/)
      counts[:errors] += 1
      kept << [log, record] if ours?(stack.first)
    end
  end
end

puts "valgrind_report: #{ARGV.size} logs, #{counts[:errors]} errors and #{counts[:leaks]} definite leaks in all; " \
     "#{kept.size} in the extension's own code"
kept.first(20).each { |log, record| puts "--- #{log}", record }
exit(kept.empty? ? 0 : 1)
