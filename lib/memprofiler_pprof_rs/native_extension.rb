# frozen_string_literal: true

module MemprofilerPprof
  # Finds and loads the Rust extension, which lives in one of three places:
  # - the platform gem (x86_64-linux): lib/memprofiler_pprof_rs/<major.minor>/,
  #   one extension per Ruby it was built for, chosen by RUBY_VERSION (their
  #   C APIs differ, so one build cannot serve two minor versions);
  # - a checkout: lib/memprofiler_pprof_rs/, where `rake compile` puts it;
  # - the source gem: wherever `gem install` built it, on $LOAD_PATH.
  # Whatever fails, the LoadError says what was looked for and what to do,
  # never only "cannot load such file".
  module NativeExtension
    DIR = __dir__
    NAME = "memprofiler_pprof_rs"
    # "so" on Linux, "bundle" on macOS (a checkout's build there).
    DLEXT = defined?(RbConfig) ? RbConfig::CONFIG["DLEXT"] : "so"
    # RubyGems prefers a platform gem to the source gem of the same version,
    # so installing the latter beside it is not enough: this one must go.
    SOURCE_INSTALL = <<~TEXT.chomp
      Use the source gem instead, which builds the extension (it needs Rust's cargo 1.85+, libclang,
      Ruby's headers and a C compiler): gem uninstall memprofiler_pprof_rs --platform x86_64-linux
      && gem install memprofiler_pprof_rs --platform ruby (Bundler: BUNDLE_FORCE_RUBY_PLATFORM=1, or
      force_ruby_platform: true on the gem's line).
    TEXT

    module_function

    def load
      ruby_minor = RUBY_VERSION[/\A\d+\.\d+/]
      precompiled = precompiled_versions
      if precompiled.include?(ruby_minor)
        load_precompiled(ruby_minor)
      elsif precompiled.any?
        raise LoadError, "memprofiler_pprof_rs #{VERSION}#{gem_platform} has precompiled extensions for Ruby " \
                         "#{precompiled.join(', ')}, not for Ruby #{RUBY_VERSION}.\n#{SOURCE_INSTALL}", cause: nil
      else
        load_built
      end
    end

    # The <major.minor> directories a platform gem ships ([] elsewhere).
    def precompiled_versions
      versions = Dir.children(DIR).grep(/\A\d+\.\d+\z/).select { |v| File.file?(File.join(DIR, v, "#{NAME}.so")) }
      versions.sort_by { |v| v.split(".").map(&:to_i) }
    end

    def load_precompiled(ruby_minor)
      path = File.join(DIR, ruby_minor, "#{NAME}.so")
      require path
    rescue LoadError => e
      # A libc other than glibc (Alpine's musl), a glibc older than the one it
      # was built for, another CPU: the loader's own words, and the way out.
      raise LoadError, "memprofiler_pprof_rs: the precompiled extension #{path} could not be loaded " \
                       "(#{e.message}). It is built for x86_64 Linux with glibc 2.28 or newer.\n#{SOURCE_INSTALL}", cause: nil
    end

    def load_built
      checkout = File.join(DIR, "#{NAME}.#{DLEXT}")
      return require(checkout) if File.file?(checkout)

      begin
        require "#{NAME}/#{NAME}"
      rescue LoadError => e
        raise LoadError, "memprofiler_pprof_rs: its native extension is not built (#{e.message}). " \
                         "In a checkout, run `rake compile`; the source gem builds it at `gem install`, " \
                         "so install it again and read what the build printed.", cause: nil
      end
    end

    # " (x86_64-linux)" when RubyGems loaded the gem, "" otherwise.
    def gem_platform
      spec = defined?(Gem.loaded_specs) && Gem.loaded_specs["memprofiler_pprof_rs"]
      spec ? " (#{spec.platform})" : ""
    end
  end
end
