# frozen_string_literal: true

# Upstream: https://github.com/ruby/ruby/pull/13458 ("Make FrozenCore a plain
# class"). No bugs.ruby-lang.org issue is known for this bug; none is
# invented here. Forensics: docs/known-ruby-bugs.md.
#
# Shows, WITHOUT this gem, the Ruby 3.1 bug behind the torture's second kind
# of crash on Debian 12 ("[BUG] Segmentation fault" inside GC.compact, in its
# reference-update pass, reading a `__classpath__` table entry).
#
#   ruby repro/ruby31_frozencore_classpath.rb
#
# RubyVM::FrozenCore is made a T_ICLASS at boot (to hide it). Ruby 3.1 never
# marks an ICLASS's instance-variable table (it belongs to the module), but
# FrozenCore's table is its own and holds its `__classpath__` String. So that
# String is freed by the first GC, while the table keeps pointing at its slot.
# GC.compact does update ICLASS tables: whenever whatever object now lives in
# that slot moves, the stale entry follows it; when that object dies and its
# heap page is released, the next GC.compact dereferences unmapped memory.
# (Upstream later made FrozenCore a plain class: ruby/ruby#13458.)
#
# This reads the entry with Fiddle (layout offsets for 3.1 on x86_64, checked
# against a core dump) and prints what it points at: not a String.

require "fiddle"

unless RUBY_VERSION.start_with?("3.1.") && RUBY_PLATFORM.start_with?("x86_64")
  abort "#{$PROGRAM_NAME}: the offsets here are for Ruby 3.1 on x86_64"
end

CLASSPATH_ID = 0xf01 # rb_intern("__classpath__") in 3.1.2, a static ID
T_STRING = 0x05
TYPE_NAMES = { 0x00 => "T_NONE (free slot)", 0x05 => "T_STRING", 0x1a => "T_IMEMO", 0x1e => "T_MOVED" }.freeze

def word(address) = Fiddle::Pointer.new(address)[0, 8].unpack1("Q")

frozen_core = word(Fiddle::Handle::DEFAULT["rb_mRubyVMFrozenCore"])
class_ext = word(frozen_core + 0x18)     # struct RClass: basic(16), super, ptr
iv_table = word(class_ext + 0x08)        # rb_classext_t: iv_index_tbl, iv_tbl
entries = word(iv_table + 0x30)          # st_table.entries
key = word(entries + 0x08)               # st_table_entry: hash, key, record
abort "layout not recognised (key 0x#{key.to_s(16)})" unless word(iv_table + 0x10) == 1 && key == CLASSPATH_ID

report = lambda do |moment|
  value = word(entries + 0x10)
  type = word(value) & 0x1f
  text = type == T_STRING ? " #{Fiddle::Pointer.new(value + 16)[0, 18].inspect}" : ""
  puts format("%-22s RubyVM::FrozenCore.__classpath__ -> 0x%x, a %s%s",
              moment, value, TYPE_NAMES.fetch(type, format("type 0x%x", type)), text)
  type
end

first = report.call("at start:")
moved = false
50.times do
  Array.new(20_000) { |i| "churn#{i}" }
  before = word(entries + 0x10)
  GC.compact
  next if word(entries + 0x10) == before

  report.call("after a GC.compact:")
  moved = true
  break
end
if first == T_STRING
  puts "FrozenCore's class path is still a String here."
else
  puts "Its class path String is gone: the entry is a dangling reference#{moved ? ' that GC.compact keeps re-pointing' : ''}."
end
