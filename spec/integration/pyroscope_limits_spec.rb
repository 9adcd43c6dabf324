# frozen_string_literal: true

require "json"
require "net/http"
require "securerandom"

# The limits of a real Grafana Pyroscope (v1.12.0), the statuses it answers
# them with, and what the uploader and the flusher do against them. A
# tenant per example (so each has its own rate bucket and series count):
# these examples need `script/pyroscope run --multitenant`. script/test runs
# them at the server's defaults and at small limits:
#
#   script/pyroscope run --multitenant -- rspec spec/integration/pyroscope_limits_spec.rb
#   script/pyroscope run --multitenant --server-flag=-validation.max-profile-size-bytes=100000 ... -- rspec ...
#
# PYROSCOPE_LIMITS (script/pyroscope's --server-flag values) says which
# limits are in force; each example is defined only where its own are.
url = ENV.fetch("PYROSCOPE_URL", nil)

# Sixty named classes for the samples-limit example.
module PyroscopeLimitClasses
  60.times { |i| const_set(:"C#{i}", Class.new) }
end
multitenant = ENV.fetch("PYROSCOPE_MULTITENANT", "0") == "1"

# The limits in force: the server's defaults (pkg/validation/limits.go)
# overridden by PYROSCOPE_LIMITS. Sizes in bytes (the server's MB are MiB),
# times in seconds.
PyroscopeLimits = Struct.new(:rate_bytes, :burst_bytes, :size_bytes, :samples, :series, :older, :newer,
                             keyword_init: true) do
  def self.default_flags
    { "distributor.ingestion-rate-limit-mb" => "4", "distributor.ingestion-burst-size-mb" => "2",
      "validation.max-profile-size-bytes" => "4194304", "validation.max-profile-stacktrace-samples" => "16000",
      "ingester.max-global-series-per-tenant" => "5000",
      "validation.reject-older-than" => "1h", "validation.reject-newer-than" => "10m" }
  end

  def self.from(flags)
    given = flags.to_s.split.to_h { |flag| flag.delete_prefix("-").split("=", 2) }
    value = default_flags.merge(given.slice(*default_flags.keys))
    mib = 1024 * 1024
    new(rate_bytes: (Float(value["distributor.ingestion-rate-limit-mb"]) * mib).to_i,
        burst_bytes: (Float(value["distributor.ingestion-burst-size-mb"]) * mib).to_i,
        size_bytes: Integer(value["validation.max-profile-size-bytes"]),
        samples: Integer(value["validation.max-profile-stacktrace-samples"]),
        series: Integer(value["ingester.max-global-series-per-tenant"]),
        older: seconds(value["validation.reject-older-than"]), newer: seconds(value["validation.reject-newer-than"]))
  end

  # Go durations as these flags take them: 1h, 10m, 90s, 1h30m.
  def self.seconds(text)
    units = { "h" => 3600, "m" => 60, "s" => 1 }
    text.scan(/(\d+(?:\.\d+)?)([hms])/).sum { |number, unit| Float(number) * units.fetch(unit) }
  end

  # The server's defaults: those PyroscopeFlusher's defaults are for.
  def defaults?
    self == self.class.from("")
  end
end

