# frozen_string_literal: true

require "json"

module MemprofilerPprof
  # What Collector#retention_report found: for each site (the allocating
  # method and line, with its estimated memory in use), a few of its
  # sampled objects and the shortest chain of references that keeps each
  # alive, from a GC root. Plain data (#to_h, JSON with #save and .load)
  # and a text rendering (#to_s), which `memprofiler_pprof_rs retainers`
  # prints from a saved report.
  class RetentionReport
    # A saved report larger than this is not one of ours.
    MAX_FILE_BYTES = 64 * 1024 * 1024
    ROOT_NAMES = {
      "constants" => nil,
      "global" => "%s (global)",
      "thread" => nil,
      "root" => "(GC root: %s)",
      "toplevel_local" => "the main script's local variable %s",
      "thread_local" => "Thread %s (fiber-local)",
      "thread_variable" => "Thread %s (thread variable)"
    }.freeze

    attr_reader :sites, :pid, :taken_at, :objects_reached, :stopped, :seconds, :fork_seconds,
                :child_private_bytes, :timeout, :max_objects, :max_memory_mb

    def self.from_h(data)
      new(data)
    end

    # Reads a report written by #save (or served by the Rack endpoint with
    # format=json); a file that is not one raises ArgumentError naming it.
    def self.load(path)
      raise ArgumentError, "#{path}: not a file" unless File.file?(path)

      text = File.open(path, "rb") { |file| file.read(MAX_FILE_BYTES + 1) } || ""
      raise ArgumentError, "#{path}: over #{MAX_FILE_BYTES} bytes, too large for a retention report" if
        text.bytesize > MAX_FILE_BYTES

      data = JSON.parse(text.force_encoding(Encoding::UTF_8))
      problem = problem_with(data)
      raise ArgumentError, "#{path}: not a retention report (#{problem})" if problem

      new(data)
    rescue JSON::ParserError, EncodingError
      raise ArgumentError, "#{path}: not a retention report (not JSON)"
    end

    NUMBERS = %w[pid objects_reached seconds fork_seconds child_private_bytes timeout max_objects
                 max_memory_mb].freeze
    TEXTS = %w[taken_at stopped].freeze
    SITE_NUMBERS = %w[inuse_bytes inuse_objects samples no_path candidates].freeze

    # What makes `data` not a report #to_s can print, or nil.
    def self.problem_with(data)
      return "no \"sites\" list" unless data.is_a?(Hash) && data["sites"].is_a?(Array)

      unless data["unmatched"].nil? || (data["unmatched"].is_a?(Array) && data["unmatched"].all?(String))
        return "\"unmatched\" is not a list of site names"
      end

      bad = NUMBERS.find { |key| !number?(data[key]) } || TEXTS.find { |key| !text?(data[key]) }
      return "\"#{bad}\" is not a number" if NUMBERS.include?(bad)
      return "\"#{bad}\" is not text" if bad

      data["sites"].each_with_index do |site, index|
        problem = site_problem(site)
        return "site #{index}: #{problem}" if problem
      end
      nil
    end

    def self.site_problem(site)
      return "not an object with a \"site\" name" unless site.is_a?(Hash) && site["site"].is_a?(String)

      bad = SITE_NUMBERS.find { |key| !number?(site[key]) }
      return "\"#{bad}\" is not a number" if bad
      return "\"objects\" is not a list" unless site.fetch("objects", []).is_a?(Array)
      return "an object is malformed" unless site.fetch("objects", []).all? { |object| well_formed_object?(object) }

      nil
    end

    def self.well_formed_object?(object)
      return false unless object.is_a?(Hash) && object["class"].is_a?(String)
      return true if object["path"].nil?

      root = object["root"] || {}
      object["path"].is_a?(Array) && root.is_a?(Hash) && text?(root["kind"]) && text?(root["name"]) &&
        object["path"].all? do |hop|
          hop.is_a?(Hash) && hop["kind"].is_a?(String) && %w[class ref thread].all? { |key| text?(hop[key]) }
        end
    end

    # A finite number or nil; text or nil.
    def self.number?(value)
      value.nil? || (value.is_a?(Numeric) && value.real? && value.finite? && value.abs < 1e18)
    end

    def self.text?(value)
      value.nil? || value.is_a?(String)
    end

    def initialize(data)
      @data = data
      @sites = data.fetch("sites")
      @pid = data["pid"]
      @taken_at = data["taken_at"]
      @objects_reached = data["objects_reached"]
      @stopped = data["stopped"]
      @seconds = data["seconds"]
      @fork_seconds = data["fork_seconds"]
      @child_private_bytes = data["child_private_bytes"]
      @timeout = data["timeout"]
      @max_objects = data["max_objects"]
      @max_memory_mb = data["max_memory_mb"]
    end

    # Whether the walk stopped at its time, object or memory bound before every
    # object's path was found: an object shown without one may have one.
    def partial?
      !@stopped.nil?
    end

    def to_h
      @data
    end

    def to_json(*args)
      @data.to_json(*args)
    end

    def save(path)
      File.write(path, JSON.pretty_generate(@data))
      path
    end

    # [[site, [the text of each object's path, ...]], ...], for a flame
    # graph's "What holds it" (Profile#flamegraph(retainers:)).
    def flame_graph_sites
      @sites.map { |site| [clean(site["site"]), Array(site["objects"]).map { |object| clean(object_line(object)) }] }
    end

    def to_s
      lines = [headline]
      lines << partial_note if partial?
      lines << empty_note if @sites.empty?
      @sites.each_with_index do |site, index|
        lines << ""
        lines << "#{index + 1}. #{site['site']}: ~#{bytes(site['inuse_bytes'])} in use, " \
                 "~#{count(site['inuse_objects'])} objects#{spread(site['samples'])}"
        objects = Array(site["objects"])
        lines << "   (its sampled objects are Ruby's internal objects: nothing to show a path to)" if objects.empty?
        objects.each { |object| lines << "   #{object_line(object)}" }
        lines << "   #{no_path_note(site)}" if site["no_path"].to_i.positive?
      end
      "#{clean(lines.join("\n"))}\n"
    end

    # "Foo::CACHE (constant) -> Hash[\"key\"] -> Array[17] -> String" (nil
    # when no path was found)
    def self.path_text(object)
      root = object["root"] || {}
      hops = object["path"]
      parts = [] # [kind, text]
      format = ROOT_NAMES[root["kind"]]
      parts << ["root", Kernel.format(format, root["name"])] if format
      return nil unless hops

      hops.each_with_index do |hop, index|
        # A local of the main script is a root of its own: how a thread's
        # stack or a Binding holds it says nothing more.
        parts.clear if hop["kind"] == "toplevel_local"
        text = hop_text(hop, hops[index + 1])
        parts << [hop["kind"], text] if text
      end
      parts << ["target", object["class"]]
      parts.map(&:last).join(" -> ")
    end

    def self.hop_text(hop, following)
      holder = hop["class"]
      ref = hop["ref"]
      case hop["kind"]
      when "constant"
        # A module held by a constant needs no line of its own: its name says it.
        return nil if following && following["module"] && following["class"] == qualified(holder, ref)

        "#{qualified(holder, ref)} (constant)"
      when "class_ivar" then "#{holder}.#{ref} (class instance variable)"
      when "class_var" then "#{holder}#{ref} (class variable)"
      when "ivar" then "#{holder}##{ref}"
      when "hash_value", "index" then "#{holder}[#{ref}]"
      when "hash_key" then "#{holder} (key #{ref})"
      when "member" then "#{holder}.#{ref}"
      when "captured" then "captured variable #{ref}"
      when "thread_local" then "Thread #{thread_of(hop)}[#{ref}] (fiber-local)"
      when "thread_variable" then "Thread #{thread_of(hop)} thread_variable #{ref}"
      when "stack" then "Thread #{ref} (a local variable, argument or self on its stack)"
      when "toplevel_local" then "the main script's local variable #{ref}"
      when "singleton_class" then nil # (the singleton class's own name says whose it is)
      when "method_entry" then "#{holder} (a method's definition)"
      when "block" then "Proc (block at #{ref || '?'})"
      when "internal"
        # (A method's definition holds its block through one: nothing to add.)
        following && following["kind"] == "block" ? nil : "(Ruby internal: #{ref})"
      when "elided" then "... #{ref} more hops ..."
      else "#{holder} (a reference Ruby does not name)"
      end
    end

    def self.qualified(holder, ref)
      holder == "Object" ? ref : "#{holder}::#{ref}"
    end

    def self.thread_of(hop)
      hop["thread"] || "?"
    end

    private

    # Names come from the process's objects: no control character of theirs
    # reaches a terminal (a newline stays).
    def clean(text)
      text.scrub.gsub(/[\x00-\x09\x0B-\x1F\x7F]/, "?")
    end

    # How sure a site's estimates are: from how many samples, and their
    # relative standard error as counts of sampled objects have it
    # (1/sqrt(n)).
    def spread(samples)
      return "" unless samples.is_a?(Integer) && samples.positive?

      " (#{count(samples)} sample#{'s' unless samples == 1}, ±#{format('%.0f', 100 / Math.sqrt(samples))}%)"
    end

    def no_path_note(site)
      "(#{site['no_path']} of the #{site['candidates']} objects sampled here that the walk looked for have no path " \
        "from a root: garbage not yet collected (gc: true, or ?gc=1, collects it first), or held only by another " \
        "thread's frames)"
    end

    def empty_note
      unmatched = @data["unmatched"]
      return "No sampled object is alive: nothing to report." unless unmatched.is_a?(Array)

      "No site matches the sites asked for. The biggest sites: #{unmatched.join('; ')}"
    end

    def headline
      parts = ["Retention paths of pid #{@pid}, #{@taken_at}"]
      parts << "#{count(@objects_reached)} objects reached in #{format('%.1f', @seconds)} s" if @objects_reached && @seconds
      parts << "the fork paused the process #{format('%.0f', @fork_seconds * 1000)} ms" if @fork_seconds
      parts << "the walk's process wrote #{bytes(@child_private_bytes)} of memory" if @child_private_bytes
      parts.join("; ")
    end

    def partial_note
      bound = case @stopped
              when "time" then "its time bound (timeout: #{@timeout} s)"
              when "memory" then "its memory bound (max_memory_mb: #{@max_memory_mb})"
              else "max_objects (#{count(@max_objects)})"
              end
      "PARTIAL: the walk stopped at #{bound}; an object shown with no path may still have one."
    end

    def object_line(object)
      return "#{object['class']}: no path from a root found#{partial? ? ' (the walk was cut short)' : ''}" unless
        object["path"]

      "#{object['class']}: #{self.class.path_text(object)}"
    end

    def bytes(value)
      return "?" unless value

      units = %w[B KB MB GB TB]
      size = value.to_f
      unit = 0
      while size >= 1024 && unit < units.size - 1
        size /= 1024
        unit += 1
      end
      unit.zero? ? "#{size.round} B" : format("%.1f %s", size, units[unit])
    end

    def count(value)
      value.to_i.to_s.reverse.scan(/\d{1,3}/).join(",").reverse
    end
  end
end
