# frozen_string_literal: true

# The executable's `merge` over many files whose stacks are distinct (issue
# 36): each of `--files` profiles holds 3,000 samples with random stacks
# 6-26 frames deep over 300 methods, so the merged result grows with every
# file. Reports wall time, peak RSS (GNU time) and the last line of stderr,
# at each `--memory-limit` asked for.
#
#   ruby -Ilib bench/merge_many.rb [--files 500] [--limit 2048] [--limit 1000]

require "optparse"
require "tmpdir"
require "open3"
require_relative "../spec/support/pprof_writer"

files = 500
limits = []
OptionParser.new do |opts|
  opts.on("--files N", Integer) { |n| files = n }
  opts.on("--limit MB", Integer, "a --memory-limit to run with (repeatable; default 2048)") { |mb| limits << mb }
end.parse!
limits = [2048] if limits.empty?

exe = File.expand_path("../exe/memprofiler_pprof_rs", __dir__)
lib = File.expand_path("../lib", __dir__)
Dir.mktmpdir("merge_many") do |dir|
  random = Random.new(1)
  paths = Array.new(files) do |f|
    samples = Array.new(3_000) do
      stack = Array.new(random.rand(6..26)) do |depth|
        ["M#m#{random.rand(300)}", "/app/m#{depth % 7}.rb", random.rand(1..500), 1]
      end
      { stack: stack, values: [random.rand(1_000)], class: "String" }
    end
    File.join(dir, format("p%03d.pprof", f)).tap do |path|
      File.binwrite(path, PprofWriter.build(sample_types: [%w[inuse_space bytes]], samples: samples))
    end
  end
  megabytes = paths.sum { |p| File.size(p) } / 1_048_576.0
  puts "bench/merge_many.rb: #{RUBY_DESCRIPTION}; #{files} files, #{megabytes.round(1)} MB"
  limits.each do |limit|
    command = ["/usr/bin/time", "-f", "%e s, %M KB", RbConfig.ruby, "-I", lib, exe, "merge", *paths,
               "-o", File.join(dir, "all.pprof"), "--memory-limit", limit.to_s]
    _out, err, status = Open3.capture3(*command)
    lines = err.lines.map(&:chomp).grep_v(/\ACommand exited with/)
    seconds, kilobytes = lines.last.scan(/[\d.]+/)
    puts format("--memory-limit %5d: %7.1f s, peak RSS %6.0f MB, exit %d: %s", limit, Float(seconds),
                Integer(kilobytes) / 1024.0, status.exitstatus, lines[-2].to_s[0, 160])
  end
end