# Profiles of a chosen size, sample count or time, and pushes that report
# the server's answer.
module PyroscopeLimitsHelpers
  TYPES = [%w[alloc_objects count], %w[alloc_space bytes], %w[inuse_objects count], %w[inuse_space bytes]].freeze
  CONNECT_STATUS = { "invalid_argument" => 400, "resource_exhausted" => 429 }.freeze

  def now_nanos(offset = 0) = ((Time.now.to_f + offset) * 1e9).to_i

  # Gzipped pprof of `count` one-frame samples, about `raw_bytes`
  # uncompressed (long function names: the gzip stays a few KB).
  def profile_of(raw_bytes: nil, count: 40, time_nanos: now_nanos, labels: false)
    name_bytes = raw_bytes ? [(raw_bytes / count) - 60, 1].max : 1
    samples = Array.new(count) do |i|
      { stack: [["m#{i}_#{'x' * name_bytes}", "limits.rb", i + 1, 1]], values: [1, 8, 1, 8],
        class: labels ? "C#{i}" : nil }
    end
    PprofWriter.build(sample_types: TYPES, samples: samples, time_nanos: time_nanos, period_type: %w[space bytes],
                      period: 1)
  end

  def raw_size(gzipped) = MemprofilerPprof::Profile.gunzip(gzipped).bytesize

  def uploader(api, tenant: @tenant, **options)
    MemprofilerPprof::PyroscopeUploader.new(server_address: @url, application_name: @app, api: api,
                                            tenant_id: tenant, logger: logger, retry_base_delay: 0.01, **options)
  end

  # The statuses of every attempt, from the uploader's log (one line per
  # failed attempt) and its result.
  def attempts_of(result, lines)
    failed = lines.map { |line| line[/answered (\d+):/, 1].to_i }
    result.ok? ? failed + [result.status] : failed
  end

  def logger = (@logger ||= ListLogger.new)

  def logged = Array.new(logger.errors.size) { logger.errors.pop }

  # Uploads `bytes` and returns [result, statuses of its attempts, log lines].
  def upload(api, bytes, **options)
    result = uploader(api, **options).upload(bytes)
    lines = logged
    [result, attempts_of(result, lines), lines]
  end

  # One request as the uploader makes it, in a tenant of its own: [status,
  # Content-Type, the whole body] (the log keeps 300 characters).
  def answer(api, bytes)
    request = uploader(api, tenant: "limits-#{SecureRandom.hex(4)}").send(:build_request, bytes, Time.now, Time.now)
    response = Net::HTTP.start(URI(@url).host, URI(@url).port) { |http| http.request(request) }
    [response.code.to_i, response["Content-Type"], JSON.parse(response.body)]
  end

  # The server's whole answer to `bytes`: push's Connect error (`code`, and
  # its HTTP status), or /ingest's 422 wrapping it; the message has `words`.
  def expect_refused(bytes, code, words)
    { push: [CONNECT_STATUS.fetch(code), code, ""], ingest: [422, "unknown", "pushing IngestInput-pprof failed #{code}: "] }
      .each do |api, (status, shown_code, prefix)|
        got_status, type, body = answer(api, bytes)
        expect([got_status, type, body["code"]]).to eq([status, "application/json", shown_code]), body.inspect
        expect(body["message"]).to start_with(prefix).and include(words)
      end
  end

  # A module of `methods` generated methods: site_i(level, sink) calls
  # another `level` deep before allocating, so distinct methods make
  # distinct deep stacks.
  def generated_call_sites(methods)
    holder = Module.new
    methods.times do |i|
      holder.module_eval(<<~RUBY, "generated/site#{i % 97}.rb", (i * 3) + 1)
        def self.site#{i}(level, sink)
          return sink << "s#{i}" * 2 << [#{i}] << { k: #{i} } if level.zero?

          site#{((i * 7) + 3) % methods}(level - 1, sink)
        end
      RUBY
    end
    holder
  end

  # A flusher to this example's tenant whose flushes land in `flushed`.
  def pyroscope_flusher(collector, flushed, **options)
    MemprofilerPprof::PyroscopeFlusher.new(collector, server_address: @url, application_name: @app,
                                                      tenant_id: @tenant, logger: logger, interval: 30,
                                                      retry_base_delay: 0.01, on_flush: ->(data) { flushed << data },
                                                      **options)
  end
end

if url && multitenant
  flags = ENV.fetch("PYROSCOPE_LIMITS", "")
  limits = PyroscopeLimits.from(flags)

  RSpec.describe "the limits of a real Grafana Pyroscope (#{flags.empty? ? 'its defaults' : flags})" do
    include PyroscopeLimitsHelpers

    before do
      @url = url
      @tenant = "limits-#{SecureRandom.hex(4)}"
      @app = "memprofiler-limits-#{SecureRandom.hex(4)}"
    end

    # The rate limiter counts the uncompressed profile plus the label bytes
    # and comes first: above the burst, nothing else is looked at.
    it "answers a profile above the ingestion burst with 429 on push, 422 on /ingest, on every attempt" do
      sizes = [limits.burst_bytes + 50_000]
      sizes << (limits.size_bytes + 50_000) if limits.size_bytes > limits.burst_bytes
      sizes.each do |size|
        bytes = profile_of(raw_bytes: size)
        expect(bytes.bytesize).to be < 20_000 # the gzip is small: the limits count uncompressed bytes
        # The same words as for a burst that passes later: nothing says this one never will.
        expect_refused(bytes, "resource_exhausted", "push rate limit (")
        expect(answer(:push, bytes)[2]["message"]).to match(/\Apush rate limit \(\S+ [KM]iB\) exceeded while adding \S+ [KM]iB\z/)

        # Retried (on /ingest too: the rate limit said in a 422), uselessly.
        { push: 429, ingest: 422 }.each do |api, status|
          result, statuses, = upload(api, bytes, retries: 1)
          expect([result.ok?, statuses]).to eq([false, [status, status]])
        end
      end
    end

    if limits.size_bytes < limits.burst_bytes - 20_000
      it "answers a profile above max-profile-size-bytes (uncompressed, as we count) with 400, 422 on /ingest, once" do
        bytes = profile_of(raw_bytes: limits.size_bytes + 10_000)
        raw = raw_size(bytes)
        expect_refused(bytes, "invalid_argument",
                       "exceeds the size limit (max_profile_size_byte, actual: #{raw}, limit: #{limits.size_bytes})")
        %i[push ingest].each do |api|
          @tenant = "limits-#{SecureRandom.hex(4)}" # a full bucket: the refused profile took from it
          result, statuses, = upload(api, bytes)
          expect([result.attempts, statuses]).to eq([1, [api == :push ? 400 : 422]])
        end
      end
    end

    sample_bytes = limits.samples * 45
    if limits.samples.positive? && sample_bytes < [limits.burst_bytes, limits.size_bytes].min
      it "answers a profile of one sample more than max-profile-stacktrace-samples with 400, 422 on /ingest, once" do
        over = profile_of(count: limits.samples + 1)
        expect_refused(over, "invalid_argument", "exceeds the samples count limit (max_profile_stacktrace_samples, " \
                                                 "actual: #{limits.samples + 1}, limit: #{limits.samples})")
        %i[push ingest].each do |api|
          @tenant = "limits-#{SecureRandom.hex(4)}"
          result, statuses, = upload(api, over)
          expect([result.attempts, statuses]).to eq([1, [api == :push ? 400 : 422]])
          expect(upload(api, profile_of(count: limits.samples)).first).to be_ok
        end
      end
    end

    it "answers a profile stamped outside the ingestion window with 400, 422 on /ingest, once" do
      [-limits.older - 120, limits.newer + 120].each do |offset|
        bytes = profile_of(time_nanos: now_nanos(offset))
        expect_refused(bytes, "invalid_argument", "is outside of ingestion window (profile timestamp: ")
        %i[push ingest].each do |api|
          # /ingest's from/until do not matter: our profiles carry time_nanos.
          result, statuses, = upload(api, bytes)
          expect([result.attempts, statuses]).to eq([1, [api == :push ? 400 : 422]])
        end
      end
      expect(upload(:push, profile_of(time_nanos: now_nanos(-limits.older + 120))).first).to be_ok
    end

    # A push within the burst, right after another: refused until the
    # bucket refills at the rate. Only where that takes long enough (1.5 to
    # 8 s) that the uploader's first attempt surely finds the bucket short.
    size = (0.9 * [limits.burst_bytes, limits.size_bytes].min).to_i
    refill = ((2 * size) - limits.burst_bytes).fdiv(limits.rate_bytes)
    if refill.between?(1.5, 8)
      it "answers a burst with 429 (422 on /ingest), and the uploader's retries pass once the bucket refills" do
        bytes = profile_of(raw_bytes: size)
        %i[push ingest].each do |api|
          @tenant = "limits-#{SecureRandom.hex(4)}"
          first, = upload(api, bytes, retries: 0)
          expect(first).to be_ok
          # The uploader's default base delay, and retries enough for `refill`.
          result, statuses, lines = upload(api, bytes, retries: 12, retry_base_delay: 0.5)
          expect(result).to be_ok, lines.join("\n")
          expect(statuses.first).to eq(api == :push ? 429 : 422)
          expect(statuses.uniq).to eq([statuses.first, 200])
          expect(lines.first).to include("push rate limit")
        end
      end
    end

    # Every distinct label set is a series per sample type (4 here).
    if limits.series.between?(4, 40)
      it "answers the first series over the active-series limit with 429 (422 on /ingest), and is not retried" do
        sets = limits.series / 4
        %i[push ingest].each do |api|
          @tenant = "limits-#{SecureRandom.hex(4)}"
          sets.times do |i|
            result, = upload(api, profile_of(count: 2), labels: { shard: i.to_s })
            expect(result).to be_ok
          end
          result, statuses, lines = upload(api, profile_of(count: 2), labels: { shard: "over" })
          expect(statuses).to eq([api == :push ? 429 : 422])
          expect(result.attempts).to eq(1)
          expect(lines.first).to include("Maximum active series limit exceeded (#{sets * 4}/#{limits.series})")
          # Sample labels of string values (our `class`) are series labels too.
          @tenant = "limits-#{SecureRandom.hex(4)}"
          _, statuses, = upload(api, profile_of(count: sets + 1, labels: true))
          expect(statuses).to eq([api == :push ? 429 : 422])
        end
      end
    end

    if limits.size_bytes < 1_000_000 && limits.burst_bytes < 1_000_000
      it "gets a big profile through small limits by folding to max_profile_bytes below them, not without" do
        site = generated_call_sites(600)
        runs = [limits.size_bytes + 1_000_000, ([limits.size_bytes, limits.burst_bytes].min * 0.9).to_i]
        outcomes = runs.map do |max_bytes|
          @tenant = "limits-#{SecureRandom.hex(4)}" # a full bucket each
          flushed = []
          collector = MemprofilerPprof::Collector.new(sample_rate: 1.0)
          flusher = pyroscope_flusher(collector, flushed, max_profile_bytes: max_bytes, retries: 1)
          collector.start!
          # (GC.start: in use from then on, see Collector::INUSE_AS_OF.)
          kept = flusher.run(flush: true) { Array.new(600) { |i| site.public_send(:"site#{i}", 15, []) }.tap { GC.start } }
          collector.stop!
          expect(kept.size).to eq(600)
          [raw_size(flushed.last.pprof_data), flusher.uploads_succeeded, flusher.uploads_failed]
        end
        expect(outcomes.first.first).to be > [limits.size_bytes, limits.burst_bytes].min
        expect(outcomes.first.drop(1)).to eq([0, 1])
        expect(outcomes.last.first).to be <= runs.last
        expect(outcomes.last.drop(1)).to eq([1, 0])
      end
    end

    if limits.defaults?
      it "keeps a big realistic flush (4,000 methods, 30-deep distinct stacks) under every default limit, and sends it" do
        site = generated_call_sites(4_000)
        flushed = []
        collector = MemprofilerPprof::Collector.new(sample_rate: 1.0)
        flusher = pyroscope_flusher(collector, flushed)
        expect(flusher.max_profile_bytes).to eq(2_000_000)
        collector.start!
        # (GC.start: in use from then on, see Collector::INUSE_AS_OF.)
        kept = flusher.run(flush: true) { Array.new(4_000) { |i| site.public_send(:"site#{i}", 30, []) }.tap { GC.start } }
        collector.stop!
        expect(kept.size).to eq(4_000)
        data = flushed.last
        raw = raw_size(data.pprof_data)
        samples = MemprofilerPprof::Profile.parse(data).samples_count
        expect(raw).to be <= 2_000_000
        expect(raw).to be > 1_900_000 # folded by measured sizes: not far under
        expect(raw + 200).to be < limits.burst_bytes # the series labels count too
        expect(samples).to be <= limits.samples
        expect(data.folded_samples_count).to be_positive
        expect([flusher.uploads_succeeded, flusher.uploads_failed]).to eq([1, 0]), logged.join("\n")
      end

      it "keeps a flush of many live samples under 16,000 samples, class and age labels kept" do
        # Named: classes of one name are one sample.
        classes = Array.new(60) { |i| PyroscopeLimitClasses.const_get(:"C#{i}") }
        flushed = []
        collector = MemprofilerPprof::Collector.new(sample_rate: 1.0)
        # With the default class frames the ages merge; labels keep them apart.
        flusher = pyroscope_flusher(collector, flushed, retries: 0, sample_labels: :keep)
        expect(flusher.max_profile_samples).to eq(16_000)
        collector.start!
        # 36,000 live objects: 60 classes x 300 GC ages, each its own sample,
        # allocated where stacks are shallow (a new thread), as in a small
        # script: well under the byte limits.
        kept = flusher.run(flush: true) do
          Thread.new do
            Array.new(300) do
              objects = classes.flat_map { |klass| [klass.new, klass.new] }
              GC.start(full_mark: false)
              objects
            end
          end.value
        end
        collector.stop!
        expect(kept.flatten.size).to eq(36_000)
        data = flushed.last
        samples = MemprofilerPprof::Profile.parse(data).samples_count
        expect(samples + data.folded_samples_count).to be > limits.samples # more than the server takes
        expect(raw_size(data.pprof_data)).to be < 1_000_000 # yet well under the size and the burst
        outcome = [samples <= limits.samples, flusher.uploads_succeeded, flusher.uploads_failed]
        expect(outcome).to eq([true, 1, 0]), logged.join("\n")
      end
    end
  end
end
