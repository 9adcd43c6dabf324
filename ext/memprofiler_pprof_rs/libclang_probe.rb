# frozen_string_literal: true

# Finds libclang, which rb-sys's bindgen loads to read Ruby's headers.
# extconf.rb warns with it and script/bootstrap installs libclang when it
# says none is there (`ruby ext/memprofiler_pprof_rs/libclang_probe.rb`
# exits 0 and prints the path when found, 1 otherwise).
#
# Only libclang itself counts: libclang.so, libclang.so.1, libclang-14.so.1
# and the like. LLVM's libclang-cpp.so.14 (the C++ API, which Debian 12 images
# often carry with LLVM 14 and no libclang) shares the prefix, and an earlier
# glob, libclang*.so*, took it for libclang: the check passed and the build
# failed in bindgen.
module LibclangProbe
  # libclang.so, libclang.so.1, libclang-14.so, libclang-14.0.6.so.1,
  # libclang.dylib; never libclang-cpp.so.N.
  NAME = /\Alibclang(?:-\d+(?:\.\d+)*)?(?:\.so(?:\.\d+)*|\.dylib)\z/

  # Where bindgen's clang-sys and the distributions put it (Debian's
  # /usr/lib/llvm-N/lib and multiarch /usr/lib/<triplet>, Fedora's /usr/lib64,
  # Homebrew's llvm).
  DIR_GLOBS = ["/usr/lib/llvm-*/lib", "/usr/lib", "/usr/lib/*", "/usr/lib64", "/usr/local/lib",
               "/opt/homebrew/opt/llvm/lib", "/usr/local/opt/llvm/lib"].freeze

  module_function

  # The first libclang under root (the file system's root unless testing),
  # or nil. LIBCLANG_PATH, when set, is the only place searched, as bindgen
  # does: a directory holding libclang, or the library file itself.
  def find(root: "/", env: ENV)
    given = env["LIBCLANG_PATH"]
    if given && !given.empty?
      path = File.join(root, given)
      return path if File.file?(path) && NAME.match?(File.basename(path))
    end
    dirs = if given && !given.empty?
             [File.join(root, given)]
           else
             DIR_GLOBS.flat_map { |glob| Dir.glob(File.join(root, glob)) }
           end
    dirs.each do |dir|
      next unless File.directory?(dir)

      hit = Dir.children(dir).sort.find { |name| NAME.match?(name) && File.file?(File.join(dir, name)) }
      return File.join(dir, hit) if hit
    end
    nil
  end
end

if $PROGRAM_NAME == __FILE__
  path = LibclangProbe.find
  if path
    puts path
  else
    warn "libclang not found (libclang-cpp does not count)"
    exit 1
  end
end
