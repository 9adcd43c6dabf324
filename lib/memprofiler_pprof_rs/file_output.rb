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
    # directory (a random name, created exclusively and with O_NOFOLLOW, so
    # a symlink or file planted there is never written through; a name
    # found taken is replaced by another), then renamed over `path`, so a
    # reader never sees half a file. With `overwrite: false` an existing
    # `path` is never replaced (Errno::EEXIST), even if another process
    # creates it at the same moment. The directory is created
    # (DIRECTORY_MODE) if missing; an existing one must belong to this
    # process's user or to root (see `check_directory`), and so must every
    # symlink on the way to it (see `check_symlinks`). Writes with write(2)
    # directly, never through Ruby's IO buffer: a fork (from another
    # thread) while data sat in that buffer would give the child a copy,
    # which its GC flushes into the shared file description, appending a
    # second copy to the file. Data over the process's file size limit is
    # refused before anything is written (see `check_file_size`). Returns
    # `path`. `mode` is checked as `validate_mode` does, whoever calls.
    def write(path, data, mode: FILE_MODE, overwrite: true)
      validate_mode(mode)
      check_file_size(path, data.bytesize)
      directory = File.dirname(path)
      check_symlinks(directory, path)
      unless File.directory?(directory)
        make_directories(directory)
        # A symlink planted where a directory was about to be made (mkdir
        # then fails, and the name is a directory) is caught here.
        check_symlinks(directory, path)
      end
      check_directory(directory)
      temporary = nil
      begin
        temporary, file = create_temporary(directory, path, mode)
        begin
          file.chmod(mode) # the umask may have cleared bits that were asked for
          written = 0
          written += file.syswrite(data.byteslice(written..)) while written < data.bytesize
        ensure
          file.close
        end
        if overwrite
          File.rename(temporary, path)
          temporary = nil
        else
          publish_without_overwriting(temporary, path)
        end
      ensure
        # Only a file this call made: never one that was there first.
        begin
          File.unlink(temporary) if temporary
        rescue Errno::ENOENT
          nil # renamed after all (a file system without hard links)
        end
      end
      path
    end

    # Temporary names tried before giving up: 64 random bits each, so a
    # taken one is a planted one.
    TEMPORARY_ATTEMPTS = 10

    # Creates a new temporary file for `path` in `directory`: returns its
    # name and the open File. O_EXCL and O_NOFOLLOW: a file or symlink
    # already at the name is never opened (EEXIST; ELOOP or EMLINK on some
    # systems for a symlink), and another name is tried. That is not
    # reported as EEXIST, which callers read as `path` being taken.
    def create_temporary(directory, path, mode)
      flags = File::WRONLY | File::CREAT | File::EXCL | File::NOFOLLOW
      TEMPORARY_ATTEMPTS.times do
        # (SecureRandom.hex(8) reads the same source: 8 bytes from urandom.)
        temporary = File.join(directory, ".#{File.basename(path)}.#{Random.urandom(8).unpack1('H*')}.tmp")
        begin
          return [temporary, File.open(temporary, flags, mode, binmode: true)]
        rescue Errno::EEXIST, Errno::ELOOP, Errno::EMLINK
          next
        end
      end
      raise Errno::EACCES, "#{path}: #{TEMPORARY_ATTEMPTS} random temporary names in #{directory} were all " \
                           "taken (planted?); refusing to write there"
    end

    # Symlinks followed on the way to a directory at most (Linux's own
    # limit), so a loop is an error rather than a hang.
    MAX_SYMLINKS = 40

    # Refuses a path to `directory` that goes through a symlink owned by
    # another user than this process's (or root): one planted in /tmp
    # (`/tmp/X -> /root-only/dir`) would have a root process write where
    # its planter chose, and `check_directory` only sees the target, which
    # is root's. Each component is looked at with lstat(2) and symlinks are
    # followed as the kernel does, so one reached through another (a
    # relative target, a `..` after it) is checked too; the walk stops at
    # the first missing component (what `make_directories` creates is a
    # directory). Symlinks of this user (a deploy's current -> releases/N)
    # and root's (macOS's /tmp -> private/tmp) are fine. `path`, the file
    # to be written, is named in the error.
    #
    # Ruby has no openat(2), so the directory cannot be opened with
    # O_NOFOLLOW and written into relative to the descriptor: this is a
    # check before writing. Only someone who can rename entries in a
    # directory on the way between the check and the write could get
    # past it: not in a sticky /tmp, where nobody can replace another
    # user's name.
    def check_symlinks(directory, path)
      pending = directory.b.split("/")
      # Dir.pwd is getcwd(3): no symlinks in it.
      pending = Dir.pwd.b.split("/") + pending unless directory.start_with?("/")
      current = "".b # the root directory
      followed = 0
      until pending.empty?
        part = pending.shift
        next if part.empty? || part == "."

        if part == ".."
          current = current[0, current.rindex("/") || 0]
          next
        end
        candidate = "#{current}/#{part}"
        stat = begin
          File.lstat(candidate)
        rescue Errno::ENOENT
          return nil
        end
        unless stat.symlink?
          current = candidate
          next
        end
        target = File.readlink(candidate).b
        refuse_symlink(path, candidate, target, stat.uid) unless stat.uid == Process.euid || stat.uid.zero?
        followed += 1
        raise Errno::ELOOP, "#{shown(directory)}: more than #{MAX_SYMLINKS} symlinks on the way" if followed > MAX_SYMLINKS

        current = "".b if target.start_with?("/")
        pending = target.split("/") + pending
      end
      nil
    end

    def refuse_symlink(path, link, target, uid)
      raise Errno::EACCES, "refusing to write #{shown(path)}: #{shown(link)} is a symlink owned by " \
                           "uid #{uid}#{user_name(uid)}, not by this process's user (uid #{Process.euid}) " \
                           "or root, pointing to #{shown(target)} (a symlink another user can plant " \
                           "would choose where profiles go; use a directory of your own)"
    end

    # " (name)" for a uid, if Etc is loaded already (never loaded here: see
    # above), else "".
    def user_name(uid)
      name = defined?(Etc) && Etc.respond_to?(:getpwuid) ? Etc.getpwuid(uid)&.name : nil
      name ? " (#{name})" : ""
    rescue StandardError
      ""
    end

    # A path in a message: as text if it is valid UTF-8, else escaped.
    def shown(bytes)
      text = bytes.dup.force_encoding(Encoding::UTF_8)
      text.valid_encoding? ? text : bytes.b.inspect
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

    # Permission bits that let others than the owner change a file.
    WRITABLE_BY_OTHERS = 0o022

    # Checks a mode asked for: an Integer file permission such as 0o640,
    # which neither group nor others may write (they could replace what a
    # profile says, or fill the disk through it).
    def validate_mode(mode, name = "mode")
      Validation.integer(mode, name, min: 0, max: 0o777,
                                     expected: "a file permission from 0 to 0o777 (e.g. 0o600)")
      return mode if mode.nobits?(WRITABLE_BY_OTHERS)

      raise ArgumentError, "#{name} must not let group or others write the file (e.g. 0o600, 0o640 or 0o644), " \
                           "got #{format('0o%o', mode)}"
    end
  end
end
