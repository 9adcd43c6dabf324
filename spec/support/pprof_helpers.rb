# frozen_string_literal: true

require "tmpdir"
require "open3"

# Helpers to read profiles and to check them with `go tool pprof`.
module PprofHelpers
  # Every profile a spec reads is also checked by `go tool pprof`, which
  # exits non-zero on a malformed profile.
  def parse_profile(data)
    bytes = data.respond_to?(:pprof_data) ? data.pprof_data : data
    _out, err, status = go_pprof(bytes, "-top", "-nodecount=1")
    raise "go tool pprof rejected a profile: #{err}" unless status.success?

    MemprofilerPprof::PprofReader.parse(bytes)
  end

  # Samples whose stack passes through `method_name` (and, if given, whose
  # leaf frame is `leaf`).
  def samples_through(profile, method_name, leaf: nil)
    profile.samples.select do |s|
      s.frames.any? { |f| f.name == method_name } && (leaf.nil? || s.frames.first&.name == leaf)
    end
  end

  # Sum of sample type `type` over samples_through(...).
  def total_through(profile, method_name, type, leaf: nil)
    samples_through(profile, method_name, leaf: leaf).sum { |s| s.value(profile, type) }
  end

  # Strings kept by Workload::Allocator.big_strings that are still alive.
  def big_strings_alive(profile)
    total_through(profile, "Workload::Allocator.big_strings", "inuse_objects", leaf: "String#*")
  end

  # Frame names of each sample, leaf first.
  def stacks_of(profile)
    profile.samples.map { |s| s.frames.map(&:name) }
  end

  # Writes the profile to a file and runs `go tool pprof ARGS file`.
  # Returns [stdout, stderr, status].
  def go_pprof(data, *args)
    Dir.mktmpdir("pprof-spec") do |dir|
      path = File.join(dir, "profile.pb.gz")
      File.binwrite(path, data.respond_to?(:pprof_data) ? data.pprof_data : data)
      env = { "PPROF_TMPDIR" => dir, "HOME" => ENV.fetch("HOME", dir) }
      Open3.capture3(env, "go", "tool", "pprof", *args, path)
    end
  end

  # Runs Ruby code in a fresh process with this gem on the load path.
  def run_ruby(code, env: {}, args: [], **options)
    lib = File.expand_path("../../lib", __dir__)
    Open3.capture3(env, RbConfig.ruby, "-I", lib, "-e", code, "--", *args, **options)
  end
end
