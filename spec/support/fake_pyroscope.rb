# frozen_string_literal: true

require "json"
require "webrick"
require "zlib"

# A loopback stand-in for a Pyroscope server's ingestion endpoints, checking
# what the real one checks (see docs/pyroscope-protocol.md) with its
# status codes, recording every request, and able to fail on demand.
# Its limits and their answers are those a real v1.12.0 gave
# (docs/pyroscope-protocol.md, "Limits of a real server"); the ingestion
# rate over time is not modelled (fail_next a 429 for that).
class FakePyroscope
  Request = Struct.new(:path, :query, :headers, :labels, :profiles, :status, keyword_init: true)

  LABEL_NAME = /\A[A-Za-z_.][A-Za-z0-9_.]*\z/
  MIB = 1024 * 1024
  # The real server's defaults: burst, uncompressed size, samples, active
  # series per tenant (each label set is a series per sample type, and each
  # distinct set of string sample labels another label set).
  LIMITS = { burst_bytes: 2 * MIB, max_profile_bytes: 4 * MIB, max_samples: 16_000, max_series: 5_000 }.freeze
  RATE_BYTES = 4 * MIB
  # Connect's code for an HTTP status (connect-go's, as the real server
  # writes them); anything else is "unknown".
  CODES = { 400 => "invalid_argument", 401 => "unauthenticated", 403 => "permission_denied", 404 => "not_found",
            429 => "resource_exhausted", 501 => "unimplemented", 503 => "unavailable",
            504 => "deadline_exceeded" }.freeze

  attr_reader :requests, :limits

  def initialize(**limits)
    @limits = LIMITS.merge(limits)
    @series = Hash.new { |h, tenant| h[tenant] = {} }
    @requests = Queue.new
    @faults = Queue.new
    @count_lock = Mutex.new
    @in_flight = 0
    @server = WEBrick::HTTPServer.new(BindAddress: "127.0.0.1", Port: 0, Logger: WEBrick::Log.new(File::NULL),
                                      AccessLog: [])
    @server.mount_proc("/push.v1.PusherService/Push") { |req, res| handle(req, res) { push(req) } }
    @server.mount_proc("/ingest") { |req, res| handle(req, res) { ingest(req) } }
    @thread = Thread.new { @server.start }
  end

  def url = "http://127.0.0.1:#{@server.config[:Port]}"

  # The next request gets `status` (after waiting `delay` seconds), with
  # `body` as its body if given.
  def fail_next(status, delay: 0, body: nil)
    @faults << [status, delay, body]
  end

  def all_requests
    Array.new(@requests.size) { @requests.pop }
  end

  # Forgets recorded requests, pending faults and active series (between
  # examples), once requests still being answered (a delayed one, say) are
  # done.
  def reset
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 5
    sleep 0.01 while @in_flight.positive? && Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
    @requests.clear
    @faults.clear
    @count_lock.synchronize { @series.clear }
  end

  def stop
    @server.shutdown
    @thread.join(5)
  end

  private

  def handle(req, res)
    @count_lock.synchronize { @in_flight += 1 }
    answer(req, res) { yield }
  ensure
    @count_lock.synchronize { @in_flight -= 1 }
  end

  def answer(req, res)
    unless @faults.empty?
      status, delay, body = @faults.pop
      sleep(delay) if delay.positive?
      reply(res, status, "injected failure", record: Request.new(path: req.path, status: status))
      res.body = body if body
      return
    end
    record, status, message = yield
    record.headers = req.header.transform_values { |v| v.join(",") }
    record.path = req.path
    reply(res, status, message, record: record)
  end

  # As the real server: a push's 200 is an empty application/proto message,
  # an /ingest's 200 an empty body without a type, a 415 an empty body
  # (connect-go's), every other error Connect's JSON {"code","message"}.
  def reply(res, status, message, record:)
    record.status = status
    @requests << record
    res.status = status
    if status == 200
      res["Content-Type"] = "application/proto" if record.path&.start_with?("/push.")
      res.body = ""
    elsif status != 415
      res["Content-Type"] = "application/json"
      res.body = JSON.generate(code: CODES.fetch(status, "unknown"), message: message)
    end
  end

  # Connect, binary protobuf: PushRequest{series{labels, samples{raw_profile}}}.
  def push(req)
    record = Request.new(query: {}, labels: [], profiles: [])
    return [record, 405, "POST only"] unless req.request_method == "POST"

    body = req.body.to_s.b
    body = MemprofilerPprof::Profile.gunzip(body) if req["Content-Encoding"] == "gzip"
    result = case req["Content-Type"]
             when "application/proto" then push_proto(body, record)
             when "application/json", "application/json; charset=utf-8" then push_json(body, record)
             else [record, 415, "unsupported content type #{req['Content-Type'].inspect}"]
             end
    result[1] == 200 ? admit(req, *result) : result
  end

  # The Connect JSON form: {"series":[{"labels":[{"name","value"}],
  # "samples":[{"rawProfile": base64}]}]}.
  def push_json(body, record)
    request = JSON.parse(body)
    Array(request["series"]).each do |series|
      record.labels = Array(series["labels"]).map { |pair| [pair["name"].to_s, pair["value"].to_s] }
      Array(series["samples"]).each { |sample| record.profiles << sample["rawProfile"].to_s.unpack1("m") }
      invalid = label_problem(record.labels)
      return [record, 400, invalid] if invalid
    end
    check_profiles(record)
  rescue JSON::ParserError => e
    [record, 400, "invalid JSON: #{e.message}"]
  end

  def label_problem(labels)
    names = labels.map(&:first)
    return "invalid labels" unless labels.all? { |n, v| n.valid_encoding? && v.valid_encoding? }
    return "__name__ missing" unless labels.any? { |n, v| n == "__name__" && !v.empty? }
    return "invalid label name" unless names.all? { |n| n == "__name__" || n.match?(LABEL_NAME) }
    return "duplicate label" unless names.uniq.size == names.size

    nil
  end

  def push_proto(body, record)
    each_field(body) do |field, value|
      next unless field == 1 # series

      labels = []
      each_field(value) do |series_field, series_value|
        case series_field
        when 1
          pair = {}
          each_field(series_value) { |f, v| pair[f == 1 ? :name : :value] = v.force_encoding(Encoding::UTF_8) }
          labels << [pair[:name], pair[:value]]
        when 2
          each_field(series_value) { |f, v| record.profiles << v if f == 1 }
        end
      end
      record.labels = labels
      invalid = label_problem(labels)
      return [record, 400, invalid] if invalid
    end
    check_profiles(record)
  end

  # Legacy: /ingest?name=app{k=v,...}&from=&until=&format=pprof with the
  # profile as the raw body; without `format`, a multipart/form-data body
  # whose `profile` part is the profile (as the real server switches).
  # A bad name is a 400; past it, the real server answers every refusal of
  # the push path with 422 and the push's words after "pushing
  # IngestInput-pprof failed <code>: " (its rate and series limits
  # included: v1.12 has no 429 here).
  def ingest(req)
    record, status, message = ingest_request(req)
    return [record, status, message] if status

    record, status, message = check_profiles(record)
    _, status, message = admit(req, record, status, message) if status == 200
    return [record, status, message] if status == 200

    step = message.start_with?("bad profile") ? "parsing" : "pushing"
    [record, 422, "#{step} IngestInput-pprof failed #{CODES.fetch(status, 'unknown')}: #{message}"]
  end

  # The request's record with its labels, and a status and message if the
  # query already refuses it.
  def ingest_request(req)
    query = URI.decode_www_form(req.query_string.to_s).to_h
    body = req.body.to_s.b
    if query["format"].nil? && req["Content-Type"].to_s.start_with?("multipart/form-data")
      part = req.query["profile"]
      body = part.to_s.b
      query["format"] = "pprof" if part
    end
    record = Request.new(query: query, labels: [], profiles: [body])
    name = query["name"].to_s
    match = name.match(%r{\A([A-Za-z0-9_.\-/]+)(?:\{(.*)\})?\z})
    return [record, 400, "name: invalid name #{name.inspect}"] unless match

    tags = match[2].to_s.split(",").map { |pair| pair.split("=", 2) }
    return [record, 400, "name: invalid tags"] unless tags.all? { |k, v| k&.match?(LABEL_NAME) && v }
    return [record, 422, "format must be pprof"] unless query["format"] == "pprof"
    return [record, 422, "bad from/until"] unless query["from"].to_s.match?(/\A\d+\z/) && query["until"].to_s.match?(/\A\d+\z/)

    record.labels = [["__name__", "memory"], ["__delta__", "false"], ["service_name", match[1]],
                     ["pyroscope_spy", query.fetch("spyName", "unknown")]] + tags
    [record, nil, nil]
  end

  # Every profile, in the real server's order: readable, within the burst
  # (uncompressed size plus label bytes; 429), then (400) time within
  # (now - 1 h, now + 10 min), under the size and samples limits, no '-' in
  # sample types, and accepted by `go tool pprof -raw`. The real words where
  # a limit is concerned.
  def check_profiles(record)
    return [record, 400, "no profiles received"] if record.profiles.empty?

    raws = record.profiles.map { |gz| MemprofilerPprof::Profile.gunzip(gz) }
    added = raws.sum(&:bytesize) + record.labels.sum { |name, value| name.bytesize + value.bytesize }
    if added > @limits[:burst_bytes]
      return [record, 429, "push rate limit (#{ibytes(RATE_BYTES)}) exceeded while adding #{ibytes(added)}"]
    end

    shown = "{#{record.labels.sort.map { |name, value| "#{name}=#{value.inspect}" }.join(', ')}}"
    record.profiles.map!.with_index do |gz, index|
      raw = raws[index]
      profile = MemprofilerPprof::PprofReader.parse(raw)
      problem = profile_problem(profile, raw, shown)
      return [record, 400, problem] if problem
      return [record, 400, "go tool pprof rejected the profile"] unless go_pprof_reads?(gz)

      profile
    end
    [record, 200, "ok"]
  rescue MemprofilerPprof::ProfileFormatError, MemprofilerPprof::PprofReader::FormatError => e
    [record, 400, "bad profile: #{e.message}"]
  end

  def profile_problem(profile, raw, shown)
    now = Time.now.to_f
    seconds = profile.time_nanos / 1e9
    if profile.time_nanos.positive? && !(seconds > now - 3600 && seconds < now + 600)
      return "profile with labels '#{shown}' is outside of ingestion window (profile timestamp: " \
             "#{Time.at(seconds).utc}, the ingestion window starts at #{Time.at(now - 3600).utc} " \
             "and ends at #{Time.at(now + 600).utc})"
    end
    if raw.bytesize > @limits[:max_profile_bytes]
      return "the profile with labels '#{shown}' exceeds the size limit (max_profile_size_byte, " \
             "actual: #{raw.bytesize}, limit: #{@limits[:max_profile_bytes]})"
    end
    if profile.samples.size > @limits[:max_samples]
      return "the profile with labels '#{shown}' exceeds the samples count limit (max_profile_stacktrace_samples, " \
             "actual: #{profile.samples.size}, limit: #{@limits[:max_samples]})"
    end
    return "invalid sample type" if profile.sample_types.any? { |t| t.type.include?("-") }
    return "invalid UTF-8 in the string table" unless profile.strings.all?(&:valid_encoding?)
    return "location or function id 0" if zero_ids?(raw)

    "sample label name with '-'" if sample_label_dash?(profile)
  end

  def go_pprof_reads?(gz)
    Dir.mktmpdir do |dir|
      path = File.join(dir, "p.pb.gz")
      File.binwrite(path, gz)
      system("go", "tool", "pprof", "-raw", path, out: File::NULL, err: File::NULL)
    end
  end

  # The ingester's active-series limit, for a request the rest accepted:
  # a series per label set (the request's, plus each profile's distinct
  # string sample labels) and sample type, per tenant; 429 past the limit
  # (the real one has then written the series before it, not modelled).
  def admit(req, record, status, message)
    tenant = req["X-Scope-OrgID"].to_s
    keys = record.profiles.flat_map do |profile|
      sets = profile.samples.map { |s| s.labels.reject { |l| l.str.to_s.empty? }.map { |l| [l.key, l.str] }.sort }.uniq
      sets = [[]] if sets.empty?
      sets.product(profile.sample_types.map(&:type)).map { |set, type| [record.labels.sort, set, type] }
    end
    @count_lock.synchronize do
      active = @series[tenant]
      fresh = keys.uniq.reject { |key| active.key?(key) }
      if active.size + fresh.size > @limits[:max_series]
        return [record, 429, "Maximum active series limit exceeded (#{active.size}/#{@limits[:max_series]}), " \
                             "reduce the number of active streams (reduce labels or reduce label values), or " \
                             "contact your administrator to see if the limit can be increased"]
      end

      fresh.each { |key| active[key] = true }
    end
    [record, status, message]
  end

  # go-humanize's IBytes, as the real server words sizes.
  def ibytes(bytes)
    return "#{bytes} B" if bytes < 1024

    exponent = (Math.log(bytes) / Math.log(1024)).floor.clamp(1, 6)
    value = bytes.to_f / (1024**exponent)
    format(value < 10 ? "%.1f %s" : "%.0f %s", value, %w[KiB MiB GiB TiB PiB EiB][exponent - 1])
  end

  # Profile.location (field 4) and Profile.function (field 5): id is field 1.
  def zero_ids?(raw)
    zero = false
    each_field(raw) do |field, value|
      next unless [4, 5].include?(field)

      id = nil
      MemprofilerPprof::PprofReader.each_field(value) { |f, _wire, v| id = v if f == 1 }
      zero ||= id.nil? || id.zero?
    end
    zero
  end

  # Pyroscope turns pprof sample labels into series labels, which may not
  # contain '-'.
  def sample_label_dash?(profile)
    profile.samples.any? { |sample| sample.labels.any? { |label| label.key.include?("-") } }
  end

  def each_field(bytes, &block)
    MemprofilerPprof::PprofReader.each_field(bytes) { |field, _wire, value| block.call(field, value) }
  end
end
