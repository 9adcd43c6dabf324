# frozen_string_literal: true

require "optparse"
require_relative "error"
require_relative "readers/grouping"

module MemprofilerPprof
  # The `memprofiler_pprof_rs` executable: answers "what uses memory?" and
  # "what grew?" from pprof files, with no Go installed. Every failure is
  # one line on stderr and exit status 1 (2 for a usage mistake); never a
  # stack trace (MEMPROFILER_PPROF_RS_DEBUG=1 adds one for bug reports).
  class CLI
    PROGRAM = "memprofiler_pprof_rs"
    SAMPLE_INDEXES = %w[inuse_space inuse_objects alloc_space alloc_objects].freeze

    # A mistake in how the command was called: usage error, exit 2.
    class UsageError < StandardError
      include Error
    end

    # Profile::DEFAULT_MEMORY_LIMIT in MB (`--help` runs without the
    # extension, which defines Profile).
    DEFAULT_MEMORY_LIMIT_MB = 2048

    COMMANDS = {
      "top" => "the biggest users of memory, like go tool pprof -top",
      "diff" => "what grew between profiles of one process (leak hunting)",
      "flamegraph" => "an interactive HTML flame graph (or a static SVG)",
      "merge" => "combine profiles from many processes into one",
      "retainers" => "what holds memory alive, from a saved retention report"
    }.freeze

    HELP = <<~TEXT.freeze
      usage: #{PROGRAM} COMMAND [options] FILES...

      Reads pprof profiles (from this gem, or any tool writing pprof) without Go.

      Commands:
      #{COMMANDS.map { |name, what| format('  %-11s %s', name, what) }.join("\n")}

      Examples:
        #{PROGRAM} top tmp/profiles/heap-1234-9.pprof
        #{PROGRAM} top heap.pprof --by gem --sample-index alloc_space
        #{PROGRAM} diff heap-1234-1.pprof heap-1234-9.pprof
        #{PROGRAM} diff tmp/profiles/heap-1234-*.pprof
        #{PROGRAM} flamegraph heap.pprof -o heap.html
        #{PROGRAM} merge tmp/profiles/*.pprof -o all.pprof
        #{PROGRAM} retainers retainers.json

      Run `#{PROGRAM} COMMAND --help` for a command's options.
    TEXT

    def initialize(stdout: $stdout, stderr: $stderr)
      @stdout = stdout
      @stderr = stderr
    end

    # Runs one command line; returns the exit status.
    def run(argv)
      argv = argv.dup
      command = argv.shift
      case command
      when nil
        @stderr.print(HELP)
        2
      when "-h", "--help", "help"
        topic = argv.first
        if topic && COMMANDS.key?(topic)
          @stdout.print(parser_for(topic, {}).help)
        else
          @stdout.print(HELP)
        end
        0
      when "-v", "--version"
        load_library
        @stdout.puts("#{PROGRAM} #{MemprofilerPprof::VERSION}")
        0
      else
        unless COMMANDS.key?(command)
          raise UsageError, "unknown command #{command.inspect} (commands: #{COMMANDS.keys.join(', ')})"
        end

        status = dispatch(command, argv)
        # Buffered output fails here, not at exit where the error would be
        # lost (a full disk, a closed stdout): it must change the status.
        @stdout.flush
        status
      end
    rescue UsageError, OptionParser::ParseError => e
      @stderr.puts("#{PROGRAM}: #{e.message}")
      @stderr.puts("Run `#{PROGRAM} #{COMMANDS.key?(command) ? "#{command} " : ''}--help` for usage.")
      2
    rescue Errno::EPIPE
      0 # output piped into `head`, which stopped reading
    rescue Interrupt
      130
    rescue ProfileFormatError, SystemCallError, ArgumentError, TypeError => e
      fail_with(e.message, e)
    rescue StandardError, ScriptError => e
      fail_with("internal error: #{e.class}: #{e.message} (please report it; " \
                "MEMPROFILER_PPROF_RS_DEBUG=1 shows where)", e)
    end

    private

    def fail_with(message, error)
      @stderr.puts("#{PROGRAM}: #{message}")
      @stderr.puts(error.full_message(highlight: false)) if ENV["MEMPROFILER_PPROF_RS_DEBUG"] == "1"
      1
    end

    # The extension is loaded only once a command needs it, so `--help`
    # works even where the native build is missing.
    def load_library
      require_relative "../memprofiler_pprof_rs"
    end

    def dispatch(command, argv)
      options = {}
      files = nil
      # `COMMAND --help` prints and stops parsing: exit 0 without running.
      catch(:exit_now) { files = parser_for(command, options).parse(argv) } or return 0
      load_library
      Profile.memory_limit = options[:memory_limit] if options[:memory_limit]
      send(command, files, options)
    end

    def parser_for(command, options)
      OptionParser.new do |opts|
        opts.program_name = PROGRAM
        send(:"#{command}_options", opts, options)
        memory_limit_option(opts, options)
        opts.separator("")
        opts.on("-h", "--help", "this help") do
          @stdout.print(opts.help)
          throw :exit_now
        end
      end
    end

    def sample_index_option(opts, options, default_text)
      opts.on("-i", "--sample-index TYPE",
              "#{SAMPLE_INDEXES.join(', ')} (or any sample type of the profile); #{default_text}") do |value|
        options[:sample_index] = value
      end
    end

    def memory_limit_option(opts, options)
      opts.on("--memory-limit MB", OptionParser::DecimalInteger,
              "memory the profiles read may take together (default #{DEFAULT_MEMORY_LIMIT_MB})") do |value|
        raise UsageError, "--memory-limit must be from 1 to 1000000000 (MB), got #{value}" unless (1..1_000_000_000).cover?(value)

        options[:memory_limit] = value << 20
      end
    end

    def limit_option(opts, options, default)
      opts.on("-n", "--limit N", Integer, "rows to show (default #{default}; 0 shows all)") do |value|
        raise UsageError, "--limit must be 0 or more, got #{value}" if value.negative?
        raise UsageError, "--limit must be at most 1000000000 (0 shows all), got #{value}" if value > 1_000_000_000

        options[:limit] = value
      end
    end

    def retainers_options(opts, _options)
      opts.banner = "usage: #{PROGRAM} retainers FILE"
      opts.separator("")
      opts.separator("Prints a retention report: for the sites with the most memory in use, the chain of")
      opts.separator("references from a GC root that keeps each of a few sampled objects alive. FILE is")
      opts.separator("written by RetentionReport#save (collector.retention_report.save(\"r.json\")) or served")
      opts.separator("by the Rack endpoint's /debug/pprof/retainers?format=json.")
    end

    def retainers(files, _options)
      raise UsageError, "retainers needs one FILE, got #{files.size}" unless files.size == 1

      @stdout.print(RetentionReport.load(files.first).to_s)
      0
    end

    def top_options(opts, options)
      opts.banner = "usage: #{PROGRAM} top FILE [options]"
      opts.separator(<<~TEXT)

        The biggest users of memory in one profile: flat is what a row allocated
        itself (as the leaf of the stack), cum includes what it called.

        Examples:
          #{PROGRAM} top heap.pprof                          # in-use space by function
          #{PROGRAM} top heap.pprof --by line -n 10          # the allocating lines
          #{PROGRAM} top heap.pprof --by gem -i alloc_space  # which gems allocate most
          #{PROGRAM} top heap.pprof --by class -i inuse_objects
          #{PROGRAM} top heap.pprof --by endpoint            # by a with_labels label
          #{PROGRAM} top heap.pprof --focus 'PageCache'      # only stacks through a frame

        Options:
      TEXT
      sample_index_option(opts, options, "default: the profile's default (inuse_space)")
      opts.on("-b", "--by WHAT", "group by function (default), line, class, file, gem,",
              "or the values of a label (endpoint; label:file for a label named file)") do |value|
        raise OptionParser::InvalidArgument, value unless Grouping.valid?(value)

        options[:by] = value
      end
      limit_option(opts, options, 20)
      opts.on("-f", "--focus REGEX", "only samples with a frame whose name or file matches",
              "(Ruby syntax, matched in linear time: no backreferences or look-around)") do |value|
        options[:focus] = value
      end
      opts.on("--cum", "sort by cum instead of flat") { options[:cum] = true }
    end

    def diff_options(opts, options)
      opts.banner = "usage: #{PROGRAM} diff BASE NEW [NEWER...] [options]"
      opts.separator(<<~TEXT)

        What grew between profiles of the same process, oldest first: by
        allocation site (whole stack), by allocating method and by class, with
        a verdict line. With three or more profiles it also says in how many
        intervals each row grew: a leak grows in every one.

        Examples:
          #{PROGRAM} diff heap-1234-1.pprof heap-1234-9.pprof
          #{PROGRAM} diff tmp/profiles/heap-1234-*.pprof     # sorted oldest first
          #{PROGRAM} diff old.pprof new.pprof -i inuse_objects -n 20
          #{PROGRAM} diff tmp/profiles/heap-1234-*.pprof --by endpoint  # which request's objects grew

        Options:
      TEXT
      sample_index_option(opts, options, "default: inuse_space")
      limit_option(opts, options, 10)
      opts.on("-b", "--by LABEL", "also growth by the values of a label (endpoint, job: see with_labels)") do |value|
        raise OptionParser::InvalidArgument, value unless value.match?(Grouping::LABEL)

        options[:by] = value
      end
      opts.on("--keep-order", "compare in the order given (default: sort by the time in each profile)") do
        options[:keep_order] = true
      end
      opts.on("--across-processes", "compare profiles of different processes as one series (default: each " \
                                    "process's profiles on their own, as a preforking server writes them)") do
        options[:across_processes] = true
      end
    end

    def flamegraph_options(opts, options)
      opts.banner = "usage: #{PROGRAM} flamegraph FILE -o OUTPUT [options]"
      opts.separator(<<~TEXT)

        A flame graph of one profile. HTML (default): a single self-contained
        page, no network access: click a frame to zoom, hover for values,
        search box, and a table of functions. SVG: a static picture.

        Examples:
          #{PROGRAM} flamegraph heap.pprof -o heap.html
          #{PROGRAM} flamegraph heap.pprof -o allocs.html -i alloc_space
          #{PROGRAM} flamegraph heap.pprof -o heap.svg --format svg
          #{PROGRAM} flamegraph heap.pprof -o heap.html --retainers retainers.json

        Options:
      TEXT
      opts.on("-o", "--output FILE", "where to write (required; - for stdout)") { |value| options[:output] = value }
      opts.on("--format FORMAT", %w[html svg], "html (default) or svg") { |value| options[:format] = value }
      opts.on("--retainers FILE", "a retention report of the same process (RetentionReport#save): the page shows " \
                                  "what holds the clicked frame's memory") { |value| options[:retainers] = value }
      sample_index_option(opts, options, "default: the profile's default (inuse_space)")
    end

    def merge_options(opts, options)
      opts.banner = "usage: #{PROGRAM} merge FILES... -o OUTPUT [options]"
      opts.separator(<<~TEXT)

        Combines profiles of the same kind (say, from every worker of a server)
        into one: samples with the same stack and labels are added up. The
        result is a gzipped pprof any pprof tool reads.

        Examples:
          #{PROGRAM} merge tmp/profiles/heap-*.pprof -o all.pprof
          #{PROGRAM} merge web-*.pprof worker-*.pprof -o fleet.pprof
          #{PROGRAM} top all.pprof

        Options:
      TEXT
      opts.on("-o", "--output FILE", "where to write (required)") { |value| options[:output] = value }
    end

    def read_profiles(files, command, minimum:)
      check_file_list(files, command, minimum: minimum)
      files.map { |file| [file == "-" ? "(standard input)" : file, read_profile(file)] }
    end

    def read_profile(file)
      file == "-" ? stdin_profile : Profile.read(file)
    end

    def check_file_list(files, command, minimum:)
      if files.size < minimum
        raise UsageError, "#{command} needs #{minimum == 1 ? 'a profile file' : "at least #{minimum} profile files"}"
      end

      duplicate = files.tally.find { |_, count| count > 1 }&.first
      raise UsageError, "#{duplicate} is given twice (it would count twice)" if duplicate

      refuse_same_file_twice(files)
    end

    # Merges any number of files within Profile.memory_limit: each is read,
    # added to the merger and let go, so the merge holds its result and one
    # file at a time, and takes time in proportion to their total size.
    def merge_within_memory_limit(files)
      check_file_list(files, "merge", minimum: 1)
      merger = Profile::Merger.new
      first = nil
      files.each do |file|
        profile = read_profile(file)
        first ||= [file, profile.sample_types.sort]
        refuse_other_kind(file, profile, *first)
        merge_step(file) { merger << profile }
      end
      merge_step(files.last) { merger.finish }
    end

    # Checked as each file is read: the merge's own message would count
    # profiles from 1 in each step, not name the file.
    def refuse_other_kind(file, profile, first_file, first_types)
      return if profile.sample_types.sort == first_types

      describe = ->(types) { types.map { |type, unit| "#{type}/#{unit}" }.join(", ") }
      raise ArgumentError, "#{file} has sample types #{describe[profile.sample_types]} but #{first_file} has " \
                        "#{describe[first_types]}: only profiles of one kind can be merged"
    end

    def merge_step(file)
      yield
    rescue ArgumentError => e
      raise ArgumentError, "#{file}: #{e.message}"
    rescue ProfileMemoryLimitError => e
      raise ProfileMemoryLimitError, "merging the profiles up to #{file}: #{e.message} (--memory-limit raises the limit)"
    end

    # One file under two names (./a.pprof and a.pprof, a symlink, a hard
    # link: the same device and inode) is refused like the same name twice:
    # diff would compare a profile with itself and merge count it twice.
    # Refused rather than counted once: dropping a name the user gave
    # would hide the mistake (a glob that also matched the base, say), and
    # leave `diff` one profile short or in another order than asked for.
    # Files that cannot be read are left to Profile.read to report.
    def refuse_same_file_twice(files)
      seen = {}
      files.each do |file|
        # Standard input redirected from a file (`- < a.pprof`) is that file.
        stat = begin
          file == "-" ? $stdin.stat : File.stat(file)
        rescue SystemCallError
          next
        end
        next if file == "-" && !stat.file?

        first = seen[[stat.dev, stat.ino]] ||= file
        next if first.equal?(file)

        name = ->(f) { f == "-" ? "standard input" : f }
        raise UsageError, "#{name[file]} is #{name[first]} again (the same file; it would count twice)"
      end
    end

    # "-" reads the profile from standard input (e.g. piped from curl).
    def stdin_profile
      Profile.parse(Profile.read_limited($stdin))
    rescue ProfileFormatError => e
      raise e.class, "standard input: #{e.message}"
    end

    # Refuses to write over one of the profiles being read (flamegraph's -o
    # pointing at its input would replace a profile with a web page).
    def refuse_overwriting_input(output, files)
      return if output == "-" || !File.exist?(output)

      clobbered = files.find { |file| file != "-" && File.exist?(file) && File.identical?(file, output) }
      raise UsageError, "-o #{output} is the input profile #{clobbered}; write elsewhere" if clobbered
    end

    # --focus as the Regexp `top` matches; one it cannot take (not a
    # regular expression, or a backreference) is a usage mistake.
    def focus_option(value)
      value && Profile.focus_regexp(value)
    rescue ArgumentError => e
      raise UsageError, "--#{e.message}"
    end

    def top(files, options)
      raise UsageError, "top reads one profile; got #{files.size} files (merge them first)" if files.size > 1

      focus = focus_option(options[:focus])
      (file, profile), = read_profiles(files, "top", minimum: 1)
      report = profile.top(
        sample_index: options[:sample_index], by: options.fetch(:by, "function").to_sym,
        limit: options.fetch(:limit, 20), focus: focus, cum: options[:cum],
        base_dir: Dir.pwd, title: file
      )
      note_merged_processes(profile, @stdout)
      @stdout.print(report)
      0
    end

    def diff(files, options)
      loaded = read_profiles(files, "diff", minimum: 2)
      # Oldest first by the time recorded in each profile, so a shell glob's
      # order (heap-10 before heap-9) does not matter.
      unless options[:keep_order]
        loaded = loaded.each_with_index.sort_by { |(_, profile), index| [profile.time || Time.at(0), index] }.map(&:first)
      end
      groups = loaded.group_by { |(_, profile)| process_key(profile) }
      if groups.size > 1 && !options[:across_processes] && groups.values.any? { |g| g.size > 1 }
        diff_per_process(loaded.size, groups, options)
      else
        # (One profile of each process, as two requests to /debug/pprof/heap
        # that reached two workers: compared as asked, and said.)
        if groups.size > 1 && !options[:across_processes]
          @stdout.puts("Note: these #{loaded.size} profiles come from #{groups.size} processes, one each: " \
                       "compared as one series.")
        end
        @stdout.print(diff_report(loaded, options))
      end
      0
    end

    def diff_report(loaded, options)
      Profile.diff(loaded.map(&:last), sample_index: options[:sample_index], limit: options.fetch(:limit, 10),
                                       base_dir: Dir.pwd, titles: loaded.map(&:first), by: options[:by])
    end

    # What tells the profiles of one process from another's: the processes
    # each names (a merged profile names several; a profile from elsewhere
    # none).
    def process_key(profile)
      profile.processes.map { |process| [process.pid, process.started_at] }
    end

    # The profiles of a preforking server's master and workers (tmp/profiles/*.pprof)
    # are different heaps: one verdict per process, never one over them all.
    def diff_per_process(count, groups, options)
      @stdout.puts("These #{count} profiles come from #{groups.size} processes: each process's profiles are " \
                   "compared with each other (--across-processes compares them as one series).")
      groups.each do |_key, loaded|
        @stdout.puts
        describe = process_description(loaded.first.last)
        if loaded.size < 2
          @stdout.puts("== #{describe}: one profile (#{loaded.first.first}), nothing to compare it with ==")
        else
          @stdout.puts("== #{describe}: #{loaded.size} profiles ==")
          @stdout.print(diff_report(loaded, options))
        end
      end
    end

    def process_description(profile)
      processes = profile.processes
      case processes.size
      when 0 then "profiles that name no process"
      when 1 then processes.first.to_s
      else "a merge of #{processes.size} processes (#{processes.map { |p| "pid #{p.pid}" }.join(', ')})"
      end
    end

    # A one-line note when one profile holds several processes' values.
    def note_merged_processes(profile, output)
      processes = profile.processes
      return if processes.size < 2

      output.puts("note: this profile merges #{processes.size} processes' profiles " \
                  "(#{processes.map { |p| "pid #{p.pid}" }.join(', ')}): its values are their sums")
    end

    # A retention report is read beside a profile of the same process.
    def note_other_process(profile, retainers, output)
      pids = profile.processes.map(&:pid)
      return if pids.empty? || retainers.pid.nil? || pids.include?(retainers.pid)

      output.puts("note: the retention report is of pid #{retainers.pid}, the profile of " \
                  "#{pids.map { |pid| "pid #{pid}" }.join(', ')}: its paths may not be this process's")
    end

    def flamegraph(files, options)
      raise UsageError, "flamegraph reads one profile; got #{files.size} files (merge them first)" if files.size > 1

      output = options[:output] or raise UsageError, "flamegraph needs -o OUTPUT (e.g. -o heap.html)"
      refuse_overwriting_input(output, files)
      format = (options[:format] || (output.end_with?(".svg") ? "svg" : "html")).to_sym
      raise UsageError, "--retainers are shown on the HTML page only, not in an SVG" if options[:retainers] && format == :svg

      retainers = options[:retainers] && RetentionReport.load(options[:retainers])
      (file, profile), = read_profiles(files, "flamegraph", minimum: 1)
      document = profile.flamegraph(sample_index: options[:sample_index], format: format, title: File.basename(file),
                                    retainers: retainers)
      note_merged_processes(profile, @stderr)
      note_other_process(profile, retainers, @stderr) if retainers
      write_output(output, document)
      @stderr.puts("#{PROGRAM}: wrote #{output} (#{format}, #{document.bytesize} bytes)") unless output == "-"
      0
    end

    def merge(files, options)
      output = options[:output] or raise UsageError, "merge needs -o OUTPUT (e.g. -o all.pprof)"
      merged = merge_within_memory_limit(files)
      write_output(output, merged.to_pprof)
      @stderr.puts("#{PROGRAM}: merged #{files.size} profile#{'s' unless files.size == 1} " \
                   "(#{merged.samples_count} samples) into #{output}")
      0
    end

    # Writes whole or not at all, owner-only, never through a name another
    # user could have prepared (FileOutput.write); "-" writes to stdout.
    def write_output(path, data)
      if path == "-"
        @stdout.write(data)
        return
      end
      dir = File.dirname(path)
      raise Errno::ENOENT, "directory #{dir}" unless File.directory?(dir)

      FileOutput.write(path, data)
    end
  end
end
