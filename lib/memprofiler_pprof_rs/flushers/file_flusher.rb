# frozen_string_literal: true

module MemprofilerPprof
  # A BlockFlusher that writes every flush to a file named from `pattern`:
  #
  #   %{pid}       the writing process's id (a forked child uses its own)
  #   %{isotime}   UTC time of the write, ISO 8601 basic: 20261129T190840.123Z
  #   %{unixtime}  seconds since the epoch
  #   %{index}     0, 1, 2, ... per flusher (format widths work: %<index>05d,
  #                up to MAX_PATTERN_WIDTH)
  #
  # Directories are created as needed (0700); files are written atomically
  # and readable by their owner only (0600; `mode:` changes that), see
  # ProfileData#write. A relative pattern is resolved against the working
  # directory at construction, so a later chdir (Process.daemon does one)
  # does not move the files. With `keep: n` the flusher deletes the oldest
  # of the files it wrote itself beyond the newest n; it never touches
  # files it did not write. A name already taken (even by another process
  # at the same moment) gets "-1", "-2", ... before its extension instead of
  # being overwritten.
  class FileFlusher < BlockFlusher
    DEFAULT_PATTERN = "tmp/profiles/mem-%{pid}-%{isotime}.pprof"
    PATTERN_KEYS = %i[pid isotime unixtime index].freeze
    # Widths and precisions in a pattern at most: %<index>999999999d would
    # make each name a gigabyte.
    MAX_PATTERN_WIDTH = 64

    attr_reader :pattern, :keep, :mode
    # The newest file written, or nil.
    attr_reader :last_path

    def initialize(collector, pattern: DEFAULT_PATTERN, interval: 30, logger: nil, keep: nil,
                   mode: FileOutput::FILE_MODE, **options)
      @pattern = self.class.validate_pattern(pattern)
      @mode = FileOutput.validate_mode(mode)
      @keep = Validation.integer(keep, :keep, min: 1, nil_ok: true)
      @index = 0
      @written = []
      @last_path = nil
      super(collector, interval: interval, logger: logger, **options)
    end

    # Files this flusher wrote that still exist (with keep:, the newest
    # `keep`), oldest first.
    def written_paths
      @written.dup
    end

    # The file name the pattern gives for these values.
    def path_for(pid: Process.pid, time: Time.now, index: @index)
      format(@pattern, pid: pid, isotime: time.utc.strftime("%Y%m%dT%H%M%S.%LZ"),
                       unixtime: time.to_i, index: index)
    end

    # Checks a pattern; returns it with a relative directory made absolute.
    def self.validate_pattern(pattern)
      pattern = pattern.to_path if pattern.respond_to?(:to_path)
      Validation.instance(pattern, String, :pattern, expected: "a String or Pathname")
      # File names are bytes: a pattern whose bytes are not valid in its
      # encoding (say, read from a directory listing) is used as bytes.
      pattern = pattern.b unless pattern.valid_encoding?
      raise ArgumentError, "pattern must name a file, got #{pattern.inspect}" if pattern.empty? || pattern.end_with?("/")
      raise ArgumentError, "pattern must not contain a NUL byte, got #{pattern.inspect}" if pattern.include?("\0")

      # Only named references (and %%) are allowed: a bare %s would print
      # the whole hash of values into the file name.
      pattern.scan(/%(?:%|\{[^}]*\}|<[^>]*>[-+ 0#]*\d*(?:\.\d*)?|.?)/).each do |directive|
        next if directive == "%%" || directive.start_with?("%{")

        if directive.start_with?("%<")
          widths = directive[/>.*\z/].scan(/\d+/).map(&:to_i)
          next if widths.all? { |width| width <= MAX_PATTERN_WIDTH }

          raise ArgumentError, "bad pattern #{pattern.inspect}: #{directive.inspect} asks for a width " \
                               "or precision above #{MAX_PATTERN_WIDTH}"
        end
        raise ArgumentError, "bad pattern #{pattern.inspect}: #{directive.inspect} is not a named key " \
                             "(use %{pid}, %{isotime}, %{unixtime}, %{index}; %% for a literal %)"
      end
      sample = { pid: 1, isotime: "20000101T000000.000Z", unixtime: 0, index: 0 }
      begin
        format(pattern, sample)
      rescue KeyError => e
        raise ArgumentError, "unknown key %{#{e.key}} in pattern #{pattern.inspect}; " \
                             "known keys: #{PATTERN_KEYS.map { |k| "%{#{k}}" }.join(', ')}"
      rescue ArgumentError, TypeError => e
        raise ArgumentError, "bad pattern #{pattern.inspect}: #{e.message} " \
                             "(use %{pid}, %{isotime}, %{unixtime}, %{index}; %% for a literal %)"
      end
      return pattern if pattern.start_with?("/")

      # A `%` in the working directory's name is literal, not a format.
      directory = Dir.pwd.gsub("%", "%%")
      begin
        File.join(directory, pattern)
      rescue Encoding::CompatibilityError
        File.join(directory.b, pattern.b)
      end
    end

    # Writes one profile as a flush would (next name from the pattern, never
    # overwriting, keep: applied) without flushing; returns its path. For
    # code that flushes by other means, e.g. an on_flush of another flusher.
    def write(data)
      path = write_without_overwriting(data, path_for)
      @index += 1
      @last_path = path
      @written << path
      delete_old_files
      path
    end

    private

    def handle_flush(data)
      write(data)
      super
    end

    # Profile extensions a collision suffix goes in front of.
    EXTENSIONS = %w[.pprof .pb.gz .pb .gz].freeze

    # Writes to `path`, or to path-1, path-2, ... if taken (by an earlier
    # flush or by another process using the same pattern).
    def write_without_overwriting(data, path)
      extension = EXTENSIONS.find { |ext| path.end_with?(ext) } || ""
      stem = path.delete_suffix(extension)
      candidate = path
      (1..).each do |n|
        return data.write(candidate, overwrite: false, mode: @mode)
      rescue Errno::EEXIST
        raise if n > 10_000

        candidate = "#{stem}-#{n}#{extension}"
      end
    end

    def delete_old_files
      return unless @keep

      while @written.size > @keep
        old = @written.shift
        begin
          File.unlink(old)
        rescue Errno::ENOENT
          nil # already gone (rotated away by someone else): fine
        end
      end
    end

    # The parent keeps managing the files it wrote.
    def child_forked
      @written = []
      @last_path = nil
    end
  end
end
