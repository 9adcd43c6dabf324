# frozen_string_literal: true

require "tmpdir"
require "open3"
require "set"

# Helpers to read profiles and to check them with `go tool pprof`.
module PprofHelpers
  # The longest a Ruby child of run_ruby may run.
  RUN_RUBY_SECONDS = 600

  # Shapes of profile `go tool pprof` has read in this run (see go_check_due?).
  GO_CHECKED_SHAPES = Set.new
  GO_CHECKED_LOCK = Mutex.new

  # Every profile a spec reads is read by the gem's own reader, which
  # refuses what Go's would (dangling ids, value counts that do not match
  # the sample types, string indexes out of the table); `go tool pprof`,
  # which exits non-zero on a malformed profile, also reads each shape of
  # profile once a run, or every profile with
  # MEMPROFILER_PPROF_RS_GO_CHECK=all.
  def parse_profile(data)
    bytes = data.respond_to?(:pprof_data) ? data.pprof_data : data
    profile = MemprofilerPprof::PprofReader.parse(bytes)
    if go_check_due?(profile)
      _out, err, status = go_pprof(bytes, "-top", "-nodecount=1")
      raise "go tool pprof rejected a profile: #{err}" unless status.success?
    end
    profile
  end

  # What makes two profiles alike to a reader: their sample and period
  # types, which label keys (string and numeric) their samples carry,
  # whether they have comments, mappings, a default sample type, and
  # samples at all.
  def profile_shape(profile)
    labels = profile.samples.flat_map { |s| s.labels.map { |l| [l.key, l.str.to_s.empty? ? :num : :str] } }.uniq.sort
    [profile.sample_types.map(&:to_a), profile.period_type&.to_a, labels, profile.comments.empty?,
     profile.mapping_count.zero?, profile.default_sample_type, profile.samples.empty?]
  end

  def go_check_due?(profile)
    return true if ENV["MEMPROFILER_PPROF_RS_GO_CHECK"] == "all"

    shape = profile_shape(profile)
    GO_CHECKED_LOCK.synchronize do
      next false unless GO_CHECKED_SHAPES.add?(shape)

      shared = ENV.fetch("MEMPROFILER_SPEC_GO_SHAPES", "")
      shared.empty? || first_in_shared_file?(shared, shape.inspect)
    end
  end

  # Whether `key` is new to the file that script/rspec-lanes shares among
  # its rspec processes (then it is recorded there).
  def first_in_shared_file?(path, key)
    File.open(path, "a+") do |f|
      f.flock(File::LOCK_EX)
      next false if f.each_line(chomp: true).include?(key)

      f.puts(key)
      true
    end
  end

  # Samples whose stack passes through `method_name` (and, if given, whose
  # leaf frame is `leaf`).
  def samples_through(profile, method_name, leaf: nil)
    profile.samples.select do |s|
      s.frames.any? { |f| f.name == method_name } && (leaf.nil? || s.frames.first&.name == leaf)
    end
  end

  # Sums of sample type `type` by the value of string label `key` (nil:
  # samples without it): what a context label (with_labels) accounts for.
  def sums_by_label(profile, key, type)
    profile.samples.each_with_object(Hash.new(0)) do |s, sums|
      sums[s.labels.find { |l| l.key == key }&.str] += s.value(profile, type)
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
  # Returns [stdout, stderr, status], as Open3.capture3. A child still
  # running after `seconds` is killed and the example fails, so that a hang
  # stops one example, not the suite.
  def run_ruby(code, env: {}, args: [], seconds: RUN_RUBY_SECONDS, **options)
    lib = File.expand_path("../../lib", __dir__)
    Open3.popen3(env, RbConfig.ruby, "-I", lib, "-e", code, "--", *args, **options) do |stdin, stdout, stderr, wait|
      stdin.close
      out = read_in_thread(stdout)
      err = read_in_thread(stderr)
      if wait.join(seconds).nil?
        Process.kill("KILL", wait.pid)
        wait.join
        # (A process the child started may hold the pipes open.)
        said = err.join(5) ? err.value : ""
        raise "a Ruby child ran over #{seconds} s and was killed; its stderr:\n#{said}"
      end
      [out.value, err.value, wait.value]
    end
  end

  # A thread that reads `io` to its end. popen3 closes the pipes when its
  # block ends: after a killed child, a process it started may still hold
  # them, and the read then ends with nothing more to say.
  def read_in_thread(io)
    Thread.new do
      io.read
    rescue IOError
      ""
    end
  end
end
