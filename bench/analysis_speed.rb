# frozen_string_literal: true

# How fast the executable's commands are on a big profile (the issue asks
# for the time on a 10 MB one), next to `go tool pprof -top` on the same file.
#
#   ruby -Ilib bench/analysis_speed.rb [--megabytes 10] [--seed 1]
#
# The profile is synthetic but shaped like a busy server's heap profile:
# stacks 10-60 frames deep walked down one call tree (each method calls one
# of 6 others, so stacks share prefixes as real ones do) over 20,000 methods
# in app files and gems, class labels, four sample types, random values (so
# gzip cannot shrink it much more than a real one).

require "optparse"
require "benchmark"
require "tmpdir"
require "open3"
require "memprofiler_pprof_rs"
require_relative "../spec/support/pprof_writer"

options = { megabytes: 10, seed: 1 }
OptionParser.new do |opts|
  opts.on("--megabytes N", Float, "target gzipped size (default 10)") { |v| options[:megabytes] = v }
  opts.on("--seed N", Integer) { |v| options[:seed] = v }
end.parse!

random = Random.new(options[:seed])
files = Array.new(400) do |i|
  i.even? ? "/srv/app/app/models/model_#{i}.rb" : "/usr/local/bundle/gems/gem#{i % 37}-1.#{i % 7}.0/lib/gem#{i % 37}/part_#{i}.rb"
end
functions = Array.new(20_000) do |i|
  ["Namespace#{i % 97}::Class#{i % 1013}#method_#{i}", files[i % files.size], 10 + (i % 500), 8 + (i % 500)]
end
classes = %w[String Array Hash Object Proc Symbol Regexp MatchData Struct Set] + Array.new(200) { |i| "Model#{i}" }

samples = []
types = [%w[alloc_objects count], %w[alloc_space bytes], %w[inuse_objects count], %w[inuse_space bytes]]
bytes = nil
target = (options[:megabytes] * 1_048_576).to_i
batch = 20_000
generate = Benchmark.realtime do
  loop do
    batch.times do
      depth = 10 + random.rand(50)
      callee = 0
      stack = Array.new(depth) do
        choice = random.rand(6)
        callee = ((callee * 31) + (choice * 7919) + 1) % functions.size
        f = functions[callee]
        [f[0], f[1], f[2] + choice, f[3]]
      end.reverse
      values = [1 + random.rand(500), 40 + random.rand(400_000), random.rand(50), random.rand(200_000)]
      samples << { stack: stack, values: values, class: classes[random.rand(classes.size)] }
    end
    bytes = PprofWriter.build(sample_types: types, samples: samples, time_nanos: Time.now.to_i * 1_000_000_000,
                              duration_nanos: 60_000_000_000, default_sample_type: "inuse_space")
    break if bytes.bytesize >= target

    # Aim the next batch at the remaining size.
    per_sample = bytes.bytesize.to_f / samples.size
    batch = [((target - bytes.bytesize) / per_sample).ceil + 100, 1_000].max
  end
end

def time(label)
  result = nil
  seconds = Benchmark.realtime { result = yield }
  printf("  %-46s %7.3f s\n", label, seconds)
  [result, seconds]
end

Dir.mktmpdir("analysis-speed") do |dir|
  path = File.join(dir, "big.pprof")
  File.binwrite(path, bytes)
  puts format("profile: %.1f MB gzipped, %d samples (generated in %.0f s)", bytes.bytesize / 1_048_576.0, samples.size, generate)

  puts "MemprofilerPprof::Profile (native core), in this process:"
  profile, parse_time = time("parse (read + gunzip + decode + index)") { MemprofilerPprof::Profile.read(path) }
  time("top, by function") { profile.top }
  time("top, by line") { profile.top(by: :line) }
  time("top, by gem") { profile.top(by: :gem) }
  time("top, --focus /Class1[0-9]#/") { profile.top(focus: /Class1[0-9]#/) }
  time("diff of it against itself") { MemprofilerPprof::Profile.diff([profile, profile]) }
  html, = time("flamegraph (HTML)") { profile.flamegraph }
  puts format("    (the page: %.1f MB)", html.bytesize / 1_048_576.0)
  merged, = time("merge of it with itself") { MemprofilerPprof::Profile.merge([profile, profile]) }
  time("to_pprof of the merge (encode + gzip)") { merged.to_pprof }

  puts "The executable, end to end (new process, loads the gem):"
  exe = File.expand_path("../exe/memprofiler_pprof_rs", __dir__)
  _, cli_time = time("memprofiler_pprof_rs top big.pprof") do
    out, err, status = Open3.capture3(RbConfig.ruby, exe, "top", path)
    raise "top failed: #{err}" unless status.success?

    out
  end
  go = system("go version", out: File::NULL, err: File::NULL)
  if go
    env = { "PPROF_TMPDIR" => dir, "HOME" => ENV.fetch("HOME", dir) }
    _, go_time = time("go tool pprof -top big.pprof") do
      _out, err, status = Open3.capture3(env, "go", "tool", "pprof", "-top", path)
      raise "go tool pprof failed: #{err}" unless status.success?
    end
    puts format("ratio: memprofiler_pprof_rs top / go tool pprof -top = %.2f (parse alone: %.2f)",
                cli_time / go_time, parse_time / go_time)
  else
    puts "(go not installed: no comparison)"
  end
end
