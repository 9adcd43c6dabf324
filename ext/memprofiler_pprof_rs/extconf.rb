# frozen_string_literal: true

# Builds the Rust extension during `gem install` (and `rake compile`).
#
# With the rb_sys gem available, its mkmf support writes the Makefile.
# Without it (RubyGems unreachable, or MEMPROFILER_PPROF_RS_BUILDER=cargo),
# this file writes a small Makefile that drives cargo itself. Either way
# cargo builds into a temporary target directory that is removed after
# `make install`, so the installed gem does not keep hundreds of MB of build
# output; set MEMPROFILER_PPROF_RS_TARGET_DIR to build into (and keep) a
# directory of your choice instead.
#
# A source gem made by `rake build` carries the crates cargo needs in
# vendor/crates (script/vendor-crates): cargo then builds from them with
# --offline, needing no network. A git checkout has no vendor/crates and
# fetches from crates.io as usual; MEMPROFILER_PPROF_RS_VENDOR=0 ignores
# vendor/crates (rake compile sets it).

require "rbconfig"
require "tmpdir"
require "shellwords"
require_relative "libclang_probe"

CRATE_DIR = File.expand_path("../..", __dir__)
LIB_NAME = "memprofiler_pprof_rs"
TARGET = "#{LIB_NAME}/#{LIB_NAME}".freeze # required as "memprofiler_pprof_rs/memprofiler_pprof_rs"

def find_cargo
  candidates = [ENV["CARGO"], "cargo", File.join(Dir.home, ".cargo", "bin", "cargo")].compact
  candidates.find do |cargo|
    system(cargo, "--version", out: File::NULL, err: File::NULL)
  rescue SystemCallError
    false
  end
end

def warn_if_libclang_missing
  return if LibclangProbe.find

  warn <<~MSG
    memprofiler_pprof_rs: libclang was not found; the build (rb-sys runs bindgen) needs it.
      Debian/Ubuntu: apt-get install libclang-dev   (Debian 12: libclang1-14 libclang-common-14-dev)
      Fedora:        dnf install clang-devel
      macOS:         brew install llvm  (and set LIBCLANG_PATH)
    or set LIBCLANG_PATH to the directory holding libclang.
  MSG
end

cargo = find_cargo
unless cargo
  abort <<~MSG
    memprofiler_pprof_rs needs Rust's cargo (1.85 or newer) to build its native extension.
    Install it with rustup (see rustup.rs), then run the install again,
    or set CARGO=/path/to/cargo.
  MSG
end
warn_if_libclang_missing

builder = ENV.fetch("MEMPROFILER_PPROF_RS_BUILDER", "auto")
use_rb_sys = false
if builder != "cargo"
  begin
    require "rb_sys/mkmf"
    # create_rust_makefile builds on mkmf's helpers (dummy_makefile), which
    # rb_sys/mkmf expects the caller to have loaded.
    require "mkmf"
    use_rb_sys = true
  rescue LoadError
    abort "MEMPROFILER_PPROF_RS_BUILDER=rb_sys but the rb_sys gem is not installed" if builder == "rb_sys"
  end
end

# MemprofilerPprof::EmptyHooks (bench/'s hook floor) only when asked for:
# `rake compile` asks, `gem install` does not.
features = ENV["MEMPROFILER_PPROF_RS_BENCH_HOOKS"] == "1" ? ["bench-hooks"] : []

keep_target_dir = ENV.key?("MEMPROFILER_PPROF_RS_TARGET_DIR")
target_dir = File.expand_path(ENV["MEMPROFILER_PPROF_RS_TARGET_DIR"] || Dir.mktmpdir("memprofiler_pprof_rs-cargo-"))

q = ->(s) { Shellwords.escape(s.to_s) }
toml_string = ->(s) { %("#{s.gsub(/[\\"]/) { |c| "\\#{c}" }}") }

# Source replacement through --config: cargo reads .cargo/config.toml from
# the current directory, which during gem install is not CRATE_DIR.
vendor_dir = File.join(CRATE_DIR, "vendor", "crates")
cargo_args = []
if File.directory?(vendor_dir) && ENV["MEMPROFILER_PPROF_RS_VENDOR"] != "0"
  cargo_args = ["--offline",
                "--config", %(source.crates-io.replace-with="vendored-sources"),
                "--config", "source.vendored-sources.directory=#{toml_string[vendor_dir]}"]
  puts "memprofiler_pprof_rs: building offline from the crates in #{vendor_dir}"
end

if use_rb_sys
  create_rust_makefile(TARGET) do |config|
    # CRATE_DIR, relative to this file's directory ($(srcdir)), to which
    # rb-sys joins it after stripping a leading "." or "./" ("../.." would
    # lose a dot).
    config.ext_dir = "./../.."
    config.profile = :release
    config.target_dir = target_dir
    config.clean_after_install = !keep_target_dir
    config.auto_install_rust_toolchain = false
    config.env = { "RUBY" => RbConfig.ruby, "CARGO" => cargo }
    config.features = features
    # rb-sys joins these into the cargo command line unquoted.
    config.extra_cargo_args = cargo_args.map(&q)
  end
  exit
end

# ----- fallback: a Makefile that runs cargo --------------------------------

dlext = RbConfig::CONFIG["DLEXT"] # "so" on Linux, "bundle" on macOS
cargo_output = case RbConfig::CONFIG["host_os"]
               when /darwin/ then "lib#{LIB_NAME}.dylib"
               when /mswin|mingw/ then "#{LIB_NAME}.dll"
               else "lib#{LIB_NAME}.so"
               end
sitearchdir = RbConfig::CONFIG["sitearchdir"]

File.write("Makefile", <<~MAKEFILE)
  # Written by #{__FILE__}: builds the Rust crate with cargo.
  SHELL = /bin/sh
  CARGO = #{q[cargo]}
  CARGO_ARGS = #{cargo_args.map(&q).join(' ')}
  RUBY = #{q[RbConfig.ruby]}
  CRATE_DIR = #{q[CRATE_DIR]}
  TARGET_DIR = #{q[target_dir]}
  KEEP_TARGET_DIR = #{keep_target_dir ? 1 : 0}
  DLLIB = #{LIB_NAME}.#{dlext}
  DESTDIR =
  sitearchdir = #{q[sitearchdir]}
  INSTALL_DIR = $(DESTDIR)$(sitearchdir)/#{LIB_NAME}

  all: $(DLLIB)

  $(DLLIB): FORCE
  \tRUBY=$(RUBY) $(CARGO) build $(CARGO_ARGS) --release --lib --locked --manifest-path $(CRATE_DIR)/Cargo.toml --target-dir $(TARGET_DIR)#{features.map { |f| " --features #{f}" }.join}
  \tcp $(TARGET_DIR)/release/#{cargo_output} $(DLLIB)

  install: all
  \tmkdir -p $(INSTALL_DIR)
  \tcp $(DLLIB) $(INSTALL_DIR)/$(DLLIB)
  \t@if [ "$(KEEP_TARGET_DIR)" = 0 ]; then echo "removing cargo build directory $(TARGET_DIR)"; rm -rf $(TARGET_DIR); fi

  clean:
  \trm -f $(DLLIB)

  distclean: clean
  \trm -f Makefile
  \t@if [ "$(KEEP_TARGET_DIR)" = 0 ]; then rm -rf $(TARGET_DIR); fi

  FORCE:

  .PHONY: all install clean distclean FORCE
MAKEFILE
puts "memprofiler_pprof_rs: wrote Makefile (cargo build into #{target_dir})"
