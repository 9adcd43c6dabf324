# frozen_string_literal: true

module MemprofilerPprof
  # How the gem writes files (profiles, flame graphs, merged profiles):
  # whole or not at all, never through a name another user can prepare,
  # readable by their owner only unless asked otherwise. Profiles hold code
  # paths and class names.
  #
  # Core Ruby only (Dir.mkdir, Random.urandom), no fileutils or
  # securerandom: this file is loaded by every `require` of the gem, and
  # those two libraries cost more than half of it (callgrind, see
  # docs/api.md). A write may also be the first in a process and come from
  # a signal trap, where loading them on first use is not safe.
  module FileOutput
    # Files and directories the gem creates: owner only.
    FILE_MODE = 0o600
    DIRECTORY_MODE = 0o700

    module_function

    # Writes `data` to `path`: into a new temporary file in the same
    # directory (a random name, created exclusively, so a symlink or file
    # planted there is never written through), then renamed over `path`,
    # so a reader never sees half a file. With `overwrite: false` an
    # existing `path` is never replaced (Errno::EEXIST), even if another
    # process creates it at the same moment. The directory is created
    # (DIRECTORY_MODE) if missing; an existing one must belong to this
    # process's user or to root (see `check_directory`). Writes with
    # write(2) directly, never through Ruby's IO buffer: a fork (from another
    # thread) while data sat in that buffer would give the child a copy,
    # which its GC flushes into the shared file description, appending a
    # second copy to the file. Data over the process's file size limit is
    # refused before anything is written (see `check_file_size`). Returns
    # `path`.
    def write(path, data, mode: FILE_MODE, overwrite: true)
      check_file_size(path, data.bytesize)
      directory = File.dirname(path)
      make_directories(directory) unless File.directory?(directory)
      check_directory(directory)
      # (SecureRandom.hex(8) reads the same source: 8 bytes from urandom.)
      temporary = File.join(directory, ".#{File.basename(path)}.#{Random.urandom(8).unpack1('H*')}.tmp")
      created = false
      begin
        flags = File::WRONLY | File::CREAT | File::EXCL | File::NOFOLLOW
        File.open(temporary, flags, mode, binmode: true) do |file|
          created = true
          file.chmod(mode) # the umask may have cleared bits that were asked for
          written = 0
          written += file.syswrite(data.byteslice(written..)) while written < data.bytesize
        end
        overwrite ? File.rename(temporary, path) : publish_without_overwriting(temporary, path)
      ensure
        # Only a file this call made: never one that was there first.
        File.unlink(temporary) if created && File.exist?(temporary)
      end
      path
    end

    # Raises Errno::EFBIG, naming `path` and the limit, if `size` bytes are
    # more than the soft RLIMIT_FSIZE (`ulimit -f`, or a container's or
    # systemd unit's LimitFSIZE) allows. Writing past that limit does not
    # fail: the kernel sends SIGXFSZ, whose default action kills the whole
    # process (exit 153) mid-write, its buffered output lost and the
    # temporary file left behind. The file written is always new (written
    # from offset 0), so its size is exactly `size`: this check is exact,
    # and only a limit lowered in between (setrlimit in another thread,
    # prlimit(1) from outside) gets past it. Checked here rather than by
    # ignoring SIGXFSZ around the write: a signal's disposition is the
    # whole process's, so ignoring it would change what the app's own
    # threads' writes do meanwhile, restoring it would race between two
    # writers (one restoring the default while the other writes), and a
    # handler the app installed outside Ruby's `trap` could not be
    # restored at all.
    def check_file_size(path, size)
      limit = file_size_limit
      return if limit.nil? || size <= limit

      raise Errno::EFBIG, "#{path}: #{size} bytes is more than this process's file size limit " \
                          "(RLIMIT_FSIZE, ulimit -f) of #{limit} bytes; not written"
    end

    # The soft RLIMIT_FSIZE in bytes, or nil if there is none (or no such
    # limit on this platform).
    def file_size_limit
      return nil unless defined?(Process::RLIMIT_FSIZE)

      limit = Process.getrlimit(Process::RLIMIT_FSIZE).first
      limit == Process::RLIM_INFINITY ? nil : limit
    rescue NotImplementedError, SystemCallError
      nil
    end

    # `mkdir -p` with DIRECTORY_MODE for each directory made, as
    # FileUtils.mkdir_p(directory, mode: DIRECTORY_MODE) does: the mode is
    # set again after mkdir(2), which the umask may have narrowed; one made
    # by another process meanwhile is fine.
    def make_directories(directory)
      missing = []
      path = directory == "/" ? directory : directory.chomp("/")
      until File.directory?(path) || File.dirname(path) == path
        missing.push(path)
        path = File.dirname(path)
      end
      missing.reverse_each do |dir|
        Dir.mkdir(dir, DIRECTORY_MODE)
        File.chmod(DIRECTORY_MODE, dir)
      rescue SystemCallError
        raise unless File.directory?(dir)
      end
    end

    # Refuses a directory that another user owns (or a symlink to one), and
    # one that anybody may write to without the sticky bit: there others
    # could replace or remove what is written. Root's directories are fine,
    # and /tmp (sticky): the temporary file is exclusive.
    def check_directory(directory)
      stat = File.stat(directory)
      unless stat.uid == Process.euid || stat.uid.zero?
        raise Errno::EACCES, "#{directory} belongs to another user (uid #{stat.uid}); " \
                             "refusing to write there (use a directory of your own)"
      end
      return unless stat.world_writable? && !stat.sticky?

      raise Errno::EACCES, "#{directory} may be written by anybody (mode #{format('%o', stat.mode & 0o7777)}, " \
                           "no sticky bit); refusing to write there"
    end

    # link(2) fails if `path` exists, atomically; the temporary name is then
    # removed by the caller.
    def publish_without_overwriting(temporary, path)
      File.link(temporary, path)
    rescue Errno::EPERM, Errno::EOPNOTSUPP, Errno::ENOTSUP
      # A file system without hard links: check, then rename (not atomic).
      raise Errno::EEXIST, path if File.exist?(path)

      File.rename(temporary, path)
    end

    # Checks a mode asked for: an Integer file permission such as 0o640.
    def validate_mode(mode, name = "mode")
      Validation.integer(mode, name, min: 0, max: 0o777,
                                     expected: "a file permission from 0 to 0o777 (e.g. 0o600)")
    end
  end
end
