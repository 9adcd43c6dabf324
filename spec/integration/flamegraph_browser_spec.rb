# frozen_string_literal: true

require "rexml/document"

# Flame graphs of a real profile: the SVG, and the HTML page as a person
# sees it, opened in headless Chromium (spec/support/headless_chromium.rb).
# MEMPROFILER_SKIP_BROWSER=1 skips the browser examples (script/test-debian
# sets it: its root has no Chromium); otherwise a missing Chromium fails them.
RSpec.describe "Flame graphs", :slow do
  # Run in a child process, from a file, so the stacks are short and have a
  # file name: FlameSpecLeak#hold keeps 50 strings of 100 kB alive,
  # FlameSpecCache#fill 30.
  leak_script = <<~RUBY
    require "memprofiler_pprof_rs"

    class FlameSpecLeak
      def initialize
        @kept = []
      end

      def hold(count)
        count.times { @kept << ("L" * 100_000) }
        self
      end
    end

    class FlameSpecCache
      def fill(count)
        Array.new(count) { "C" * 100_000 }
      end
    end

    collector = MemprofilerPprof::Collector.new(sample_rate: 1.0)
    kept = nil
    data = collector.profile { kept = [FlameSpecLeak.new.hold(50), FlameSpecCache.new.fill(30)] }
    $stdout.binmode
    $stdout.write(data.pprof_data)
  RUBY

  match_color = [110, 150, 235] # page.js's MATCH_COLOR

  before(:all) do
    @dir = Dir.mktmpdir("flamegraph-spec")
    script = File.join(@dir, "flame_spec_leak.rb")
    File.write(script, leak_script)
    lib = File.join(PROJECT_ROOT, "lib")
    bytes, err, status = Open3.capture3(RbConfig.ruby, "-I", lib, script, binmode: true)
    raise "the profiling child failed: #{err}" unless status.success?

    @profile = MemprofilerPprof::Profile.parse(bytes)
  end

  after(:all) { FileUtils.rm_rf(@dir) }

  before do |example|
    if example.metadata[:browser] && ENV["MEMPROFILER_SKIP_BROWSER"] == "1"
      skip "MEMPROFILER_SKIP_BROWSER=1"
    elsif example.metadata[:browser] && HeadlessChromium.executable.nil?
      raise "Chromium is not installed: run script/bootstrap (or MEMPROFILER_SKIP_BROWSER=1 to skip)"
    end
  end

  let(:html) { @profile.flamegraph(sample_index: "inuse_space", format: :html) }
  let(:svg) { @profile.flamegraph(sample_index: "inuse_space", format: :svg) }

  # The page written to a file, opened in Chromium; yields the page.
  def open_page(&block)
    path = File.join(@dir, "flamegraph.html")
    File.write(path, html)
    HeadlessChromium.open(path, width: 1280, height: 900, &block)
  end

  def frames(page)
    page.evaluate("flamegraph.visibleFrames()")
  end

  # The outermost frame named `name`.
  def outermost(frames, name)
    frames.select { |f| f["name"] == name }.min_by { |f| f["depth"] } or
      raise "no frame #{name} among #{frames.map { |f| f['name'] }.uniq}"
  end

  def centre(frame)
    [frame["x"] + (frame["width"] / 2), frame["y"] + (frame["height"] / 2)]
  end

  def svg_fill(svg_doc, name)
    group = REXML::XPath.match(svg_doc, "//g").find { |g| g.elements["title"]&.text&.start_with?("#{name}\n") }
    group.elements["rect"].attributes["fill"].scan(/\d+/).map(&:to_i)
  end

  def pixel(image, x, y)
    image.rows[y.round][x.round * image.channels, 3]
  end

  it "writes a page that refers to nothing outside itself" do
    expect(html).to start_with("<!DOCTYPE html>")
    expect(html).to include('<script type="application/json" id="flamegraph-data">')
    expect(html).not_to match(/\ssrc=/)
    expect(html.scan(/\shref="([^"]*)"/).flatten).to all(start_with("data:"))
    expect(html).not_to match(%r{(https?:)?//[a-z0-9.-]+\.[a-z]{2,}/}i)
  end

  it "writes a well-formed SVG naming the frames" do
    doc = REXML::Document.new(svg)
    expect(doc.root.name).to eq("svg")
    expect(doc.root.attributes["width"]).to eq("1200")
    titles = REXML::XPath.match(doc, "//g/title").map(&:text)
    labels = REXML::XPath.match(doc, "//text").map(&:text)
    %w[FlameSpecLeak#hold FlameSpecCache#fill String#*].each do |name|
      expect(titles).to include(start_with("#{name}\n"))
      expect(labels).to include(name)
    end
    expect(titles).to include(match(/\Aall \(\S+ \S+\)\n/))
  end

  it "draws the frames visibly and loads nothing", :browser do
    open_page do |page|
      shot = page.screenshot(File.join(@dir, "page.png"))
      expect(File.size(shot)).to be > 10_000
      image = HeadlessChromium::Png.read(shot)
      counts = image.pixels.tally
      expect(counts.size).to be > 50
      expect(counts.values.max).to be < image.width * image.height * 0.9

      viewport = page.evaluate("[innerWidth, innerHeight]")
      all = frames(page)
      names = all.map { |f| f["name"] }
      expect(names).to include("all", "<main>", "FlameSpecLeak#hold", "FlameSpecCache#fill", "String#*")
      %w[all FlameSpecLeak#hold FlameSpecCache#fill].each do |name|
        frame = outermost(all, name)
        expect(frame["width"]).to be > 100
        expect(frame["x"]).to be >= 0
        expect(frame["y"]).to be >= 0
        expect(frame["x"] + frame["width"]).to be <= viewport[0]
        expect(frame["y"] + frame["height"]).to be <= viewport[1]
        expect(frame["label"]).to eq(name) unless name == "all"
        expect(page.evaluate("flamegraph.frameAt(#{centre(frame).join(', ')})")["name"]).to eq(name)
      end
      # The root's label comes from Rust (units.rs), the rest of the page's
      # numbers from page.js's copy of it: they must agree.
      root = outermost(all, "all")
      expect(root["label"]).to match(/\Aall \(\S+ MB\)\z/)
      expect(root["label"]).to eq("all (#{page.evaluate("flamegraph.formatValue(#{root['value']})")})")
      { 0 => "0 B", 999 => "999 B", 1536 => "1.50 kB", (12 << 20) + (400 << 10) => "12.4 MB",
        300 << 20 => "300 MB", -2048 => "-2.00 kB" }.each do |bytes, text|
        expect(page.evaluate("flamegraph.formatValue(#{bytes})")).to eq(text)
      end

      # Hold is drawn in the color the SVG gives it (page.js and
      # flamegraph/svg.rs hash names the same way).
      hold = outermost(all, "FlameSpecLeak#hold")
      expect(pixel(image, hold["x"] + 2, hold["y"] + 2)).to eq(svg_fill(REXML::Document.new(svg), "FlameSpecLeak#hold"))

      # Hovering shows name, file, value and share.
      page.hover(*centre(hold))
      tooltip = page.evaluate("document.getElementById('tooltip').hidden ? null : document.getElementById('tooltip').innerText")
      expect(tooltip).to include("FlameSpecLeak#hold", "flame_spec_leak.rb")
      expect(tooltip).to match(/[\d.]+ (kB|MB) \(\d+\.\d%\) inuse_space/)

      expect(page.requests).to be_empty
    end
  end

  it "zooms into a clicked frame, keeping its callers as context", :browser do
    open_page do |page|
      before = frames(page)
      root = outermost(before, "all")
      hold = outermost(before, "FlameSpecLeak#hold")
      expect(hold["width"]).to be < root["width"] * 0.8

      page.click(*centre(hold))
      after = frames(page)
      zoomed = outermost(after, "FlameSpecLeak#hold")
      expect(zoomed["zoomed"]).to be(true)
      expect(zoomed["x"]).to be_within(1).of(root["x"])
      expect(zoomed["width"]).to be_within(1).of(root["width"])
      callers = after.select { |f| f["depth"] < zoomed["depth"] }
      expect(callers.map { |f| f["name"] }).to include("all", "<main>")
      expect(callers).to all(include("context" => true))
      expect(callers.map { |f| f["width"] }).to all(be_within(1).of(root["width"]))
      expect(after.map { |f| f["name"] }).not_to include("FlameSpecCache#fill")

      # The root zooms back out; so does Reset zoom.
      page.click(*centre(outermost(after, "all")))
      expect(frames(page).map { |f| f["name"] }).to include("FlameSpecCache#fill")
      page.click(*centre(hold))
      reset = page.evaluate("(() => { const r = document.getElementById('reset').getBoundingClientRect(); " \
                            "return [r.x + r.width / 2, r.y + r.height / 2]; })()")
      page.click(*reset)
      expect(outermost(frames(page), "all")["zoomed"]).to be(true)
    end
  end

  it "shows what holds the clicked frame's memory, from a retention report beside the profile", :browser do
    report = MemprofilerPprof::RetentionReport.from_h(
      "sites" => [
        { "site" => "FlameSpecLeak#hold (flame_spec_leak.rb:9)", "inuse_bytes" => 5_000_000, "inuse_objects" => 50,
          "objects" => [{ "class" => "String", "root" => { "kind" => "toplevel_local", "name" => "kept" },
                          "path" => [{ "class" => "Array", "kind" => "index", "ref" => "0" },
                                     { "class" => "FlameSpecLeak", "kind" => "ivar", "ref" => "@kept" },
                                     { "class" => "Array", "kind" => "index", "ref" => "7" }] }] },
        { "site" => "FlameSpecCache#fill (flame_spec_leak.rb:15)", "inuse_bytes" => 3_000_000,
          "inuse_objects" => 30, "objects" => [{ "class" => "String", "path" => nil }] }
      ]
    )
    path = File.join(@dir, "retainers.html")
    File.write(path, @profile.flamegraph(sample_index: "inuse_space", format: :html, retainers: report))
    HeadlessChromium.open(path, width: 1280, height: 900) do |page|
      everything = page.evaluate("flamegraph.retainersText()")
      expect(everything).to include("FlameSpecLeak#hold (flame_spec_leak.rb:9)", "FlameSpecCache#fill")
      page.click(*centre(outermost(frames(page), "FlameSpecLeak#hold")))
      held = page.evaluate("flamegraph.retainersText()")
      expect(held).to include("String: the main script's local variable kept -> Array[0] -> FlameSpecLeak\#@kept -> " \
                              "Array[7] -> String")
      expect(held).not_to include("FlameSpecCache#fill")
      expect(page.evaluate("document.getElementById('retainers-hint').textContent"))
        .to eq("What holds the memory allocated in FlameSpecLeak#hold.")
    end
  end

  it "lists the functions, sorted by the clicked column", :browser do
    open_page do |page|
      table = "Array.from(document.querySelectorAll('#functions tbody tr'), r => Array.from(r.cells, c => c.textContent))"
      rows = page.evaluate(table)
      expect(rows.map { |r| r[4] }).to include("FlameSpecLeak#hold", "FlameSpecCache#fill", "String#*")
      expect(rows.first[4]).to eq("String#*") # largest flat value first
      expect(rows.first[1]).to match(/\A\d+\.\d%\z/)

      header = page.evaluate("(() => { const r = document.querySelector('th[data-sort=name]').getBoundingClientRect(); " \
                             "return [r.x + r.width / 2, r.y + r.height / 2]; })()")
      page.click(*header)
      names = page.evaluate(table).map { |r| r[4] }
      expect(names).to eq(names.sort)
      page.click(*header)
      expect(page.evaluate(table).map { |r| r[4] }).to eq(names.sort.reverse)
    end
  end

  it "highlights what the search matches and shows its share", :browser do
    open_page do |page|
      page.type("#search", "flamespecleak")
      all = frames(page)
      highlighted = all.select { |f| f["highlighted"] }.map { |f| f["name"] }.uniq
      expect(highlighted).to include("FlameSpecLeak#hold")
      expect(highlighted).to all(include("FlameSpecLeak"))

      hold = outermost(all, "FlameSpecLeak#hold")
      root = outermost(all, "all")
      share = page.evaluate("flamegraph.formatPercent(#{hold['value']}, #{root['value']})")
      expect(share.to_f).to be_between(40, 80) # 5 MB of 8
      expect(page.evaluate("flamegraph.matchText()")).to eq(
        "Matched: #{share} (#{page.evaluate("flamegraph.formatValue(#{hold['value']})")})"
      )
      expect(page.evaluate("document.getElementById('matches').getBoundingClientRect().width")).to be > 0

      image = HeadlessChromium::Png.read(page.screenshot(File.join(@dir, "search.png")))
      expect(pixel(image, hold["x"] + 2, hold["y"] + 2)).to eq(match_color)
    end
  end
end
