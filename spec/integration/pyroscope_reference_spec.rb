# frozen_string_literal: true

require "json"
require "net/http"
require "open3"
require "securerandom"
require "tmpdir"

# Our profiles beside a Go service's, on the same real Grafana Pyroscope:
# `script/pyroscope run -- rspec spec/integration/pyroscope_reference_spec.rb`, which
# script/test runs when there is a Go 1.25 or newer. The Go service is
# spec/pyroscope_reference/ (pyroscope-go v1.5.0, its heap profile from
# godeltaprof), built by `script/pyroscope go-reference`. Both push three
# profiles a second or more apart, allocating 2,000 objects each time and
# keeping them until the next. What the examples pin is written up in
# docs/pyroscope-protocol.md, "A Go service as the reference".
url = ENV.fetch("PYROSCOPE_URL", nil)
multitenant = ENV.fetch("PYROSCOPE_MULTITENANT", "0") == "1"

# The querier calls and the two services' pushes.
module PyroscopeReferenceHelpers
  MEMORY_TYPES = %w[memory:alloc_objects:count:space:bytes memory:alloc_space:bytes:space:bytes
                    memory:inuse_objects:count:space:bytes memory:inuse_space:bytes:space:bytes].freeze
  TYPE_NAMES = %w[alloc_objects alloc_space inuse_objects inuse_space].freeze
  PUSHES = 3
  GO_WORKLOAD_STACK = %w[main.allocateGophersForPyroscope main.main runtime.main].freeze
  # Series labels pyroscope-go adds, with '.' made '_' by the server: the
  # SDK's otel.scope.* and process.runtime.*, and /ingest's pyroscope_spy.
  GO_ONLY_LABELS = %w[otel_scope_name otel_scope_version process_runtime_name process_runtime_version
                      pyroscope_spy].freeze

  # A querier call (Connect protocol, JSON); times in milliseconds.
  def query(url, method, body)
    response = Net::HTTP.post(URI("#{url}/querier.v1.QuerierService/#{method}"), JSON.generate(body),
                              "Content-Type" => "application/json")
    raise "#{method}: #{response.code} #{response.body}" unless response.code == "200"

    JSON.parse(response.body)
  end

  def allocate_widgets_beside_go = Array.new(2_000) { |i| "widget #{i}" * 2 }

  # Builds (once: script/pyroscope caches it) and starts the Go service;
  # returns its pid and the files it writes.
  def start_go_reference(url, app, dir)
    binary, log, status = Open3.capture3(File.join(PROJECT_ROOT, "script/pyroscope"), "go-reference")
    raise "script/pyroscope go-reference failed (#{status.exitstatus}):\n#{log}" unless status.success?

    out = File.join(dir, "go.json")
    err = File.join(dir, "go.log")
    pid = Process.spawn({ "PYROSCOPE_URL" => url }, binary.lines.last.strip, "-app", app, "-tag", "env=e2e",
                        "-cycles", PUSHES.to_s, "-timeout", "20s", "-save", dir, out: out, err: err)
    [pid, out, err]
  end

  # Our three pushes, a second or more apart, from one Collector: each
  # flush's alloc_* cover the interval since the previous one, and inuse_*
  # are the widgets kept from this round (the previous round's are freed
  # by the GC before the flush). The flushes are PyroscopeFlusher's, the
  # class as the leaf frame (sample_labels: :class_frame). Returns the
  # ProfileData pushed.
  def push_ours(url, app)
    collector = MemprofilerPprof::Collector.new(sample_rate: 1.0)
    uploader = MemprofilerPprof::PyroscopeUploader.new(server_address: url, application_name: app, labels: { env: "e2e" })
    flushes = []
    collector.start!
    kept = nil
    PUSHES.times do |i|
      sleep(1.05) unless i.zero?
      kept = allocate_widgets_beside_go
      GC.start
      flushes << collector.flush(sample_labels: :class_frame)
      result = uploader.upload(flushes.last)
      raise "push #{i + 1}: #{result.inspect}" unless result.ok?
    end
    raise "the widgets went early" unless kept.size == 2_000

    flushes
  ensure
    collector&.stop!
  end

  def selector(app) = "{service_name=\"#{app}\"}"

  # SelectMergeProfile, as [sample type, unit], [period type, unit], the
  # total, and the function names of the heaviest stack (leaf first).
  def merged(url, app, type, range)
    profile = query(url, "SelectMergeProfile",
                    { profileTypeID: type, labelSelector: selector(app), start: range.first, end: range.last })
    strings = profile.fetch("stringTable")
    pair = ->(value_type) { [strings[value_type["type"].to_i], strings[value_type["unit"].to_i]] }
    functions = profile.fetch("function", []).to_h { |f| [f["id"], strings[f["name"].to_i]] }
    names = profile.fetch("location", []).to_h { |l| [l["id"], functions[l.dig("line", 0, "functionId")]] }
    by_stack = Hash.new(0)
    profile.fetch("sample", []).each { |s| by_stack[s["locationId"].map { |id| names[id] }] += s["value"].first.to_i }
    heaviest, heaviest_value = by_stack.max_by { |_, v| v } || [[], 0]
    { sample_types: profile.fetch("sampleType").map(&pair), period_type: pair.call(profile.fetch("periodType")),
      total: by_stack.values.sum, heaviest: heaviest, heaviest_value: heaviest_value }
  end

  # Around one pushed profile's time (pprof time_nanos, which the server
  # keeps), in milliseconds: from halfway after the push before it to
  # halfway before the next (300 ms at either end). pyroscope-go's pushes
  # follow a ticker, which a loaded machine can read late: two may come
  # closer than a second.
  def window(profile, all)
    times = all.map { |p| p.time_nanos / 1_000_000 }.sort
    raise "two pushes in one millisecond: #{times.inspect}" unless times.uniq.size == times.size

    at = profile.time_nanos / 1_000_000
    before = times.select { |t| t < at }.max
    after = times.select { |t| t > at }.min
    [before ? ((before + at) / 2) + 1 : at - 300, after ? (at + after) / 2 : at + 300]
  end

  # SelectSeries' AVERAGE of one type over all the pushes, as one point.
  # The step is whole seconds and the range whole steps: Pyroscope v1.12.0
  # leaves out profiles after the last step that fits in the range, and
  # with a fractional step its query-frontend may split the range at a
  # boundary where each part also reads the step before it, counting a
  # profile twice.
  def average(url, app, type, profiles)
    first, last = profiles.map { |p| p.time_nanos / 1_000_000 }.minmax
    start = first - 500
    step = ((last - start) / 1000.0).ceil + 1
    body = { profileTypeID: type, labelSelector: selector(app), start: start, end: start + (step * 1000), step: step,
             aggregation: "TIME_SERIES_AGGREGATION_TYPE_AVERAGE" }
    query(url, "SelectSeries", body).fetch("series", []).flat_map { |s| s.fetch("points", []) }.map { |p| p["value"].to_f }
  end

  # Waits until every push of both services can be queried.
  def wait_for_pushes(url, expected, range, deadline: 20)
    give_up = Process.clock_gettime(Process::CLOCK_MONOTONIC) + deadline
    loop do
      seen = expected.to_h { |app, _| [app, merged(url, app, MEMORY_TYPES[2], range)[:total]] }
      return if seen == expected
      if Process.clock_gettime(Process::CLOCK_MONOTONIC) > give_up
        raise "inuse_objects after #{deadline} s: #{seen.inspect}, pushed #{expected.inspect}"
      end

      sleep 0.2
    end
  end
