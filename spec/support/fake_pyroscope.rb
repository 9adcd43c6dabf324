# frozen_string_literal: true

require "json"
require "webrick"
require "zlib"

# A loopback stand-in for a Pyroscope server's ingestion endpoints, checking
# what the real one checks (see docs/pyroscope-protocol.md) with its
# status codes, recording every request, and able to fail on demand.
class FakePyroscope
  Request = Struct.new(:path, :query, :headers, :labels, :profiles, :status, keyword_init: true)

  LABEL_NAME = /\A[A-Za-z_.][A-Za-z0-9_.]*\z/
  MAX_PROFILE_BYTES = 4 * 1024 * 1024

  attr_reader :requests

  def initialize
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

  # Forgets recorded requests and pending faults (between examples), once
  # requests still being answered (a delayed one, say) are done.
  def reset
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 5
    sleep 0.01 while @in_flight.positive? && Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
    @requests.clear
    @faults.clear
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

  def reply(res, status, message, record:)
    record.status = status
    @requests << record
    res.status = status
    res["Content-Type"] = "application/json"
    res.body = if status == 200
                 "{}"
               else
                 JSON.generate(code: status == 400 ? "invalid_argument" : "unknown", message: message)
               end
  end

  # Connect, binary protobuf: PushRequest{series{labels, samples{raw_profile}}}.
  def push(req)
    record = Request.new(query: {}, labels: [], profiles: [])
    return [record, 405, "POST only"] unless req.request_method == "POST"

    body = req.body.to_s.b
    body = MemprofilerPprof::Profile.gunzip(body) if req["Content-Encoding"] == "gzip"
    case req["Content-Type"]
    when "application/proto" then push_proto(body, record)
    when "application/json", "application/json; charset=utf-8" then push_json(body, record)
    else [record, 415, "unsupported content type #{req['Content-Type'].inspect}"]
    end
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
    check_profiles(record, 400)
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
    check_profiles(record, 400)
  end

  # Legacy: /ingest?name=app{k=v,...}&from=&until=&format=pprof with the
  # profile as the raw body; without `format`, a multipart/form-data body
  # whose `profile` part is the profile (as the real server switches).
  def ingest(req)
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
    return [record, 422, "invalid name #{name.inspect}"] unless match

    tags = match[2].to_s.split(",").map { |pair| pair.split("=", 2) }
    return [record, 422, "invalid tags"] unless tags.all? { |k, v| k&.match?(LABEL_NAME) && v }
    return [record, 422, "format must be pprof"] unless query["format"] == "pprof"
    return [record, 422, "bad from/until"] unless query["from"].to_s.match?(/\A\d+\z/) && query["until"].to_s.match?(/\A\d+\z/)

    record.labels = [["service_name", match[1]]] + tags
    check_profiles(record, 422)
  end

  # Every profile: gzip, under 4 MiB raw, no '-' in sample types, accepted
  # by `go tool pprof -raw`, time within [now - 1 h, now + 10 min].
  def check_profiles(record, status)
    return [record, status, "no profile"] if record.profiles.empty?

    record.profiles.map! do |gz|
      raw = MemprofilerPprof::Profile.gunzip(gz)
      return [record, status, "profile too large"] if raw.bytesize > MAX_PROFILE_BYTES

      profile = MemprofilerPprof::PprofReader.parse(raw)
      return [record, status, "invalid sample type"] if profile.sample_types.any? { |t| t.type.include?("-") }
      return [record, status, "invalid UTF-8 in the string table"] unless profile.strings.all?(&:valid_encoding?)
      return [record, status, "location or function id 0"] if zero_ids?(raw)
      return [record, status, "sample label name with '-'"] if sample_label_dash?(profile)

      seconds = profile.time_nanos / 1e9
      return [record, status, "out of window"] unless seconds.between?(Time.now.to_f - 3600, Time.now.to_f + 600)

      ok = Dir.mktmpdir do |dir|
        path = File.join(dir, "p.pb.gz")
        File.binwrite(path, gz)
        system("go", "tool", "pprof", "-raw", path, out: File::NULL, err: File::NULL)
      end
      return [record, status, "go tool pprof rejected the profile"] unless ok

      profile
    end
    [record, 200, "ok"]
  rescue MemprofilerPprof::ProfileFormatError, MemprofilerPprof::PprofReader::FormatError => e
    [record, status, "bad profile: #{e.message}"]
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
