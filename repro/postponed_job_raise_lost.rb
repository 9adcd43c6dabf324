# frozen_string_literal: true

# Shows, WITHOUT this gem, why a postponed job must never call a Ruby
# method: Ruby checks for interrupts when the method returns, so an
# exception raised into the thread meanwhile (Thread#raise, as Timeout does)
# is raised inside the job, and Ruby's job runner drops whatever a job
# raises. Found while moving light mode's liveness to an
# ObjectSpace::WeakMap filled from the job (issue 32; dd-trace-rb's heap
# profiler fills its WeakMap that way). Forensics: docs/known-ruby-bugs.md.
#
#   ruby repro/postponed_job_raise_lost.rb [runs] [seconds_per_run]
#
# Builds a tiny extension (mkmf, in a temporary directory) whose NEWOBJ
# hook pins new objects and triggers a postponed job (Ruby 3.3's
# rb_postponed_job_trigger), and whose job files them with
# ObjectSpace::WeakMap#[]= under rb_protect. Then, in fresh processes: a
# worker thread allocates in a loop, and the main thread raises an
# exception into it, waits up to 2 s for it to be rescued, and repeats.
# Prints, per run, how many were sent, rescued, lost, and caught inside the
# job; and HUNG if a process made no progress (it is killed).

require "rbconfig"
require "tmpdir"
require "open3"

EXTENSION = <<~'C'
  #include <ruby.h>
  #include <ruby/debug.h>

  static VALUE weak_map = Qnil;
  static VALUE pinned[4096];
  static int pinned_count = 0;
  static long next_key = 0;
  static rb_postponed_job_handle_t job;
  static VALUE hook = Qnil;
  static long caught = 0;

  static VALUE aset(VALUE args) {
      VALUE *argv = (VALUE *)args;
      return rb_funcallv(weak_map, rb_intern("[]="), 2, argv);
  }

  static void file_pending(void *unused) {
      while (pinned_count > 0) {
          VALUE argv[2] = { LONG2FIX(++next_key), pinned[pinned_count - 1] };
          int state = 0;
          rb_protect(aset, (VALUE)argv, &state);
          if (state) { caught++; rb_set_errinfo(Qnil); return; }
          pinned_count--;
      }
  }

  static void on_newobj(VALUE tpval, void *data) {
      VALUE obj = rb_tracearg_object(rb_tracearg_from_tracepoint(tpval));
      if (RB_BUILTIN_TYPE(obj) != T_OBJECT || pinned_count >= 4096) return;
      pinned[pinned_count++] = obj;
      rb_postponed_job_trigger(job);
  }

  static void mark(void *unused) {
      for (int i = 0; i < pinned_count; i++) rb_gc_mark(pinned[i]);
  }

  static VALUE start(VALUE self) {
      rb_gc_register_address(&weak_map);
      rb_gc_register_address(&hook);
      weak_map = rb_class_new_instance(0, NULL, rb_path2class("ObjectSpace::WeakMap"));
      job = rb_postponed_job_preregister(0, file_pending, NULL);
      hook = rb_tracepoint_new(0, RUBY_INTERNAL_EVENT_NEWOBJ, on_newobj, NULL);
      rb_tracepoint_enable(hook);
      return Qnil;
  }

  static VALUE caught_count(VALUE self) { return LONG2NUM(caught); }

  static const rb_data_type_t pins_type = { "pins", { mark, NULL, NULL } };

  void Init_pjraise(void) {
      VALUE mod = rb_define_module("PJRaise");
      rb_define_module_function(mod, "start", start, 0);
      rb_define_module_function(mod, "caught", caught_count, 0);
      rb_gc_register_mark_object(rb_data_typed_object_wrap(0, NULL, &pins_type));
  }
C

CHILD = <<~'RUBY'
  require ARGV[0]
  class Ping < StandardError; end
  PJRaise.start
  received = 0
  ready = Queue.new
  worker = Thread.new do
    Thread.handle_interrupt(Ping => :never) do
      ready << true
      loop do
        Thread.handle_interrupt(Ping => :immediate) { loop { Array.new(20) { Object.new } } }
      rescue Ping
        received += 1
      end
    end
  end
  ready.pop
  clock = -> { Process.clock_gettime(Process::CLOCK_MONOTONIC) }
  sent = lost = 0
  deadline = clock.call + Float(ARGV[1])
  while clock.call < deadline
    before = received
    worker.raise(Ping)
    sent += 1
    waited = clock.call + 2
    sleep 0.001 while received == before && clock.call < waited
    lost += 1 if received == before
  end
  puts "sent #{sent}, rescued #{received}, lost #{lost}, raised inside the job #{PJRaise.caught}"
  $stdout.flush
  exit!(0)
RUBY

abort "needs Ruby 3.3 or later (rb_postponed_job_trigger)" if RUBY_VERSION < "3.3"
runs = Integer(ARGV[0] || 10)
seconds = Float(ARGV[1] || 4)
Dir.mktmpdir do |dir|
  File.write(File.join(dir, "pjraise.c"), EXTENSION)
  File.write(File.join(dir, "extconf.rb"), "require 'mkmf'\ncreate_makefile('pjraise')\n")
  _, err, status = Open3.capture3(RbConfig.ruby, "extconf.rb", chdir: dir)
  abort "extconf failed: #{err}" unless status.success?
  _, err, status = Open3.capture3("make", chdir: dir)
  abort "make failed: #{err}" unless status.success?
  library = File.join(dir, "pjraise.so")
  hung = 0
  runs.times do |i|
    Open3.popen2e(RbConfig.ruby, "-e", CHILD, "--", library, seconds.to_s) do |_in, out, child|
      if child.join(seconds + 30)
        puts "run #{i + 1}: #{out.read.strip}"
      else
        Process.kill(:KILL, child.pid)
        hung += 1
        puts "run #{i + 1}: HUNG (killed after #{(seconds + 30).round} s)"
      end
    end
  end
  puts "#{hung} of #{runs} runs hung (Ruby #{RUBY_VERSION})"
end