end

RSpec.describe "a Go service (pyroscope-go) beside ours on a real Grafana Pyroscope", if: url && !multitenant do
  include PyroscopeReferenceHelpers

  types = PyroscopeReferenceHelpers::MEMORY_TYPES
  names = PyroscopeReferenceHelpers::TYPE_NAMES
  pushes = PyroscopeReferenceHelpers::PUSHES

  # Both services push once, concurrently (about 4 s); the examples only query.
  before(:all) do
    @apps = { go: "memprofiler-ref-go-#{SecureRandom.hex(4)}", ours: "memprofiler-ref-ours-#{SecureRandom.hex(4)}" }
    @dir = Dir.mktmpdir("pyroscope_reference")
    pid, out, err = start_go_reference(url, @apps[:go], @dir)
    begin
      flushes = push_ours(url, @apps[:ours])
    ensure
      _, status = Process.wait2(pid)
    end
    raise "the Go reference failed (#{status.inspect}):\n#{File.read(err)}" unless status.success?

    @go_run = JSON.parse(File.read(out))
    go_files = Dir[File.join(@dir, "upload-*.pb.gz")].sort_by { |f| f[/(\d+)\.pb\.gz\z/, 1].to_i }
    @pushed = { ours: flushes.map { |d| MemprofilerPprof::PprofReader.parse(d.pprof_data) },
                go: go_files.map { |f| MemprofilerPprof::PprofReader.parse(File.binread(f)) } }
    raise "Go pushed #{@pushed[:go].size} profiles, not #{pushes}" unless @pushed[:go].size == pushes

    started = [@go_run.fetch("started_at_ms"), (flushes.first.started_at.to_f * 1000).floor].min
    @range = [started - 1000, (Time.now.to_f * 1000).ceil + 1000]
    wait_for_pushes(url, @apps.to_h { |service, app| [app, pushed_total(service, "inuse_objects")] }, @range)
  end

  after(:all) { FileUtils.remove_entry(@dir) if @dir }

  def pushed_total(service, name) = @pushed[service].sum { |p| p.total(name) }

  it "stores the same four memory profile types for both" do
    @apps.each do |service, app|
      found = query(url, "Series", { matchers: [selector(app)], labelNames: ["__profile_type__"],
                                     start: @range.first, end: @range.last })
      ids = found.fetch("labelsSet", []).flat_map { |s| s["labels"].map { |l| l["value"] } }.uniq.sort
      expect(ids).to eq(types.sort), "#{service}: #{ids.inspect}"
    end
  end

  it "has the same sample types, units and period type, as pushed and as given back" do
    go, ours = @pushed.values_at(:go, :ours).map(&:first)
    expect(go.sample_types.map(&:to_a)).to eq(ours.sample_types.map(&:to_a))
    expect(ours.sample_types.map(&:to_a)).to eq(names.zip(%w[count bytes count bytes]))
    expect([go.period_type.to_a, ours.period_type.to_a]).to eq([%w[space bytes]] * 2)

    types.zip(names).each do |type, name|
      go_merged, ours_merged = @apps.values_at(:go, :ours).map { |app| merged(url, app, type, @range) }
      expect(go_merged.values_at(:sample_types, :period_type)).to eq(ours_merged.values_at(:sample_types, :period_type))
      expect(ours_merged[:sample_types].map(&:first)).to eq([name])
    end
  end

  it "has the same series labels, apart from those pyroscope-go adds" do
    label_names = @apps.transform_values do |app|
      query(url, "LabelNames", { matchers: [selector(app)], start: @range.first, end: @range.last }).fetch("names")
    end
    # Pyroscope makes every string pprof sample label a series label. Go's
    # heap profile has only the numeric `bytes`; ours, flushed with
    # :class_frame, none (:keep's `class` would be one more series label).
    string_labels = @pushed.values.flatten.flat_map { |p| p.samples.flat_map(&:labels) }.reject { |l| l.str.to_s.empty? }
    expect(string_labels).to be_empty
    expect(label_names[:go]).to include(*PyroscopeReferenceHelpers::GO_ONLY_LABELS)
    expect(label_names[:go] - PyroscopeReferenceHelpers::GO_ONLY_LABELS).to eq(label_names[:ours])
    # __delta__ (ours sends it, /ingest adds it for Go) is read and dropped;
    # Go's __session_id__ is dropped too (max_sessions_per_series is 0).
    expect(label_names.values.flatten & %w[__delta__ __session_id__]).to be_empty
    @apps.each_value do |app|
      envs = query(url, "LabelValues", { name: "env", matchers: [selector(app)], start: @range.first, end: @range.last })
      expect(envs.fetch("names")).to eq(["e2e"])
    end
  end

  # Each push as pushed, and a range of them merged: their sum.
  def expect_each_push_and_their_sum(url, service, name)
    type = PyroscopeReferenceHelpers::MEMORY_TYPES[PyroscopeReferenceHelpers::TYPE_NAMES.index(name)]
    app = @apps[service]
    each_push = @pushed[service].map { |p| merged(url, app, type, window(p, @pushed[service]))[:total] }
    expect(each_push).to eq(@pushed[service].map { |p| p.total(name) }), "#{service} #{name}"
    expect(merged(url, app, type, @range)[:total]).to eq(pushed_total(service, name)), "#{service} #{name}"
  end

  it "keeps each push's alloc_* as the interval's own, for both: a range sums them" do
    @apps.each_key { |service| %w[alloc_objects alloc_space].each { |name| expect_each_push_and_their_sum(url, service, name) } }
  end

  it "keeps each push's inuse_* as a snapshot, for both: a merged range is the sum of the snapshots" do
    @apps.each_key { |service| %w[inuse_objects inuse_space].each { |name| expect_each_push_and_their_sum(url, service, name) } }
    # Go's workload keeps 2,000 objects of 1 KiB and the slice holding them
    # (2,001 at each push, every allocation recorded): the merged range has
    # each push's.
    go_workload = @pushed[:go].map do |p|
      p.samples.select { |s| s.frames.first&.name == "main.allocateGophersForPyroscope" }.sum { |s| s.value(p, "inuse_objects") }
    end
    expect(go_workload).to all(be_positive)
    workload = merged(url, @apps[:go], types[2], @range)
    expect(workload.values_at(:heaviest_value, :heaviest)).to eq([go_workload.sum, PyroscopeReferenceHelpers::GO_WORKLOAD_STACK])
  end

  # AVERAGE is over the rows of a step, a row being one series of one push:
  # the level only while each push is one series (with :keep's `class`
  # label ours would be divided by the number of classes too).
  it "gives the level of in-use as SelectSeries' AVERAGE over the pushes, for both" do
    @apps.each do |service, app|
      %w[inuse_objects inuse_space].each do |name|
        level = pushed_total(service, name).fdiv(pushes)
        averages = average(url, app, types[names.index(name)], @pushed[service])
        expect(averages).to match([be_within(1e-6 * level).of(level)]), "#{service} #{name}"
      end
    end
  end

  it "puts each service's workload in its heaviest alloc and in-use stacks" do
    { go: "main.allocateGophersForPyroscope", ours: "allocate_widgets_beside_go" }.each do |service, function|
      types.each do |type|
        stack = merged(url, @apps[service], type, @range)[:heaviest]
        expect(stack.grep(/#{function}/)).not_to be_empty, "#{service} #{type}: heaviest stack #{stack.inspect}"
      end
    end
  end
end
