# frozen_string_literal: true

require "json"
require_relative "retention/graph_walk"
require_relative "retention/hop_names"
require_relative "retention_report"

module MemprofilerPprof
  # A retention report could not be made: no fork on this platform, fork
  # failed, another report is running, the walk's process did not answer.
  class RetentionError < RuntimeError
    include Error
  end

  # Collector#retention_report: what holds the sampled objects of the
  # sites with the most memory in use. The parent forks; the child, which
  # sees a copy of the heap and never runs a GC, picks the sites and a few
  # of their sampled objects, walks the heap from the GC's roots for the
  # shortest chain of references to each (GraphWalk), names every hop
  # (HopNames) and writes the answer to a pipe as JSON, then exits. The
  # parent pays the fork and waits without the GVL.
  module Retention
    # Sites and objects a report may ask for: each object is a target of
    # the walk, and its path a line of the report.
    MAX_TOP = 100
    MAX_PER_SITE = 100
    MAX_TIMEOUT = 3600
    MAX_MEMORY_MB = 1_000_000
    # The child's answer is a few KB a path; a larger one is a bug.
    MAX_ANSWER_BYTES = 64 * 1024 * 1024
    # The walk stops at this share of the timeout, and naming the paths at
    # NAMING_SHARE more, leaving the rest for the answer; the child is
    # killed at the timeout.
    WALK_SHARE = 0.8
    NAMING_SHARE = 0.1
    # Frames kept for each site, leaf first.
    SITE_FRAMES = 8

    LOCK = Mutex.new

    module_function

    def report(collector, top:, per_site:, sites:, timeout:, max_objects:, max_memory_mb:, gc:)
      top = whole_number(top, :top, 1..MAX_TOP)
      per_site = whole_number(per_site, :per_site, 1..MAX_PER_SITE)
      timeout = validate_timeout(timeout)
      max_objects = whole_number(max_objects, :max_objects, 1..)
      max_memory_mb = whole_number(max_memory_mb, :max_memory_mb, 1..MAX_MEMORY_MB)
      sites = validate_sites(sites)
      Collector.validate_flag(gc, :gc)
      check_can_walk(collector)
      # A full GC first, here, leaves no garbage among the sampled objects
      # (it would show "no path from a root found"). Its pause is the
      # process's; the default leaves it out.
      GC.start if gc
      # (A Thread#raise or Timeout landing between taking the lock and the
      # ensure would leave it taken for good.)
      Thread.handle_interrupt(Object => :never) do
        raise RetentionError, "a retention report is already running in this process" unless LOCK.try_lock

        begin
          Thread.handle_interrupt(Object => :immediate) do
            in_child(timeout) do |deadline|
              child_report(collector, top: top, per_site: per_site, sites: sites, walk_deadline: deadline,
                                      max_objects: max_objects, max_memory_mb: max_memory_mb, timeout: timeout)
            end
          end
        ensure
          LOCK.unlock
        end
      end
    end

    def whole_number(value, name, range)
      unless value.is_a?(Integer) && range.cover?(value)
        limits = range.end ? "from #{range.begin} to #{range.end}" : "at least #{range.begin}"
        raise value.is_a?(Integer) ? ArgumentError : TypeError,
              "#{name} must be a whole number #{limits}, got #{value.inspect}"
      end
      value
    end

    def validate_timeout(timeout)
      unless timeout.is_a?(Numeric) && timeout.real? && timeout.positive? && timeout <= MAX_TIMEOUT
        raise ArgumentError, "timeout must be a number of seconds above 0 and at most #{MAX_TIMEOUT}, " \
                             "got #{timeout.inspect}"
      end
      timeout.to_f
    end

    def validate_sites(sites)
      return nil if sites.nil?

      list = Array(sites)
      raise ArgumentError, "sites must name at least one site (Strings or Regexps), got #{sites.inspect}" if list.empty?

      bad = list.find { |site| !site.is_a?(String) && !site.is_a?(Regexp) }
      raise ArgumentError, "sites must be Strings or Regexps naming sites, got #{bad.inspect}" if bad

      list
    end

    def check_can_walk(collector)
      unless collector.running?
        raise StateError, "retention_report needs a running collector: only while it runs are its sampled " \
                          "objects known to be alive"
      end
      if RactorSafety.ractors_used?
        raise RetentionError, "retention reports are not available once Ractors are used: the collector " \
                              "stops tracking objects then"
      end
      return if Process.respond_to?(:fork)

      raise RetentionError, "retention reports need fork, which this platform does not have"
    end

    # Forks a child that yields its answer (a Hash) to the parent, which
    # waits at most `timeout` seconds for it; the child's walk stops at
    # WALK_SHARE of that. However this ends, the child is gone after it.
    def in_child(timeout)
      started = clock
      reader, writer = IO.pipe
      pid = nil
      # (So that an interrupt cannot come between the fork and knowing the
      # child's pid, which the ensure needs to reap it.)
      Thread.handle_interrupt(Object => :never) do
        pid = fork_child(reader, writer) { yield started + (timeout * WALK_SHARE) }
      end
      fork_seconds = clock - started
      writer.close
      answer = read_answer(reader, started + timeout)
      unless answer
        raise RetentionError, "the retention walk did not answer within #{timeout} s (its process was killed); " \
                              "give a larger timeout: or a smaller max_objects:"
      end
      status = Thread.handle_interrupt(Object => :never) do
        wait_for(pid).tap { pid = nil }
      end
      finish(answer, status, fork_seconds: fork_seconds, seconds: clock - started)
    ensure
      Thread.handle_interrupt(Object => :never) do
        reader&.close
        writer&.close unless writer.nil? || writer.closed?
        reap(pid) if pid
      end
    end

    # Forks, with GC off around it: GC.disable first finishes a GC under
    # way, here, where every thread's frames still hold what they hold. The
    # child keeps GC off for good: a GC there would free what only the
    # parent's other threads hold (gone in a fork), running its finalizers
    # and C free functions there (a database connection's, on a socket the
    # parent shares). It lists and walks the heap as it was at the fork.
    def fork_child(reader, writer, &answer)
      parent = Process.pid
      gc_was_disabled = GC.disable
      begin
        pid = plain_fork
        run_child(reader, writer, &answer) if pid.zero?
        pid
      ensure
        exit!(1) unless Process.pid == parent # (never the parent's code in the child)
        GC.enable unless gc_was_disabled
      end
    rescue NotImplementedError, SystemCallError => e
      raise RetentionError, "a retention report could not fork: #{e.message}"
    end

    # Process._fork as Ruby defines it, without the hooks libraries prepend
    # to it (Rails', an APM's, this gem's Atfork): the child only reads the
    # heap, answers and exits, and must not reconnect, restart threads or
    # flushers, or run their code at all. (The extension's own fork
    # handlers are pthread_atfork's, and run.)
    def plain_fork
      method = Process.method(:_fork)
      method = method.super_method until method.nil? || method.owner == Process.singleton_class
      (method || Process.method(:_fork)).call
    end

    GC_TURNED_ON = 2

    # The child's life: the answer to the pipe, then exit!, so that no
    # at_exit handler or finalizer of the parent's runs here.
    def run_child(reader, writer)
      # (The parent forked with interrupts held back; here a signal must end
      # the child at once.)
      Thread.handle_interrupt(Object => :immediate) do
        # Another thread may have turned GC on between GC.disable and the
        # fork; then no GC may run here at all, not even to say so.
        exit!(GC_TURNED_ON) unless GC.enable
        GC.disable
        reader.close
        reset_traps
        answer = begin
          JSON.generate(yield)
        rescue Exception => e # rubocop:disable Lint/RescueException (the parent gets every failure as an answer)
          JSON.generate({ "error" => "#{e.class}: #{e.message}".scrub })
        end
        writer.write("#{answer.bytesize}\n", answer)
        writer.close
      end
    ensure
      exit!(0)
    end

    # A trap the app set would run the app's code in the child: the
    # system's defaults instead (these signals then end the child, or are
    # ignored).
    def reset_traps
      { "SYSTEM_DEFAULT" => %w[INT TERM HUP QUIT USR1 USR2 ALRM], "IGNORE" => %w[TTIN TTOU WINCH] }
        .each do |action, signals|
          signals.each do |signal|
            Signal.trap(signal, action)
          rescue ArgumentError
            nil # (not on this platform)
          end
        end
    end

    # The child's exit status, or nil if it was reaped elsewhere (a SIGCHLD
    # handler, or CHLD ignored).
    def wait_for(pid)
      Process.wait2(pid).last
    rescue Errno::ECHILD
      nil
    end

    def reap(pid)
      Process.kill(:KILL, pid)
    rescue Errno::ESRCH
      nil
    ensure
      wait_for(pid)
    end

    # The child's answer ("<bytes>\n<JSON>": complete without waiting for
    # EOF, which a process forked meanwhile would hold off), nil when it is
    # not complete by `deadline`, "" when the child ended without one.
    def read_answer(reader, deadline)
      answer = +""
      loop do
        header = answer[/\A\d{1,12}\n/]
        if header && answer.bytesize >= header.bytesize + header.to_i
          return answer.byteslice(header.bytesize, header.to_i).force_encoding(Encoding::UTF_8)
        end

        remaining = deadline - clock
        return nil unless remaining.positive?
        next unless IO.select([reader], nil, nil, remaining)

        chunk = reader.read_nonblock(1 << 16, exception: false)
        return "" if chunk.nil?
        next if chunk == :wait_readable

        answer << chunk
        raise RetentionError, "the retention walk's answer is over #{MAX_ANSWER_BYTES} bytes" if
          answer.bytesize > MAX_ANSWER_BYTES
      end
    end

    def finish(answer, status, fork_seconds:, seconds:)
      if answer.empty? && status&.exitstatus == GC_TURNED_ON
        raise RetentionError, "another thread turned GC on (GC.enable) while the retention report forked; try again"
      end
      raise RetentionError, "the retention walk's process ended without an answer (#{status.inspect})" if answer.empty?

      data = JSON.parse(answer)
      raise RetentionError, "the retention walk failed: #{data['error']}" if data["error"]

      RetentionReport.from_h(data.merge("fork_seconds" => fork_seconds, "seconds" => seconds))
    rescue JSON::ParserError => e
      raise RetentionError, "the retention walk's answer is not JSON: #{e.message.lines.first&.strip}"
    end

    # In the child: the report as plain data.
    def child_report(collector, top:, per_site:, sites:, walk_deadline:, max_objects:, max_memory_mb:, timeout:)
      be_the_first_to_go
      chosen, targets, unmatched = choose_sites(collector, top, per_site, sites)
      exclude = {}.compare_by_identity
      exclude[targets] = true
      ObjectSpace.each_object(Collector) do |other|
        exclude[other] = true
        other.stop! if other.running? # (their hooks would sample the walk)
      end
      wanted = chosen.map { |site| [per_site, site["candidates"]].min }
      walk = GraphWalk.new(targets, wanted: wanted, exclude: exclude, deadline: walk_deadline,
                                    max_objects: max_objects, max_bytes: max_memory_mb << 20,
                                    memory: method(:private_bytes)).run
      stopped = name_paths(chosen, targets, walk, per_site, walk_deadline + (timeout * NAMING_SHARE))
      {
        "pid" => Process.ppid, "taken_at" => Time.now.utc.strftime("%Y-%m-%d %H:%M:%S UTC"), "sites" => chosen,
        "objects_reached" => walk.reached, "stopped" => stopped, "timeout" => timeout,
        "max_objects" => max_objects, "max_memory_mb" => max_memory_mb, "child_private_bytes" => private_bytes,
        "unmatched" => unmatched
      }
    end

    # Each site's objects with a path first (up to per_site), then those
    # without; and, when the walk went through the whole heap, how many of
    # the site's candidates have none. The walk's stop reason, or "time"
    # if naming ran out of its share of it.
    def name_paths(chosen, targets, walk, per_site, name_by)
      stopped = walk.stopped&.to_s
      with_path = Array.new(chosen.size) { [] }
      without = Array.new(chosen.size) { [] }
      targets.each_pair { |object, site| (walk.paths[object] ? with_path : without)[site] << object }
      chosen.each_with_index do |site, index|
        shown = with_path[index].first(per_site)
        shown += without[index].first(per_site - shown.size)
        site["objects"] = shown.map do |object|
          # (Naming reads whole Hashes and Arrays: it has its share of the time.)
          entry = catch(:naming_time) { object_entry(object, walk.paths[object], name_by) }
          unless entry
            stopped ||= "time"
            entry = object_entry(object, nil, name_by)
          end
          entry
        end
        site["no_path"] = without[index].size if walk.stopped.nil? && with_path[index].size < per_site
      end
      stopped
    end

    # Objects sampled at a site that may be garbage (uncollected since the
    # last GC, with no path): this many candidates for each path asked for.
    CANDIDATES_PER_PATH = 4

    # [sites as data, {object => its site's index}, the biggest sites' names
    # when `wanted` matched none]: the sites by estimated bytes in use (those
    # `wanted` names, if given; not the gem's own), up to CANDIDATES_PER_PATH
    # x per_site sampled objects each. Every object listed is alive: GC
    # finished its last run before the fork and has been off since.
    def choose_sites(collector, top, per_site, wanted)
      candidates = per_site * CANDIDATES_PER_PATH
      by_site = {}
      collector.__send__(:_native_live_sites, candidates).each do |frames, objects, bytes, sampled, samples|
        next if own_site?(frames)

        name = site_name(frames)
        site = by_site[name] ||= { "site" => name, "frames" => frame_names(frames), "inuse_objects" => 0.0,
                                   "inuse_bytes" => 0.0, "samples" => 0, "sampled" => [] }
        site["inuse_objects"] += objects
        site["inuse_bytes"] += bytes
        site["samples"] += samples
        site["sampled"].concat(sampled.first(candidates - site["sampled"].size))
      end
      all = by_site.values
      picked = wanted ? all.select { |site| named?(site["site"], wanted) } : all
      unmatched = all.max_by(5) { |site| site["inuse_bytes"] }.map { |site| site["site"] } if wanted && picked.empty?
      picked = picked.max_by(top) { |site| site["inuse_bytes"] }
      targets = {}.compare_by_identity
      picked.each_with_index do |site, index|
        site["candidates"] = site["sampled"].size
        site.delete("sampled").each { |object| targets[object] = index }
        site["inuse_objects"] = site["inuse_objects"].round
        site["inuse_bytes"] = site["inuse_bytes"].round
      end
      [picked, targets, unmatched]
    end

    # Whether `sites:` names this site: a String found in its name, or a
    # Regexp that matches it.
    def named?(name, wanted)
      wanted.any? { |w| w.is_a?(Regexp) ? w.match?(name) : name.include?(w) }
    end

    # The allocating method, at the line of the first frame with a file (a
    # method written in C is shown at its caller's line, as `top` does).
    def site_name(frames)
      label = frames.first&.first || "(no frames)"
      _, file, line = frames.find { |_, f, _| f }
      file ? "#{label} (#{file}:#{line})" : label
    end

    # Whether the gem allocated it: its first frame with a file is in the
    # gem's lib/ (a flusher), or the report's own code is on the stack
    # (loading it, and the json and objspace libraries it needs, for the
    # first report). Allocations of code a gem method yields to
    # (with_labels, RackLabels) have that code's file first, and stay.
    def own_site?(frames)
      _, file, = frames.find { |_, f, _| f }
      return true if file&.start_with?(GEM_LIB)

      frames.any? { |_, f, _| f&.start_with?(RETENTION_CODE) }
    end

    GEM_LIB = File.join(File.expand_path("..", __dir__), "memprofiler_pprof_rs")
    RETENTION_CODE = File.join(GEM_LIB, "retention") # (retention.rb, retention/, retention_report.rb)

    def frame_names(frames)
      frames.first(SITE_FRAMES).map { |label, file, line| file ? "#{label} (#{file}:#{line})" : label }
    end

    # An object's class, and the hops of its path (nil: no path found). A
    # path longer than MAX_HOPS keeps its first and last HOPS_KEPT_AT_ENDS
    # hops, with one "elided" hop saying how many are left out. Throws
    # :naming_time once the clock is past `name_by`.
    def object_entry(object, path, name_by)
      entry = { "class" => HopNames.class_name(object), "path" => nil }
      return entry unless path

      root = path.first
      # [what held the holder (the Root, first), holder, held].
      links = path.each_cons(3).to_a
      if links.size > MAX_HOPS
        elided = { "class" => "", "kind" => "elided", "ref" => (links.size - (2 * HOPS_KEPT_AT_ENDS)).to_s }
        hops = links.first(HOPS_KEPT_AT_ENDS).map { |link| hop(*link, name_by) } + [elided] +
               links.last(HOPS_KEPT_AT_ENDS).map { |link| hop(*link, name_by) }
      else
        hops = links.map { |link| hop(*link, name_by) }
      end
      entry.merge("root" => { "kind" => root.kind.to_s, "name" => root.name }, "path" => hops)
    end

    MAX_HOPS = 40
    HOPS_KEPT_AT_ENDS = 15

    def hop(previous, holder, held, name_by)
      throw(:naming_time) if clock > name_by
      kind, reference = HopNames.describe(holder, held, previous)
      hop = { "class" => HopNames.class_name(holder), "kind" => kind, "ref" => reference }
      hop["module"] = true if Module === holder # rubocop:disable Style/CaseEquality (BasicObjects)
      hop["thread"] = HopNames.thread_name(holder) if Thread === holder # rubocop:disable Style/CaseEquality
      hop
    end

    # The child's own memory: the pages it wrote (copied from the parent's
    # on write, or new), where Linux says (4.14 and later).
    def private_bytes
      rollup = File.read("/proc/self/smaps_rollup")
      kb = rollup[/^Private_Dirty:\s+(\d+) kB/, 1]
      kb && (Integer(kb) * 1024)
    rescue SystemCallError, IOError
      nil
    end

    # If the machine runs out of memory meanwhile, the kernel's OOM killer
    # takes this child before the server it was forked from (which is
    # larger, and so otherwise its likelier choice).
    def be_the_first_to_go
      File.write("/proc/self/oom_score_adj", "1000")
    rescue SystemCallError, IOError
      nil
    end

    def clock
      Process.clock_gettime(Process::CLOCK_MONOTONIC)
    end
  end
end
