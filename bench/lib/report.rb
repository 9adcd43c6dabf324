# frozen_string_literal: true

require "etc"
require "json"
require "open3"
require "rbconfig"

# Shared by the bench runners: fresh-process runs, medians, tables, and a
# description of the machine.
module BenchReport
  ROOT = File.expand_path("../..", __dir__)

  module_function

  def median(values)
    sorted = values.compact.sort
    return nil if sorted.empty?

    mid = sorted.size / 2
    sorted.size.odd? ? sorted[mid] : (sorted[mid - 1] + sorted[mid]) / 2.0
  end

  # Runs `ruby -Ilib SCRIPT ARGS` in a fresh process; returns its last line
  # of stdout parsed as JSON (raises with stderr if it failed).
  def run_json(script, *args, env: {})
    out, err, status = Open3.capture3(env, RbConfig.ruby, "-I", File.join(ROOT, "lib"), script, *args)
    raise "#{script} #{args.join(' ')} failed:\n#{err}" unless status.success?

    JSON.parse(out.lines.last, symbolize_names: true)
  end

  # Each run goes through every configuration, in orders that balance where
  # a configuration runs and what ran just before it within a round
  # (`orders`; the first of a round follows the last of the one before,
  # which is not balanced): a run leaves the machine a little slower or
  # faster for the next, and with plain rotations each configuration always
  # followed the same one, which a configuration compared with itself read
  # at 0.95x. The balance is whole when `runs` is a multiple of the orders'
  # number (n for n configurations, 2n for an odd n); it says so otherwise.
  def alternate(configs, runs)
    results = Hash.new { |h, k| h[k] = [] }
    return results if configs.empty?

    sequences = orders(configs.size)
    if runs > 1 && (runs % sequences.size).positive?
      warn "(#{runs} runs of #{configs.size} configurations: what runs before what is balanced every " \
           "#{sequences.size} runs)"
    end
    runs.times do |run|
      sequences[run % sequences.size].each do |index|
        config = configs[index]
        results[config] << yield(config)
        $stderr.print(".")
      end
    end
    $stderr.puts
    results
  end

  # A Williams design for `count` configurations: orders of 0...count in
  # which each stands at each position equally often and follows each other
  # one equally often (count orders for an even count; for an odd one, 2
  # count, each order next to its reverse, so that positions even out every
  # two).
  def orders(count)
    return [] if count < 1
    return [[0]] if count == 1

    first = [0]
    (1...count).each { |i| first << (i.odd? ? (i + 1) / 2 : count - (i / 2)) }
    rows = (0...count).map { |shift| first.map { |index| (index + shift) % count } }
    count.even? ? rows : rows.flat_map { |row| [row, row.reverse] }
  end

  def machine
    cpu = begin
      File.read("/proc/cpuinfo")[/^model name\s*:\s*(.+)$/, 1]
    rescue StandardError
      "unknown CPU"
    end
    memory = begin
      (File.read("/proc/meminfo")[/^MemTotal:\s+(\d+)/, 1].to_i / 1024.0 / 1024).round(1)
    rescue StandardError
      "?"
    end
    kernel = `uname -sr`.strip
    commit = `git -C #{ROOT} rev-parse --short HEAD 2>/dev/null`.strip
    "#{cpu}, #{Etc.nprocessors} cores, #{memory} GiB; #{kernel}; " \
      "ruby #{RUBY_VERSION} (#{RUBY_PLATFORM}); memprofiler_pprof_rs #{commit.empty? ? '?' : commit}; " \
      "#{Time.now.utc.strftime('%Y-%m-%d %H:%M UTC')}"
  end

  # Prints rows (arrays of strings) under headers, columns padded.
  def table(headers, rows)
    widths = headers.each_index.map { |i| ([headers[i]] + rows.map { |r| r[i].to_s }).map(&:size).max }
    line = lambda do |cells|
      cells.each_with_index.map { |c, i| i.zero? ? c.to_s.ljust(widths[i]) : c.to_s.rjust(widths[i]) }.join("  ")
    end
    puts line.call(headers)
    puts line.call(widths.map { |w| "-" * w })
    rows.each { |r| puts line.call(r) }
  end

  # A distribution-free 95% confidence interval for the median of
  # `values`: the order statistics k and n + 1 - k, with k the largest for
  # which Binomial(n, 1/2) puts at most 2.5% below k. Nil below 6 values,
  # where no such k exists.
  def median_interval(values)
    sorted = values.compact.sort
    n = sorted.size
    below = 0.0 # P(Binomial(n, 1/2) <= k - 1), growing with k
    k = 0
    (0...n).each do |j|
      below += binomial_half(n, j)
      break if below > 0.025

      k = j + 1
    end
    [sorted[k - 1], sorted[n - k]] if k.positive?
  end

  def binomial_half(n, j)
    (1..j).reduce(1r) { |c, i| c * (n - i + 1) / i } / (2r**n)
  end

  # Compiles bench/lib/NAME.c into DIR and returns the program's path;
  # aborts naming SCRIPT if the C compiler fails.
  def build_c(dir, name, script, *libraries)
    binary = File.join(dir, name)
    source = File.join(ROOT, "bench", "lib", "#{name}.c")
    compiler = RbConfig::CONFIG.fetch("CC", "cc").split.first
    system(compiler, "-O2", "-o", binary, source, *libraries) or abort "#{script}: #{compiler} failed on #{source}"
    binary
  end

  # bench/lib/wake_cost.c: a thread that only sleeps and wakes.
  def build_wake_cost(dir, script)
    build_c(dir, "wake_cost", script, "-lpthread")
  end

  def ratio(value, base)
    return "" if value.nil? || base.nil? || base.zero?

    format("%.2fx", value / base)
  end
end
