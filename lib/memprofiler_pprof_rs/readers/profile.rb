# frozen_string_literal: true

require_relative "grouping"

module MemprofilerPprof
  # Raised when bytes are not a readable pprof profile (not pprof at all, a
  # truncated gzip, dangling references). The message says which.
  class ProfileFormatError < StandardError
    include Error
  end

  # Raised when reading, merging or writing a profile would take the
  # profiles read back past Profile.memory_limit, together. A
  # ProfileFormatError, so that one rescue covers every profile refused.
  class ProfileMemoryLimitError < ProfileFormatError; end

  # A pprof profile read back, from this gem or any other tool, and the
  # answers the `memprofiler_pprof_rs` executable prints. Decoding and
  # aggregation run in the native core, so multi-megabyte profiles are quick.
  #
  #   profile = MemprofilerPprof::Profile.read("tmp/profiles/heap-1.pprof")
  #   puts profile.top(sample_index: "inuse_space", by: :line, limit: 10)
  #   puts MemprofilerPprof::Profile.diff([old, new])
  #   File.write("heap.html", profile.flamegraph)
  class Profile
    GROUPINGS = Grouping::NAMES
    FLAMEGRAPH_FORMATS = %i[html svg].freeze
    # Files and streams larger than this are refused unread: a profile
    # decompresses to 1 GB at most, and a gzip of it is hardly bigger
    # (/dev/zero or an endless pipe must not fill the memory).
    MAX_READ_BYTES = (1 << 30) + (1 << 20)

    # The default of Profile.memory_limit.
    DEFAULT_MEMORY_LIMIT = 2 << 30

    private_class_method :_native_parse, :_native_gunzip, :_native_diff, :_native_merge, :_native_focus_error,
                         :_native_memory_limit, :_native_set_memory_limit, :_native_memory_held

    class << self
      # `data`: the bytes of a profile (gzipped or not), or a ProfileData.
      def parse(data)
        data = data.pprof_data if data.is_a?(ProfileData)
        Validation.instance(data, String, "profile data", expected: "a String or a ProfileData")

        result = within_memory_limit { _native_parse(data) }
        raise ProfileFormatError, result if result.is_a?(String)

        result
      end

      # The memory, in bytes, that the profiles read back in this process
      # (parsed, merged, and being written) may take together; what would
      # go past it raises ProfileMemoryLimitError before it is allocated.
      # Default 2 GB. Estimates count the decoded structures at their
      # largest, so real use is lower.
      def memory_limit
        _native_memory_limit
      end

      def memory_limit=(bytes)
        bytes = Validation.integer(bytes, :memory_limit, min: 1 << 20, max: 1 << 50,
                                                         expected: "a number of bytes from 1 MB (1048576) to 1 PB")
        _native_set_memory_limit(bytes)
      end

      # Bytes of the limit held now (by profiles not yet garbage collected).
      def memory_held
        _native_memory_held
      end

      # `data` gunzipped (returned as is if it is not gzip), in Rust with the
      # GVL held. Ruby 3.1's zlib resizes its output String with the GVL
      # released, so a fork from another thread at that moment corrupts the
      # child's heap (repro/zlib_fork_crash.rb); this gem never uses it.
      def gunzip(data)
        Validation.instance(data, String, :data)

        result = retried_after_gc { _native_gunzip(data) }
        raise (result[1] ? ProfileMemoryLimitError : ProfileFormatError), result.first if result.is_a?(Array)

        result
      end

      # Reads the file at `path`; a bad file raises ProfileFormatError naming it.
      def read(path)
        path = Validation.path(path, :path)

        File.open(path, "rb") { |file| parse(read_limited(file)) }
      rescue ProfileFormatError => e
        raise e.class, "#{path}: #{e.message}"
      end

      # At most MAX_READ_BYTES of `io` (a file, a pipe, standard input);
      # ProfileFormatError if there is more.
      def read_limited(io)
        data = io.binmode.read(MAX_READ_BYTES + 1) || "".b
        if data.bytesize > MAX_READ_BYTES
          limit = MAX_READ_BYTES >= 1 << 20 ? "#{MAX_READ_BYTES >> 20} MB" : "#{MAX_READ_BYTES} bytes"
          raise ProfileFormatError, "more than #{limit}; no profile is that big, refusing to read it"
        end

        data
      end

      # One profile from many (e.g. every worker of a server): samples with
      # the same stack and labels are added up.
      def merge(profiles)
        profiles = profile_list(profiles, "merge", minimum: 1)
        within_memory_limit { _native_merge(profiles) }
      end

      # What grew from the first profile to the last (oldest first): a report
      # by allocation site, allocating method and class, with a verdict line.
      # by: a label key (endpoint) adds growth by its values, and a verdict
      # line naming the value that grew most.
      def diff(profiles, sample_index: nil, limit: 10, base_dir: Dir.pwd, titles: nil, by: nil)
        profiles = profile_list(profiles, "diff", minimum: 2)
        titles ||= profiles.each_index.map { |i| "profile #{i + 1}" }
        expected = "an Array of #{profiles.size} Strings"
        Validation.instance(titles, Array, :titles, expected: expected)
        Validation.type_error!(:titles, expected, titles) unless titles.all?(String)
        Validation.value_error!(:titles, expected, titles) unless titles.size == profiles.size

        _native_diff(profiles, sample_index_name(sample_index), limit_value(limit), base_dir.to_s, titles,
                     label_key(by))
      end

      # Validation shared with the instance methods.
      def sample_index_name(value)
        return nil if value.nil?

        Validation.instance(value, [String, Symbol], :sample_index, expected: "a String or Symbol").to_s
      end

      # A label key for diff's by: (nil for none).
      def label_key(by)
        return nil if by.nil?

        Validation.type_error!(:by, "a Symbol or String", by) unless by.is_a?(Symbol) || by.is_a?(String)
        Validation.value_error!(:by, "a label key (endpoint, label:file)", by) unless by.to_s.match?(Grouping::LABEL)
        by.to_s.delete_prefix("label:")
      end

      def limit_value(value)
        Validation.integer(value, :limit, min: 0, max: 1_000_000_000,
                                          expected: "an Integer >= 0 (0 shows every row) and <= 1000000000")
      end

      # `focus` (a Regexp, or a String read as one) as the Regexp `top`
      # matches. ArgumentError, naming it, if it is not one or uses what the
      # linear-time matcher cannot do (backreferences, look-around).
      def focus_regexp(value)
        regexp, source = focus_pattern(value)
        reason = _native_focus_error(source, regexp.options)
        raise ArgumentError, "focus #{Validation.show(regexp)} #{reason}" if reason

        regexp
      end

      # [the Regexp, its source in UTF-8]. Ruby reads the syntax (and a
      # String's mistakes are its errors); the native side matches it.
      def focus_pattern(value)
        regexp = case value
                 when Regexp then value
                 when String then Regexp.new(value)
                 else Validation.type_error!(:focus, "a Regexp or String", value)
                 end
        source = regexp.source
        source = source.encode(Encoding::UTF_8) unless source.encoding == Encoding::BINARY
        [regexp, source]
      rescue RegexpError => e
        # (Ruby's message ends with the whole pattern.)
        detail = e.message.size > Validation::MAX_SHOWN ? "#{e.message[0, Validation::MAX_SHOWN]}..." : e.message
        raise ArgumentError, "focus #{Validation.show(value)} is not a valid regular expression: #{detail}"
      rescue EncodingError => e
        raise ArgumentError, "focus #{Validation.show(regexp)} cannot be read as UTF-8: #{e.message}"
      end

      private

      # Runs a native call that returns an Array when the memory limit
      # refused it: `[reason]`, or `[reason, may_retry]`. Profiles no longer
      # referenced still hold their share until the GC frees them: a refusal
      # that may be retried gets one full GC and one more try.
      def retried_after_gc
        result = yield
        return result unless result.is_a?(Array) && result.fetch(1, true) && memory_held.positive?

        GC.start
        yield
      end

      # `retried_after_gc`, raising ProfileMemoryLimitError if still refused.
      def within_memory_limit(&call)
        result = retried_after_gc(&call)
        raise ProfileMemoryLimitError, result.first if result.is_a?(Array)

        result
      end

      def profile_list(profiles, what, minimum:)
        Validation.instance(profiles, Array, "#{what}'s argument", expected: "an Array of Profiles")
        bad = profiles.find { |p| !p.is_a?(Profile) }
        raise TypeError, "#{what} needs Profiles, got #{Validation.show(bad)}" if bad
        if profiles.size < minimum
          raise ArgumentError, "#{what} needs at least #{minimum} profile#{'s' if minimum > 1}, got #{profiles.size}"
        end

        profiles
      end
    end

    # [[type, unit], ...], e.g. [["alloc_objects", "count"], ...]
    def sample_types
      _native_sample_types
    end

    def sample_type_names
      sample_types.map(&:first)
    end

    # The sample type views use when none is given.
    def default_sample_type
      _native_default_sample_type
    end

    def samples_count
      summary[0]
    end

    # When the profile was taken (nil if it does not say).
    def time
      nanos = summary[1]
      nanos.zero? ? nil : Time.at(nanos / 1_000_000_000r).utc
    end

    # Seconds the profile covers (nil if it does not say).
    def duration
      nanos = summary[2]
      nanos.zero? ? nil : nanos / 1e9
    end

    # Each distinct comment once, in order.
    def comments
      @comments ||= _native_comments.freeze
    end

    # How sure the profile is of its leading functions (those a reader
    # looks at first: 20 by each value, flat and cum), as this gem's
    # flushes give it: { "Foo#bar" => { alloc_objects: { flat: 0.031, cum:
    # 0.02 }, ... } }, each a relative standard error (nil: the function has
    # no such value). Empty for a profile that gives none (another tool's,
    # or a merge of several).
    def function_errors
      @function_errors ||= _native_function_errors.to_h do |name, numbers|
        values = SAMPLE_VALUE_NAMES.each_with_index.to_h do |type, i|
          [type, { flat: numbers[2 * i], cum: numbers[(2 * i) + 1] }.freeze]
        end
        [name, values.freeze]
      end.freeze
    end

    # The four values #function_errors gives, in order.
    SAMPLE_VALUE_NAMES = %i[alloc_objects alloc_space inuse_objects inuse_space].freeze

    # A process a profile names (see #processes). started_at: its start,
    # or for a forked child its fork; with the pid, what tells it from a
    # later process that got the same pid.
    ProcessInfo = Struct.new(:pid, :started_at, :forked_from, :program) do
      # "pid 1234 (puma: cluster worker 0), forked from pid 1200"
      def to_s
        text = "pid #{pid}"
        text += " (#{program})" unless program.empty?
        text += ", forked from pid #{forked_from}" if forked_from
        text
      end
    end

    # The processes this profile's values come from, as the gem's flushes
    # record them: one ProcessInfo for a flushed profile, several for a
    # merge of several processes' profiles, none for a profile written
    # elsewhere.
    def processes
      @processes ||= _native_processes.map do |pid, started_millis, forked_from, program|
        ProcessInfo.new(pid, Time.at(started_millis / 1000r).utc, forked_from, program).freeze
      end.freeze
    end

    # {"alloc_objects" => 1234, ...}: each sample type summed over samples.
    def totals
      sample_type_names.zip(_native_totals).to_h
    end

    # A table like `go tool pprof -top`: flat (as the leaf), cum (anywhere on
    # the stack). by: :function, :line, :class, :file or :gem. focus: a
    # Regexp (or String) matched against frame names and files, in linear
    # time (no backreferences or look-around); only samples through a
    # matching frame count.
    def top(sample_index: nil, by: :function, limit: 20, focus: nil, cum: false, base_dir: Dir.pwd, title: "")
      by = grouping(by)
      focus_frames, focus_description = focus_for(focus)
      _native_top(self.class.sample_index_name(sample_index), by, self.class.limit_value(limit),
                  focus_frames, focus_description, cum ? true : false, base_dir.to_s, title.to_s)
    end

    # A self-contained flame graph: an HTML page (interactive, no network
    # access) or a static SVG.
    # With `retainers:` (a RetentionReport of the same process), the HTML
    # page also shows what holds the memory of the clicked frame's sites.
    def flamegraph(sample_index: nil, format: :html, title: "", retainers: nil)
      format = format.to_sym if format.is_a?(String)
      Validation.one_of(format, FLAMEGRAPH_FORMATS, :format, listed: FLAMEGRAPH_FORMATS.join(", "))
      unless retainers.nil? || retainers.is_a?(MemprofilerPprof::RetentionReport)
        raise TypeError, "retainers must be a MemprofilerPprof::RetentionReport or nil, got #{retainers.class}"
      end
      raise ArgumentError, "retainers are shown on the HTML page only, not in an SVG" if retainers && format == :svg

      _native_flamegraph(self.class.sample_index_name(sample_index), format.to_s, title.to_s,
                         retainers ? retainers.flame_graph_sites : [])
    end

    # The profile as gzipped pprof bytes; optionally with another default
    # sample type (what `go tool pprof` shows first).
    def to_pprof(default_sample_type: nil)
      default = self.class.sample_index_name(default_sample_type)
      self.class.send(:within_memory_limit) { _native_to_pprof(default) }
    end

    def inspect
      "#<#{self.class.name} #{samples_count} samples of #{sample_type_names.join(', ')}>"
    end
    alias to_s inspect

    private

    def summary
      @summary ||= _native_summary.freeze
    end

    # A grouping's name, or a label key (`endpoint`; `label:file` for a
    # key named like a grouping) whose values make the rows.
    def grouping(by)
      Validation.type_error!(:by, "a Symbol or String", by) unless by.is_a?(Symbol) || by.is_a?(String)
      return by.to_s if Grouping.valid?(by)

      Validation.value_error!(:by, "one of #{GROUPINGS.join(', ')} or a label key (endpoint, label:file)", by)
    end

    # The frames `focus` matches (by index) and how the report shows it.
    # Matched in Rust, in time linear in the names: a profile is untrusted,
    # and Ruby's Regexp backtracks (a 1.6 KB profile with a 1,000,000
    # character name kept /Order.*save/ busy for minutes, holding the GVL).
    def focus_for(focus)
      return [nil, ""] if focus.nil?

      regexp, source = self.class.focus_pattern(focus)
      frames = _native_focus_frames(source, regexp.options)
      raise ArgumentError, "focus #{Validation.show(regexp)} #{frames}" if frames.is_a?(String)

      [frames, regexp.inspect]
    end

    # Merges profiles one at a time. Each profile added may be let go at
    # once, so merging many files holds the result and one file at a time
    # (Profile.merge needs them all together), within Profile.memory_limit.
    #
    #   merger = MemprofilerPprof::Profile::Merger.new
    #   Dir["tmp/profiles/*.pprof"].each { |f| merger << MemprofilerPprof::Profile.read(f) }
    #   merged = merger.finish
    #
    # Profiles of other sample types raise ArgumentError. Past the memory
    # limit, ProfileMemoryLimitError: nothing of that profile was added,
    # unless the merged result grew past what could be read back, which
    # every later call then raises too. A merger finishes once. Threads may
    # share one: their calls take turns.
    class Merger
      def initialize
        super
        @users = 0
        @users_pid = Process.pid
      end

      def add(profile)
        raise TypeError, "Merger#add needs a Profile, got #{Validation.show(profile)}" unless profile.is_a?(Profile)

        exclusive { Profile.send(:within_memory_limit) { _native_add(profile) } }
        self
      end
      alias << add

      # The merged profile. The merger is used up.
      def finish
        exclusive { Profile.send(:within_memory_limit) { _native_finish(Profile) } }
      end

      # Profiles added so far.
      def size
        exclusive { _native_size }
      end

      def inspect
        "#<#{self.class.name} #{size} profiles>"
      rescue StateError
        "#<#{self.class.name} finished>"
      end
      alias to_s inspect

      private

      # The native calls run without the GVL, under the merger's lock. A
      # fork while another thread is in one would leave the child a lock
      # that nobody releases (found in review: the child hung, and
      # Thread#kill could not stop it), so the child refuses instead. The
      # count changes with the GVL held, as fork runs.
      def exclusive
        if @users.positive? && @users_pid != Process.pid
          raise "this merger was in use by another thread when the process forked; start a new one"
        end

        @users_pid = Process.pid
        @users += 1
        begin
          yield
        ensure
          @users -= 1
        end
      end
    end
  end
end
