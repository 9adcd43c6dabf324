# frozen_string_literal: true

require "zlib"

# Uploads to a loopback stand-in for Pyroscope (spec/support/fake_pyroscope.rb).
RSpec.describe MemprofilerPprof::PyroscopeUploader do
  before(:all) { @server = FakePyroscope.new }
  after(:all) { @server.stop }
  before { @server.reset }

  let(:logger) { ListLogger.new }
  let(:data) do
    MemprofilerPprof::Collector.new(sample_rate: 1.0).profile(sample_labels: :class_frame) do
      @kept = Array.new(200) { |i| "kept #{i}" }
    end
  end

  def uploader(**options)
    described_class.new(server_address: @server.url, application_name: "shop", logger: logger,
                        retry_base_delay: 0.01, **options)
  end

  def last_request
    @server.all_requests.last
  end

  it "pushes a profile as one memory series with the service name, __delta__=false and the user's labels" do
    result = uploader(labels: { env: "prod", "region.zone" => "eu-1" }).upload(data)
    expect(result).to be_ok
    expect(result.attempts).to eq(1)
    request = last_request
    expect(request.path).to eq("/push.v1.PusherService/Push")
    expect(request.labels).to eq([%w[__name__ memory], %w[service_name shop], %w[__delta__ false],
                                  %w[env prod], %w[region.zone eu-1]])
    expect(request.profiles.size).to eq(1)
    expect(request.profiles.first.sample_types.map(&:type)).to eq(%w[alloc_objects alloc_space inuse_objects inuse_space])
  end

  it "says once, and still sends it, when a profile carries class labels (a series per class on Pyroscope)" do
    labelled = MemprofilerPprof::Collector.new(sample_rate: 1.0).profile { Array.new(10) { |i| "x#{i}" } }
    expect(labelled.sample_labels).to eq(:keep)
    sender = uploader
    expect(sender.upload(data)).to be_ok
    expect(logger.errors).to be_empty
    expect([sender.upload(labelled), sender.upload(labelled)]).to all(be_ok)
    expect(logger.errors.size).to eq(1)
    expect(logger.errors.pop).to include("sample_labels: :keep", "sample_labels: :class_frame")
    expect(uploader(warn_class_labels: false).upload(labelled)).to be_ok
    expect(logger.errors).to be_empty
    expect { uploader(warn_class_labels: nil) }.to raise_error(TypeError, /warn_class_labels/)
  end

  it "uses the ingest API with the label set in the name and the interval in from/until" do
    result = uploader(api: :ingest, labels: { env: "prod" }).upload(data)
    expect(result).to be_ok
    request = last_request
    expect(request.path).to eq("/ingest")
    expect(request.query["name"]).to eq("shop{env=prod}")
    expect(request.query["format"]).to eq("pprof")
    expect(request.query["spyName"]).to eq("memprofiler_pprof_rs")
    expect(request.query["from"].to_i).to eq(data.started_at.to_i)
    expect(request.query["until"].to_i).to eq(data.finished_at.to_i)
  end

  it "sends basic auth, the tenant header and extra headers, and never shows the password" do
    up = uploader(basic_auth_username: "123456", basic_auth_password: "glc_secret", tenant_id: "team-a",
                  headers: { "X-Extra" => "1" })
    expect(up.upload(data)).to be_ok
    headers = last_request.headers
    expect(headers["authorization"]).to eq("Basic #{['123456:glc_secret'].pack('m0')}")
    expect(headers["x-scope-orgid"]).to eq("team-a")
    expect(headers["x-extra"]).to eq("1")
    expect(up.inspect).not_to include("glc_secret")
    expect(up.inspect).to include("[FILTERED]")
  end

  it "takes credentials given in the address as Basic auth and never shows them" do
    address = @server.url.sub("http://", "http://123456:glc_url_secret@")
    up = described_class.new(server_address: address, application_name: "shop", logger: logger)
    expect(up.upload(data)).to be_ok
    expect(last_request.headers["authorization"]).to eq("Basic #{['123456:glc_url_secret'].pack('m0')}")
    expect(up.inspect).not_to include("glc_url_secret")
    expect(up.server_address).to eq(@server.url)
    expect { described_class.new(server_address: "ftp://u:glc_url_secret@x", application_name: "a") }
      .to raise_error(ArgumentError) { |e| expect(e.message).not_to include("glc_url_secret") }
  end

  it "refuses labels Pyroscope would refuse, and label values the ingest API cannot carry" do
    expect { uploader(labels: { "a.b" => 1, "a_b" => 2 }) }.to raise_error(ArgumentError, /a\.b and a_b/)
    expect { uploader(labels: (1..28).to_h { |i| ["l#{i}", i] }) }.to raise_error(ArgumentError, /at most 27/)
    expect { uploader(api: :ingest, labels: { region: "eu,admin=true" }) }
      .to raise_error(ArgumentError, /region=.*ingest API/)
    expect { uploader(headers: { "X-Bad" => "a\r\nInjected: 1" }) }.to raise_error(ArgumentError, /line break/)
  end

  it "retries a 500 and succeeds, losing nothing" do
    @server.fail_next(500)
    result = uploader.upload(data)
    expect(result).to be_ok
    expect(result.attempts).to eq(2)
    requests = @server.all_requests
    expect(requests.map(&:status)).to eq([500, 200])
    expect(requests.last.profiles.size).to eq(1)
  end

  it "retries 429 with backoff, and gives up after the configured retries" do
    3.times { @server.fail_next(429) }
    result = uploader(retries: 2).upload(data)
    expect(result).not_to be_ok
    expect(result.status).to eq(429)
    expect(result.attempts).to eq(3)
    expect(@server.all_requests.map(&:status)).to eq([429, 429, 429])
  end

  # The words of a real Pyroscope v1.12.0 (docs/pyroscope-protocol.md, "Limits of a real server").
  it "retries /ingest's 422 for the rate limit like a 429, but no other 422" do
    rate_limited = '{"code":"unknown","message":"pushing IngestInput-pprof failed resource_exhausted: ' \
                   'push rate limit (4.0 MiB) exceeded while adding 1.4 MiB"}'
    @server.fail_next(422, body: rate_limited)
    result = uploader(api: :ingest).upload(data)
    expect([result.ok?, result.attempts]).to eq([true, 2])
    expect(@server.all_requests.map(&:status)).to eq([422, 200])

    @server.fail_next(422, body: '{"code":"unknown","message":"pushing IngestInput-pprof failed invalid_argument: ' \
                                 'the profile with labels \'{}\' exceeds the samples count limit"}')
    expect(uploader(api: :ingest).upload(data).attempts).to eq(1)
    # Push answers its rate limit with 429 itself: a 422 there is final whatever it says.
    @server.fail_next(422, body: rate_limited)
    expect(uploader.upload(data).attempts).to eq(1)
  end

  it "reads only the first 64 KiB of an error body: a huge one is neither held nor searched past that" do
    message = "Maximum active series limit exceeded (5000/5000)"
    # 5 MB of padding, then the words: they are past what is kept, so this
    # 429 counts as a plain one and is retried.
    @server.fail_next(429, body: ("x" * 5_000_000) + message)
    @server.fail_next(429, body: message + ("x" * 5_000_000))
    result = uploader(retries: 1).upload(data)
    expect([result.ok?, result.status, result.attempts]).to eq([false, 429, 2])
    logged = Array.new(logger.errors.size) { logger.errors.pop }
    expect(logged.map(&:bytesize)).to all(be < 1_000)
  end

  it "does not retry the active-series limit (429, but no retry within the backoff can pass it)" do
    series_limited = '{"code":"resource_exhausted","message":"Maximum active series limit exceeded (5000/5000), ' \
                     "reduce the number of active streams (reduce labels or reduce label values), or contact " \
                     'your administrator to see if the limit can be increased"}'
    @server.fail_next(429, body: series_limited)
    result = uploader.upload(data)
    expect([result.ok?, result.status, result.attempts]).to eq([false, 429, 1])
    expect(logger.errors.pop).to include("answered 429", "Maximum active series limit exceeded")
    @server.fail_next(422, body: series_limited.sub('"resource_exhausted","message":"',
                                                    '"unknown","message":"pushing IngestInput-pprof failed ' \
                                                    "resource_exhausted: "))
    expect(uploader(api: :ingest).upload(data).attempts).to eq(1)
  end

  it "does not retry a 400 and logs the server's message" do
    result = uploader(labels: {}).upload("not a profile".b)
    expect(result).not_to be_ok
    expect(result.status).to eq(400)
    expect(result.attempts).to eq(1)
    expect(logger.errors.pop).to match(/answered 400: .*bad profile/)
  end

  # A profile Pyroscope must refuse: a sample type name with '-'.
  def profile_with_dash
    wire = MemprofilerPprof::PyroscopeUploader::Protobuf
    value_type = "\x08\x01\x10\x02".b # type: string 1, unit: string 2
    strings = ["", "alloc-objects", "count"].map { |text| wire.bytes(6, text) }.join
    now = wire.varint(9 << 3) + wire.varint(Time.now.to_i * 1_000_000_000) # time_nanos
    Zlib.gzip(wire.bytes(1, value_type) + strings + now)
  end

  it "is refused (400, not retried) for a profile the server rejects, with the reason logged" do
    result = uploader.upload(profile_with_dash)
    expect(result.status).to eq(400)
    expect(result.attempts).to eq(1)
    expect(logger.errors.pop).to include("invalid sample type")
  end

  # A profile of `count` one-frame samples with names of about `name_bytes`,
  # stamped now; `labels:` gives each sample a class label (a series each).
  def pprof_with_samples(count, name_bytes: 1, labels: false)
    types = [%w[alloc_objects count], %w[alloc_space bytes], %w[inuse_objects count], %w[inuse_space bytes]]
    samples = Array.new(count) do |i|
      { stack: [["m#{i}#{'x' * name_bytes}", "a.rb", i + 1, 1]], values: [1, 8, 1, 8], class: labels ? "C#{i}" : nil }
    end
    PprofWriter.build(sample_types: types, samples: samples, time_nanos: (Time.now.to_f * 1e9).to_i,
                      period_type: %w[space bytes], period: 1)
  end

  # The stand-in server itself: the request forms the real one accepts and
  # this gem does not send (Connect JSON, multipart /ingest).
  describe "stand-in server" do
    def post(path, body, content_type)
      uri = URI("#{@server.url}#{path}")
      Net::HTTP.post(uri, body, "Content-Type" => content_type)
    end

    it "accepts the Connect JSON form of a push, and refuses '-' in a label name" do
      series = { labels: [{ name: "__name__", value: "memory" }, { name: "service_name", value: "js" }],
                 samples: [{ rawProfile: [data.pprof_data].pack("m0") }] }
      response = post("/push.v1.PusherService/Push", JSON.generate(series: [series]), "application/json")
      expect(response.code).to eq("200")
      series[:labels] << { name: "bad-name", value: "x" }
      response = post("/push.v1.PusherService/Push", JSON.generate(series: [series]), "application/json")
      expect(response.code).to eq("400")
      expect(JSON.parse(response.body)).to include("code" => "invalid_argument")
      expect(post("/push.v1.PusherService/Push", "x", "text/plain").code).to eq("415")
    end

    it "accepts a multipart /ingest without format, and refuses a bad name (400, as the real server)" do
      boundary = "memprofilerboundary"
      body = "--#{boundary}\r\nContent-Disposition: form-data; name=\"profile\"; filename=\"profile.pprof\"\r\n" \
             "Content-Type: application/octet-stream\r\n\r\n".b + data.pprof_data + "\r\n--#{boundary}--\r\n".b
      now = Time.now.to_i
      response = post("/ingest?name=multi%7Benv%3Dx%7D&from=#{now}&until=#{now}", body,
                      "multipart/form-data; boundary=#{boundary}")
      expect(response.code).to eq("200")
      response = post("/ingest?name=bad%20name&from=#{now}&until=#{now}&format=pprof", data.pprof_data,
                      "application/octet-stream")
      expect(response.code).to eq("400")
      expect(JSON.parse(response.body)).to include("code" => "invalid_argument")
    end

    it "answers as a real Pyroscope v1.12.0 does: 200 empty, application/proto on push and untyped on /ingest" do
      push = post("/push.v1.PusherService/Push", "".b, "application/proto")
      expect(push.code).to eq("400") # no series: "no profiles received"
      expect(JSON.parse(push.body)).to eq("code" => "invalid_argument", "message" => "no profiles received")
      expect(uploader.upload(data)).to be_ok
      now = Time.now.to_i
      ingest = post("/ingest?name=shop&from=#{now}&until=#{now}&format=pprof", data.pprof_data, "application/octet-stream")
      expect([ingest.code, ingest.body, ingest["Content-Type"]]).to eq(["200", "", nil])
      proto = Net::HTTP.start("127.0.0.1", URI(@server.url).port) do |http|
        http.request(uploader.send(:build_request, data.pprof_data, Time.now, Time.now))
      end
      expect([proto.code, proto.body, proto["Content-Type"]]).to eq(["200", "", "application/proto"])
    end

    # Smaller limits than the real defaults, to reach them with small profiles.
    it "has the real server's limits, with its statuses and words on both APIs" do
      server = FakePyroscope.new(burst_bytes: 60_000, max_profile_bytes: 40_000, max_samples: 100, max_series: 8)
      up = lambda do |api|
        described_class.new(server_address: server.url, application_name: "shop", logger: logger, retries: 0, api: api)
      end
      answer = lambda do |api, bytes|
        result = up.call(api).upload(bytes)
        [result.status, result.ok? ? nil : logger.errors.pop]
      end

      expect(answer.call(:push, pprof_with_samples(101)))
        .to match([400, /exceeds the samples count limit \(max_profile_stacktrace_samples, actual: 101, limit: 100\)/])
      expect(answer.call(:ingest, pprof_with_samples(101)))
        .to match([422, /"code":"unknown".*pushing IngestInput-pprof failed invalid_argument: the profile with labels/])
      big = pprof_with_samples(90, name_bytes: 500)
      raw = MemprofilerPprof::Profile.gunzip(big).bytesize
      expect(raw).to be_between(40_001, 59_000)
      expect(answer.call(:push, big))
        .to match([400, /exceeds the size limit \(max_profile_size_byte, actual: #{raw}, limit: 40000\)/])
      server.limits[:burst_bytes] = 30_000 # now the rate limit comes first, as it does at the defaults
      expect(answer.call(:push, big))
        .to match([429, /"code":"resource_exhausted".*push rate limit \(4\.0 MiB\) exceeded while adding/])
      expect(answer.call(:ingest, big))
        .to match([422, /"code":"unknown".*failed resource_exhausted: push rate limit \(4\.0 MiB\) exceeded/])
      # A label set is a series per sample type (4); /ingest's carry pyroscope_spy.
      expect([answer.call(:push, pprof_with_samples(3)), answer.call(:ingest, pprof_with_samples(3))])
        .to eq([[200, nil], [200, nil]])
      expect(answer.call(:push, pprof_with_samples(3, labels: true)))
        .to match([429, %r{Maximum active series limit exceeded \(8/8\)}])
      expect(answer.call(:ingest, pprof_with_samples(3, labels: true)))
        .to match([422, /failed resource_exhausted: Maximum active series limit exceeded/])
    ensure
      server&.stop
    end
  end

  it "verifies the server's certificate over HTTPS" do
    require "webrick/https"
    server = WEBrick::HTTPServer.new(BindAddress: "127.0.0.1", Port: 0, SSLEnable: true,
                                     SSLCertName: [%w[CN localhost]], Logger: WEBrick::Log.new(File::NULL),
                                     AccessLog: [])
    server.mount_proc("/") { |_req, res| res.body = "{}" }
    thread = Thread.new { server.start }
    up = described_class.new(server_address: "https://127.0.0.1:#{server.config[:Port]}", application_name: "shop",
                             logger: logger, retries: 0)
    result = up.upload(data)
    expect(result).not_to be_ok
    expect(result.error).to be_a(OpenSSL::SSL::SSLError)
    expect(result.error.message).to match(/certificate verify failed/)
  ensure
    server&.shutdown
    thread&.join(5)
  end

  it "gives up on a hung server after the read timeout, without raising" do
    @server.fail_next(200, delay: 1.5)
    started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    result = uploader(read_timeout: 0.3, retries: 0).upload(data)
    elapsed = Process.clock_gettime(Process::CLOCK_MONOTONIC) - started
    expect(result).not_to be_ok
    expect(result.error).to be_a(Net::ReadTimeout)
    expect(elapsed).to be < 1.2
  end

  # A server on a socket of its own that reads the request, writes `head`
  # at once, then `trickle` a byte every 50 ms (each read well within the
  # read timeout); yields its address.
  def with_trickling_server(head, trickle)
    listener = TCPServer.new("127.0.0.1", 0)
    server = Thread.new do
      client = listener.accept
      client.readpartial(65_536)
      client.write(head)
      trickle.each_char do |byte|
        client.write(byte)
        sleep 0.05
      end
    rescue IOError, SystemCallError
      nil
    ensure
      client&.close
    end
    yield "http://127.0.0.1:#{listener.addr[1]}"
  ensure
    server&.kill
    server&.join(1)
    listener&.close
  end

  {
    "its headers" => ["HTTP/1.1 500 Internal Server Error\r\n", "X-Slow: #{'x' * 200}\r\n"],
    "its body" => ["HTTP/1.1 500 Internal Server Error\r\nContent-Length: 200\r\n\r\n", "x" * 200]
  }.each do |part, (head, trickle)|
    it "gives up on a server trickling #{part} after open_timeout + 2 x read_timeout, without raising" do
      with_trickling_server(head, trickle) do |address|
        up = described_class.new(server_address: address, application_name: "shop", logger: logger, retries: 0,
                                 open_timeout: 0.2, read_timeout: 0.5)
        started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
        result = up.upload(data)
        elapsed = Process.clock_gettime(Process::CLOCK_MONOTONIC) - started
        expect(result).not_to be_ok
        expect(result.error).to be_a(Timeout::Error)
        expect(elapsed).to be_between(1.1, 2.5)
        expect(logger.errors.pop).to include("Timeout::Error")
      end
    end
  end

  it "counts a 2xx whose body is trickled past the bound as taken, not to be sent twice" do
    with_trickling_server("HTTP/1.1 200 OK\r\nContent-Length: 200\r\n\r\n", "x" * 200) do |address|
      up = described_class.new(server_address: address, application_name: "shop", logger: logger, retries: 2,
                               open_timeout: 0.2, read_timeout: 0.5)
      result = up.upload(data)
      expect(result).to be_ok
      expect(result.attempts).to eq(1)
      expect(logger.errors).to be_empty
    end
  end

  it "reports a server that is down, retrying, without raising" do
    closed = TCPServer.new("127.0.0.1", 0)
    port = closed.addr[1]
    closed.close
    up = described_class.new(server_address: "http://127.0.0.1:#{port}", application_name: "shop",
                             logger: logger, retries: 1, retry_base_delay: 0.01)
    result = up.upload(data)
    expect(result).not_to be_ok
    expect(result.attempts).to eq(2)
    expect(result.error).to be_a(Errno::ECONNREFUSED)
  end

  it "rejects bad arguments at construction, naming the value" do
    expect { uploader(labels: { "bad-name" => "x" }) }.to raise_error(ArgumentError, /label name "bad-name"/)
    expect { uploader(labels: { "__name__" => "x" }) }.to raise_error(ArgumentError, /__name__/)
    expect { described_class.new(server_address: "ftp://x", application_name: "a") }
      .to raise_error(ArgumentError, /server_address.*ftp/)
    expect { described_class.new(server_address: @server.url, application_name: "") }
      .to raise_error(ArgumentError, /application_name/)
    expect { uploader(api: :grpc) }.to raise_error(ArgumentError, /api.*:grpc/)
    expect { uploader(basic_auth_username: "u") }.to raise_error(ArgumentError, /basic_auth/)
    expect { uploader(read_timeout: 0) }.to raise_error(ArgumentError, /read_timeout/)
  end
end
