# frozen_string_literal: true

require "spec_helper"

# The defaults live once, in MemprofilerPprof::DEFAULTS (and EnvConfig's
# SETTINGS for the wrapper's own); these examples read each place in the
# docs that states one, so that a changed default cannot leave a stale
# number behind. A sentence rewritten so that its pattern no longer
# matches fails too: update the pattern with the text.
RSpec.describe "the documented defaults" do
  root = PROJECT_ROOT
  read = ->(path) { File.read(File.join(root, path)).gsub(/\s*\n\s*/, " ") }
  number = ->(text) { Float(text.delete(",_")).then { |f| f == f.round ? f.to_i : f } }
  # The docs give the defaults of Rubies before 4.0, and say that 4.0's
  # mode is :exact (LIGHT_MODE_SUPPORTED).
  defaults = MemprofilerPprof::DEFAULTS.merge(mode: :light)

  def ruby_value(text)
    text = text.strip
    return text.delete_prefix(":").to_sym if text.start_with?(":")
    return nil if text == "nil"

    Float(text.delete("_")).then { |f| text.match?(/\A[\d_]+\z/) ? f.to_i : f }
  end

  it "gives DEFAULTS whole in docs/api.md" do
    literal = read.call("docs/api.md")[/holds the defaults: `\{([^}]*)\}`/, 1]
    expect(literal).not_to be_nil
    documented = literal.split(",").to_h do |pair|
      key, value = pair.split(":", 2)
      [key.strip.to_sym, ruby_value(value)]
    end
    expect(documented).to eq(defaults)
  end

  it "shows the defaults in docs/api.md's Collector.new" do
    block = File.read(File.join(root, "docs/api.md"))[/MemprofilerPprof::Collector\.new\(\n(.*?)\n\)/m, 1]
    shown = block.lines.to_h do |line|
      key, value = line.split("#").first.strip.delete_suffix(",").split(":", 2)
      [key.to_sym, value]
    end
    defaults.each do |key, value|
      next if key == :window_budget # shown as :auto, which is the budget in light mode

      expect(ruby_value(shown.fetch(key))).to eq(value), "docs/api.md's Collector.new shows #{key}: #{shown[key]}"
    end
    expect(ruby_value(shown.fetch(:window_budget))).to eq(:auto)
  end

  it "agrees with EnvConfig and DEFAULTS in docs/production.md's settings table" do
    rows = File.read(File.join(root, "docs/production.md")).scan(%r{^\| `\w+` / `(\w+)` \| ([^|]+) \|})
    expect(rows.size).to be >= 12
    settings = MemprofilerPprof::EnvConfig::SETTINGS
    checked = rows.filter_map do |variable, shown|
      name = variable.downcase.to_sym
      next unless settings.key?(name)

      default = settings.fetch(name).first
      shown = shown.strip.delete("`")
      expected = case default
                 when nil then %w[random unlimited]
                 when :auto then ["auto (#{defaults[:window_budget].to_s.reverse.scan(/\d{1,3}/).join(',').reverse})"]
                 when true then ["false / 1"] # the flusher's keyword is false; the wrapper's variable is 1
                 when Integer then [default.to_s, number.call(shown) == default ? shown : default.to_s]
                 when Float then [default.to_s, "#{default.round} s"]
                 else [name == :mode ? "light" : default.to_s]
                 end
      expect(expected).to include(shown), "docs/production.md gives #{variable} the default #{shown.inspect}"
      name
    end
    expect(checked).to include(:sample_rate, :max_heap_samples, :max_alloc_samples, :mode, :window_budget,
                               :window_warm_up)
  end

  {
    "README.md" => [[/hooks every allocation for the first ([\d,]+) after/, :window_warm_up]],
    "ARCHITECTURE.md" => [[/the default is ([\d,]+) hooked allocations a second/, :window_budget],
                          [/allocations a second after a warm-up of ([\d,]+) allocations/, :window_warm_up]],
    "docs/api.md" => [[/NEWOBJ hook for the first ([\d,]+) allocations after/, :window_warm_up],
                      [/`window_budget: :auto`, the default, is ([\d,]+) in/, :window_budget],
                      [/as many as keep it near ([\d,]+) allocations a second/, :window_budget],
                      [/\(([\d,]+) samples at the default rate/, %i[window_warm_up sample_rate]]],
    "docs/production.md" => [[/`window_warm_up: ([\d_]+)`\) no hook watches frees/, :window_warm_up],
                             [/after the first ([\d,]+) allocations the allocation hook/, :window_warm_up]],
    "docs/reading-profiles.md" => [[/Past its first ([\d,]+) allocations, a busy process/, :window_warm_up]],
    "docs/performance.md" => [[/window budget of ([\d,]+) hooked allocations a second after a warm-up of [\d,]+/,
                               :window_budget],
                              [/window budget of [\d,]+ hooked allocations a second after a warm-up of ([\d,]+)/,
                               :window_warm_up]]
  }.each do |path, claims|
    it "states the defaults it names right in #{path}" do
      text = read.call(path)
      claims.each do |pattern, keys|
        found = text[pattern, 1]
        expect(found).not_to be_nil, "#{path} no longer says #{pattern.inspect}: update the spec with the text"
        expected = Array(keys).map { |key| defaults.fetch(key) }.inject(:*)
        expect(number.call(found)).to eq(expected), "#{path} says #{found} where the default is #{expected}"
      end
    end
  end

  it "writes the wrapper's --help from the same defaults" do
    usage = MemprofilerPprof::EnvConfig.usage.gsub(/\s+/, " ")
    expect(usage).to include("WINDOW_WARM_UP allocations hooked in full first (default: #{defaults[:window_warm_up]})",
                             "(default: auto, #{defaults[:window_budget]})",
                             "SAMPLE_RATE fraction of allocations sampled (default: #{defaults[:sample_rate]})",
                             "(default: #{MemprofilerPprof::DEFAULTS[:mode]})")
    expect(MemprofilerPprof::EnvConfig::HELP.keys).to eq(MemprofilerPprof::EnvConfig::SETTINGS.keys)
  end
end
