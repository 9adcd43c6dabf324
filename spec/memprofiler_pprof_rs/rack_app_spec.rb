# frozen_string_literal: true

require "rack"
require "rack/mock"
# Loaded here, not by the first request through it (with forwardable,
# ~3,500 objects, which an example counting allocations saw when it ran
# first).
require "rack/lint"
require "ipaddr"
require "net/http"
require "fileutils"

module RackAppSpec
  TOKEN = "s3cret+t0ken/with=chars&more-0123456789"
  LIB = File.join(PROJECT_ROOT, "lib")
  WORKLOAD = File.join(SPEC_ROOT, "fixtures/workload.rb")
  SERVE = File.join(SPEC_ROOT, "fixtures/serve_rack.rb")
end

# Counts flushes that run at the same time, for a collector whose flush it
# slows down (prepended to the collector's singleton class).
class OverlapTracker
  attr_reader :max_active, :calls

  def initialize
    @lock = Mutex.new
    @active = 0
    @max_active = 0
    @calls = 0
  end

  def enter
    @lock.synchronize do
      @calls += 1
      @active += 1
      @max_active = [@max_active, @active].max
    end
  end

  def leave
    @lock.synchronize { @active -= 1 }
  end

  def instrument(collector, delay:, failure: nil)
    tracker = self
    collector.singleton_class.prepend(Module.new do
      define_method(:flush) do |**options|
        tracker.enter
        begin
          sleep(delay)
          raise failure if failure

          super(**options)
        ensure
          tracker.leave
        end
      end
    end)
    collector
  end
end

RSpec.describe MemprofilerPprof::RackApp do
  include FlusherSpecHelpers

  let(:collector) do
    MemprofilerPprof::Collector.new(sample_rate: 1.0, max_allocation_samples: 1_000_000,
                                    max_heap_samples: 10_000_000)
  end
  let(:logger) { ListLogger.new }
  let(:app) { described_class.new(collector, token: RackAppSpec::TOKEN, logger: logger) }

  after { collector.stop! }

  def token_query(token = RackAppSpec::TOKEN)
    "token=#{URI.encode_www_form_component(token)}"
  end

  # A request through Rack::Lint, from REMOTE_ADDR `remote`.
  def request(target, path, method: "GET", remote: "127.0.0.1", env: {})
    Rack::MockRequest.new(target).request(method, path, { "REMOTE_ADDR" => remote, lint: true }.merge(env))
  end

  def get(path, target: app, **options)
    request(target, path, **options)
  end

  # A GET whose QUERY_STRING is taken as is (MockRequest refuses bad URIs).
  def get_raw_query(path, query, env: {})
    full = Rack::MockRequest.env_for(path, "REMOTE_ADDR" => "127.0.0.1").merge(env)
    full["QUERY_STRING"] = query
    Rack::MockResponse.new(*Rack::Lint.new(app).call(full))
  end

  def expect_common_headers(response)
    expect(response.headers["Cache-Control"]).to eq("no-store")
    expect(response.headers["X-Content-Type-Options"]).to eq("nosniff")
    expect(response.headers["Content-Length"]).to eq(response.body.bytesize.to_s)
  end

  def errors_logged
    Array.new(logger.errors.size) { logger.errors.pop }
  end

  describe "construction" do
    it "loads with the gem without loading rack" do
      out, err, status = run_ruby('require "memprofiler_pprof_rs"; p MemprofilerPprof::RackApp.name; p defined?(Rack)')
      expect(status).to be_success, err
      expect(out).to eq("\"MemprofilerPprof::RackApp\"\nnil\n")
    end

    it "needs a Collector, naming what it got" do
      expect { described_class.new(FakeCollector.new, token: RackAppSpec::TOKEN) }
        .to raise_error(TypeError, /collector must be a MemprofilerPprof::Collector, got #<FakeCollector/)
      expect { described_class.new("nope", token: RackAppSpec::TOKEN) }.to raise_error(TypeError, /got "nope"/)
    end

    it "needs a token of at least 16 characters, and never echoes it" do
      expect { described_class.new(collector, token: nil) }.to raise_error(TypeError, /token is required/)
      expect { described_class.new(collector, token: "") }.to raise_error(ArgumentError, /empty/)
      expect { described_class.new(collector, token: :"a-symbol-token-long-enough") }
        .to raise_error(TypeError, /must be a String .* got a Symbol\z/)
      expect { described_class.new(collector, token: 1_234_567_890_123_456_789) }
        .to raise_error(TypeError, /got an Integer\z/)
      expect { described_class.new(collector, token: "short-secret") }
        .to raise_error(ArgumentError, /too short: 12 characters, at least 16/) { |e|
          expect(e.message).not_to include("short-secret")
        }
      expect { described_class.new(collector, token: "a-file-token-0123456789\n") }
        .to raise_error(ArgumentError, /whitespace/) { |e| expect(e.message).not_to include("a-file-token") }
      expect { described_class.new(collector, token: "bad-\xff-encoding-0123456789") }
        .to raise_error(ArgumentError, /not valid UTF-8/)
      expect { described_class.new(collector) }.to raise_error(ArgumentError, /token/)
      expect(described_class.new(collector, token: "0123456789abcdef")).to be_a(described_class)
    end

    it "checks allow_remote, wait_timeout and logger" do
      [["10.0.0.0/8"], [IPAddr.new("fd00::/8"), "192.168.1.7"], []].each do |ranges|
        expect(described_class.new(collector, token: RackAppSpec::TOKEN, allow_remote: ranges)).to be_a(described_class)
      end
      expect(described_class.new(collector, token: RackAppSpec::TOKEN, allow_remote: true).allow_remote).to be(true)
      expect(described_class.new(collector, token: RackAppSpec::TOKEN).allow_remote).to be(false)
      expect(described_class.new(collector, token: RackAppSpec::TOKEN, allow_remote: ["10.0.0.0/8"]).allow_remote)
        .to eq([IPAddr.new("10.0.0.0/8")])
      expect { described_class.new(collector, token: RackAppSpec::TOKEN, allow_remote: "10.0.0.0/8") }
        .to raise_error(TypeError, /true, false or an Array/)
      expect { described_class.new(collector, token: RackAppSpec::TOKEN, allow_remote: ["10.0.0.0/8", "not-an-ip"]) }
        .to raise_error(ArgumentError, /entry "not-an-ip" is not an IP address or CIDR range/)
      expect { described_class.new(collector, token: RackAppSpec::TOKEN, allow_remote: [10]) }
        .to raise_error(TypeError, /entry must be .*, got 10\z/)
      expect { described_class.new(collector, token: RackAppSpec::TOKEN, allow_remote: :yes) }
        .to raise_error(TypeError)
      # A value of the wrong kind is a TypeError, a usable kind out of range
      # an ArgumentError (MemprofilerPprof::Validation).
      { -1 => ArgumentError, "5" => TypeError, Float::INFINITY => ArgumentError, Float::NAN => ArgumentError }
        .each do |bad, error|
          expect { described_class.new(collector, token: RackAppSpec::TOKEN, wait_timeout: bad) }
            .to raise_error(error, /wait_timeout/)
        end
      expect { described_class.new(collector, token: RackAppSpec::TOKEN, logger: Object.new) }
        .to raise_error(TypeError, /logger must respond to #error/)
    end

    it "keeps the token out of inspect" do
      expect(app.inspect).not_to include(RackAppSpec::TOKEN)
      expect(app.inspect).to include("loopback only")
      expect(app.instance_variables.map { |v| app.instance_variable_get(v) }).not_to include(RackAppSpec::TOKEN)
    end
  end

  describe "who may read" do
    it "serves loopback addresses, IPv4, IPv6 and IPv4-mapped" do
      ["127.0.0.1", "127.4.5.6", "::1", "::ffff:127.0.0.1", "[::1]", "0:0:0:0:0:0:0:1"].each do |remote|
        expect(get("/debug/pprof/?#{token_query}", remote: remote).status).to eq(200), remote
      end
    end

    it "refuses other addresses with 403, before looking at the token" do
      ["10.0.0.1", "192.168.1.20", "::ffff:10.0.0.1", "2001:db8::1", "fe80::1%eth0", "::127.0.0.1",
       "127.0.0.1/0", "0.0.0.0/0", "localhost", "", "not an address"].each do |remote|
        response = get("/debug/pprof/heap?#{token_query}", remote: remote)
        expect(response.status).to eq(403), remote
        expect(response.body).to start_with("forbidden")
      end
      expect(get("/debug/pprof/heap", remote: "10.0.0.1").status).to eq(403) # no token: still 403
      no_address = Rack::MockRequest.env_for("/debug/pprof/?#{token_query}")
      no_address.delete("REMOTE_ADDR")
      expect(app.call(no_address).first).to eq(403)
      expect(app.flush_count).to eq(0)
    end

    it "does not trust X-Forwarded-For or X-Real-IP" do
      response = get("/debug/pprof/?#{token_query}", remote: "203.0.113.9",
                                                     env: { "HTTP_X_FORWARDED_FOR" => "127.0.0.1",
                                                            "HTTP_X_REAL_IP" => "127.0.0.1" })
      expect(response.status).to eq(403)
    end

    it "serves any address with allow_remote: true, and listed ranges (and loopback) with an Array" do
      open = described_class.new(collector, token: RackAppSpec::TOKEN, allow_remote: true)
      expect(get("/debug/pprof/?#{token_query}", target: open, remote: "203.0.113.9").status).to eq(200)
      expect(get("/debug/pprof/", target: open, remote: "203.0.113.9").status).to eq(401)

      ranges = described_class.new(collector, token: RackAppSpec::TOKEN,
                                              allow_remote: ["10.0.0.0/8", IPAddr.new("2001:db8::/32")])
      { "10.1.2.3" => 200, "::ffff:10.9.9.9" => 200, "2001:db8::5" => 200, "127.0.0.1" => 200, "::1" => 200,
        "11.0.0.1" => 403, "2001:db9::1" => 403, "192.168.0.1" => 403 }.each do |remote, status|
        expect(get("/debug/pprof/?#{token_query}", target: ranges, remote: remote).status).to eq(status), remote
      end
    end

    it "takes the token as a query parameter or a Bearer header" do
      expect(get("/debug/pprof/?#{token_query}").status).to eq(200)
      expect(get("/debug/pprof/?debug=1&#{token_query}&token=later-ones-are-ignored").status).to eq(200)
      expect(get("/debug/pprof/", env: { "HTTP_AUTHORIZATION" => "Bearer #{RackAppSpec::TOKEN}" }).status).to eq(200)
      expect(get("/debug/pprof/", env: { "HTTP_AUTHORIZATION" => "bearer  #{RackAppSpec::TOKEN} " }).status).to eq(200)
    end

    it "answers 401 to a missing or wrong token, without revealing it" do
      wrong = [
        {},
        { "HTTP_AUTHORIZATION" => "Bearer #{RackAppSpec::TOKEN}x" },
        { "HTTP_AUTHORIZATION" => "Basic #{["user:#{RackAppSpec::TOKEN}"].pack('m0')}" },
        { "HTTP_AUTHORIZATION" => RackAppSpec::TOKEN }
      ]
      wrong.each do |env|
        response = get("/debug/pprof/heap", env: env)
        expect(response.status).to eq(401)
        expect(response.headers["WWW-Authenticate"]).to start_with("Bearer")
        expect(response.body).to start_with("unauthorized")
        expect(response.body).not_to include(RackAppSpec::TOKEN)
        expect_common_headers(response)
      end
      encoded = URI.encode_www_form_component(RackAppSpec::TOKEN)
      ["token=", "token=#{encoded[0..-2]}", "token=#{encoded}x", "token=#{RackAppSpec::TOKEN}", "tok=#{encoded}",
       "token=%zz"].each do |query|
        response = get_raw_query("/debug/pprof/heap", query)
        expect(response.status).to eq(401), query
        expect(response.body).not_to include(RackAppSpec::TOKEN)
      end
      expect(app.flush_count).to eq(0)
    end

    # Issue 36, item 7: a 1 MB query cost seconds of CPU before the token
    # was looked at. The work is counted in objects allocated, not timed:
    # parsing such a query made 2.5 million.
    it "answers 401 to a huge query without parsing it, and reads only a token from it before" do
      allow(app).to receive(:parse_query).and_call_original
      allow(URI).to receive(:decode_www_form_component).and_call_original
      pairs = "a=b&" * 250_000
      [pairs, "#{pairs}token=wrong-token-0123456789", "token=#{'%41' * 350_000}",
       "#{'&' * 1_000_000}token", "#{'token' * 200_000}=x"].each do |query|
        expect(query.bytesize).to be >= 1_000_000
        before = GC.stat(:total_allocated_objects)
        response = get_raw_query("/debug/pprof/heap", query)
        expect(GC.stat(:total_allocated_objects) - before).to be < 2_000
        expect(response.status).to eq(401)
      end
      expect(app).not_to have_received(:parse_query)
      # At most the token's own value is decoded, and only one short enough
      # to be sent in a query at all.
      expect(URI).to have_received(:decode_www_form_component).once.with("wrong-token-0123456789")
      expect(app.flush_count).to eq(0)
    end

    it "answers 414, naming the limit, to a query over 8192 bytes once the token is right" do
      limit = described_class::MAX_QUERY_BYTES
      expect(limit).to eq(8192)
      bearer = { "HTTP_AUTHORIZATION" => "Bearer #{RackAppSpec::TOKEN}" }
      filler = "&pad=#{'x' * limit}"
      [[token_query + filler, {}], [filler, bearer], ["debug=1#{filler}&#{token_query}", {}]].each do |query, env|
        response = get_raw_query("/debug/pprof/heap", query, env: env)
        expect(response.status).to eq(414), query[0, 40]
        expect(response.body).to eq("query string too long: #{query.bytesize} bytes, at most #{limit}\n")
        expect(response.headers["X-Go-Pprof"]).to eq("1")
      end
      # Up to the limit, a query is read as before.
      fitting = "debug=1&#{token_query}&pad=".then { |start| start + ("x" * (limit - start.bytesize)) }
      expect(fitting.bytesize).to eq(limit)
      response = get_raw_query("/debug/pprof/heap", fitting)
      expect(response.status).to eq(200)
      expect(response.content_type).to eq("text/plain; charset=utf-8")
      expect(get_raw_query("/debug/pprof/heap", "token&#{token_query}").status).to eq(401) # the first token counts
    end

    it "compares fixed-length digests, so the length of a guess does not matter" do
      compared = []
      allow(OpenSSL).to receive(:fixed_length_secure_compare).and_wrap_original do |original, a, b|
        compared << [a.bytesize, b.bytesize]
        original.call(a, b)
      end
      ["x", "x" * 1000, RackAppSpec::TOKEN].each { |guess| get("/debug/pprof/?#{token_query(guess)}") }
      expect(compared).to all(eq([32, 32]))
      expect(compared.size).to be >= 3
    end
  end

  describe "routing" do
    it "answers 404 to unknown profiles, 405 to other methods, and lists the profiles at the index" do
      %w[/debug/pprof/goroutine /debug/pprof/heap/x /debug/pprof/profile /debug/pprofx /elsewhere].each do |path|
        response = get("#{path}?#{token_query}")
        expect(response.status).to eq(404), path
        expect_common_headers(response)
      end
      %w[POST PUT DELETE OPTIONS].each do |method|
        response = get("/debug/pprof/heap?#{token_query}", method: method)
        expect(response.status).to eq(405)
        expect(response.headers["Allow"]).to eq("GET, HEAD")
      end
      %w[/debug/pprof /debug/pprof/].each do |path|
        response = get("#{path}?#{token_query}")
        expect(response.status).to eq(200)
        expect(response.content_type).to eq("text/html; charset=utf-8")
        expect(response.body).to include(">heap</a>", ">allocs</a>", "pid #{Process.pid}")
        # Links that work from a browser: the token given in the URL is kept.
        expect(response.body).to include(%(href="/debug/pprof/heap?#{token_query.gsub('&', '&amp;')}"))
        expect(response.body).to include("/debug/pprof/allocs?#{token_query.gsub('&', '&amp;')}&amp;debug=1")
        expect_common_headers(response)
      end
      by_header = get("/debug/pprof/", env: { "HTTP_AUTHORIZATION" => "Bearer #{RackAppSpec::TOKEN}" })
      expect(by_header.body).to include(%(href="/debug/pprof/heap"))
      expect(by_header.body).not_to include(RackAppSpec::TOKEN.gsub("&", "&amp;"))
      expect(app.flush_count).to eq(0)
    end

    it "answers HEAD with headers only, and does not flush for it" do
      index = get("/debug/pprof/?#{token_query}", method: "HEAD")
      expect(index.status).to eq(200)
      expect(index.body).to eq("")
      expect(index.headers["Content-Length"].to_i).to be > 0
      heap = get("/debug/pprof/heap?#{token_query}", method: "HEAD")
      expect(heap.status).to eq(200)
      expect(heap.body).to eq("")
      expect(heap.content_type).to eq("application/octet-stream")
      expect(get("/debug/pprof/heap", method: "HEAD").status).to eq(401)
      expect(app.flush_count).to eq(0)
    end

    it "answers 400 to malformed parameters, without flushing" do
      ["debug=x", "debug=-1", "gc=yes", "seconds=5", "debug=1&seconds=1", "%zz=1", "debug=%"].each do |query|
        response = get_raw_query("/debug/pprof/heap", "#{token_query}&#{query}")
        expect(response.status).to eq(400), query
        expect(response.headers["X-Go-Pprof"]).to eq("1")
      end
      bearer = { "HTTP_AUTHORIZATION" => "Bearer #{RackAppSpec::TOKEN}" }
      expect(get_raw_query("/debug/pprof/heap", "token=%zz", env: bearer).body).to eq("malformed query string\n")
      expect(get("/debug/pprof/heap?#{token_query}&seconds=1").body).to include("only supported on /debug/pprof/allocs")
      ["0", "301", "-1", "1.5", "abc", "", "99999999999999999999"].each do |seconds|
        response = get("/debug/pprof/allocs?#{token_query}&seconds=#{seconds}")
        expect(response.status).to eq(400), seconds
        expect(response.body).to eq("seconds must be a whole number from 1 to 300\n")
      end
      expect(app.flush_count).to eq(0)
    end
  end

  describe "profiles" do
    it "serves /heap: flushes and returns the gzipped pprof, default sample type inuse_space" do
      collector.start!
      kept = Workload::Allocator.new.outer(300)
      # gc=1: in-use counts what a GC has seen alive (Collector::INUSE_AS_OF).
      response = get("/debug/pprof/heap?gc=1&#{token_query}")
      expect(response.status).to eq(200)
      expect(response.content_type).to eq("application/octet-stream")
      expect(response.headers["Content-Disposition"]).to eq('attachment; filename="heap"')
      expect_common_headers(response)
      profile = parse_profile(response.body)
      expect(profile.default_sample_type).to eq("inuse_space")
      expect(profile.sample_type_names).to eq(%w[alloc_objects alloc_space inuse_objects inuse_space])
      expect(total_through(profile, "Workload::Allocator#outer", "inuse_objects")).to be >= 300
      expect(app.flush_count).to eq(1)
      expect(app.request_count).to eq(1)
      expect(kept.size).to eq(300)
    end

    it "runs GC.start first with gc=1 only" do
      expect(GC).to receive(:start).once.and_call_original
      expect(get("/debug/pprof/heap?gc=1&#{token_query}").status).to eq(200)
      expect(get("/debug/pprof/heap?gc=0&#{token_query}").status).to eq(200)
      expect(get("/debug/pprof/heap?#{token_query}").status).to eq(200)
    end

    # Needs MemprofilerPprof::Profile (#to_pprof).
    it "serves /allocs: the allocations since the previous flush, default sample type alloc_space" do
      collector.start!
      Workload::Allocator.new.outer(100)
      expect(get("/debug/pprof/heap?#{token_query}").status).to eq(200) # ends the interval
      Workload::Allocator.big_strings(50, 100)
      response = get("/debug/pprof/allocs?#{token_query}")
      expect(response.status).to eq(200), response.body
      expect(response.headers["Content-Disposition"]).to eq('attachment; filename="allocs"')
      expect_common_headers(response)
      profile = parse_profile(response.body)
      expect(profile.default_sample_type).to eq("alloc_space")
      expect(total_through(profile, "Workload::Allocator.big_strings", "alloc_objects")).to be >= 50
      expect(total_through(profile, "Workload::Allocator#outer", "alloc_objects")).to eq(0)
    end

    # Needs MemprofilerPprof::Profile (#to_pprof).
    it "serves /allocs?seconds=N: the allocations of the next N seconds only" do
      collector.start!
      Workload::Allocator.new.outer(100) # before: not in the answer
      during = Thread.new do
        sleep 0.3
        Workload::Allocator.big_strings(50, 100)
      end
      response = nil
      took = elapsed { response = get("/debug/pprof/allocs?seconds=1&#{token_query}") }
      during.join
      expect(took).to be >= 1.0
      expect(response.status).to eq(200), response.body
      expect(response.headers["Content-Disposition"]).to eq('attachment; filename="allocs-delta"')
      profile = parse_profile(response.body)
      expect(profile.default_sample_type).to eq("alloc_space")
      expect(total_through(profile, "Workload::Allocator.big_strings", "alloc_objects")).to be >= 50
      expect(total_through(profile, "Workload::Allocator#outer", "alloc_objects")).to eq(0)
      expect(app.flush_count).to eq(2)
    end

    # Needs MemprofilerPprof::Profile (#top).
    it "returns a text summary with debug=1" do
      # Once first, before sampling: what the first request loads (the
      # profile reader, Rack::Lint) would otherwise fill the summary's
      # 50 rows in some spec orders (seed 42636), crowding out #leaf.
      expect(get("/debug/pprof/heap?debug=1&#{token_query}").status).to eq(200)
      collector.start!
      kept = Workload::Allocator.new.outer(300)
      %w[heap allocs].each do |name|
        response = get("/debug/pprof/#{name}?debug=1&gc=1&#{token_query}")
        expect(response.status).to eq(200), response.body
        expect(response.content_type).to eq("text/plain; charset=utf-8")
        expect(response.headers["Content-Disposition"]).to be_nil
        # (The workload's outermost method: its #leaf has no flat bytes,
        # String#* has them, and may fall below the 50 rows.)
        expect(response.body).to include("Workload::Allocator#outer") if name == "heap"
        expect_common_headers(response)
      end
      expect(kept.size).to eq(300)
    end
  end

  describe "flushing" do
    it "never lets two requests flush at once: the second waits for the first" do
      tracker = OverlapTracker.new
      tracker.instrument(collector, delay: 0.3)
      statuses = Queue.new
      took = elapsed do
        Array.new(3) { Thread.new { statuses << get("/debug/pprof/heap?#{token_query}").status } }.each(&:join)
      end
      expect(Array.new(statuses.size) { statuses.pop }).to eq([200, 200, 200])
      expect(tracker.calls).to eq(3)
      expect(tracker.max_active).to eq(1)
      expect(took).to be >= 0.9
      expect(app.flush_count).to eq(3)
    end

    it "answers 503 with Retry-After once wait_timeout has passed" do
      tracker = OverlapTracker.new
      tracker.instrument(collector, delay: 1.0)
      impatient = described_class.new(collector, token: RackAppSpec::TOKEN, wait_timeout: 0.1)
      first = Thread.new { get("/debug/pprof/heap?#{token_query}", target: impatient) }
      eventually { tracker.calls == 1 }
      second = nil
      took = elapsed { second = get("/debug/pprof/heap?#{token_query}", target: impatient) }
      expect(second.status).to eq(503)
      expect(second.headers["Retry-After"]).to eq("1")
      expect(second.body).to start_with("busy")
      expect(took).to be_between(0.09, 0.8) # gave up after wait_timeout, not after the flush
      expect(first.value.status).to eq(200)
      expect(get("/debug/pprof/heap?#{token_query}", target: impatient).status).to eq(200) # free again
    end

    it "holds the endpoint during allocs?seconds=N, and says how long in Retry-After" do
      impatient = described_class.new(collector, token: RackAppSpec::TOKEN, wait_timeout: 0.1)
      window = Thread.new { get("/debug/pprof/allocs?seconds=3&#{token_query}", target: impatient) }
      eventually { impatient.flush_count == 1 }
      busy = get("/debug/pprof/heap?#{token_query}", target: impatient)
      expect(busy.status).to eq(503)
      expect(busy.headers["Retry-After"].to_i).to be_between(1, 3)
      window.kill # (its 3 s are not needed) - the slot is released all the same
      window.join
      expect(get("/debug/pprof/heap?#{token_query}", target: impatient).status).to eq(200)
    end

    it "turns a failed flush into a 500, logged and counted, and frees the endpoint" do
      OverlapTracker.new.instrument(collector, delay: 0, failure: RuntimeError.new("boom"))
      response = get("/debug/pprof/heap?#{token_query}")
      expect(response.status).to eq(500)
      expect(response.body).to eq("profile failed: RuntimeError: boom\n")
      expect(response.content_type).to eq("text/plain; charset=utf-8")
      expect(response.headers["X-Go-Pprof"]).to eq("1")
      expect_common_headers(response)
      expect(app.error_count).to eq(1)
      expect(app.last_error).to be_a(RuntimeError).and(have_attributes(message: "boom"))
      expect(errors_logged).to eq(["memprofiler_pprof_rs RackApp: heap profile failed: RuntimeError: boom"])

      # Not stuck: another request gets as far as the (still failing) flush.
      expect(get("/debug/pprof/heap?#{token_query}").status).to eq(500)
      expect(app.error_count).to eq(2)
      expect(app.request_count).to eq(2)
    end

    it "logs to $stderr without a logger, and survives a broken logger" do
      OverlapTracker.new.instrument(collector, delay: 0, failure: IOError.new("disk gone"))
      quiet = described_class.new(collector, token: RackAppSpec::TOKEN)
      expect { expect(get("/debug/pprof/heap?#{token_query}", target: quiet).status).to eq(500) }
        .to output(/memprofiler_pprof_rs RackApp: heap profile failed: IOError: disk gone/).to_stderr
      broken_logger = Object.new
      def broken_logger.error(_message) = raise("logger down")
      broken = described_class.new(collector, token: RackAppSpec::TOKEN, logger: broken_logger)
      expect(get("/debug/pprof/heap?#{token_query}", target: broken).status).to eq(500)
      expect(broken.error_count).to eq(1)
    end
  end

  describe "retainers" do
    let(:kept) { Array.new(300) { |i| "kept #{i} " * 20 } }

    before do
      stub_const("RackAppSpecLeak", Module.new)
      collector.start!
      RackAppSpecLeak.const_set(:CACHE, kept)
    end

    it "serves what holds the biggest sites as text, or as JSON the CLI reads, without flushing" do
      text = get("/debug/pprof/retainers?#{token_query}&top=3&per_site=2")
      expect(text.status).to eq(200)
      expect(text.content_type).to eq("text/plain; charset=utf-8")
      expect(text.body).to match(/^   String: RackAppSpecLeak::CACHE \(constant\) -> Array\[\d+\] -> String$/)
      expect_common_headers(text)

      json = get("/debug/pprof/retainers?#{token_query}&format=json&site=rack_app_spec")
      expect(json.content_type).to eq("application/json")
      Dir.mktmpdir do |dir|
        File.write(File.join(dir, "r.json"), json.body)
        report = MemprofilerPprof::RetentionReport.load(File.join(dir, "r.json"))
        expect(report.sites.map { |site| site["site"] }).to all(include("rack_app_spec.rb"))
      end
      expect(get("/debug/pprof/?#{token_query}").body).to include(">retainers</a>")
      expect(app.flush_count).to eq(0)
    end

    it "answers bad parameters with 400, HEAD with headers only, and a report under way with 503" do
      expect(get("/debug/pprof/retainers?#{token_query}&top=x").body).to eq("top must be a whole number\n")
      zero = get("/debug/pprof/retainers?#{token_query}&top=0")
      expect([zero.status, zero.body]).to eq([400, "top must be a whole number from 1 to 100, got 0\n"])
      expect(get("/debug/pprof/retainers?#{token_query}&gc=2").body).to eq("gc must be 0 or 1\n")
      expect(get("/debug/pprof/retainers?#{token_query}&format=xml").status).to eq(400)
      expect(get("/debug/pprof/retainers?#{token_query}&timeout=301").body)
        .to eq("timeout must be a whole number of seconds from 1 to 300\n")
      head = get("/debug/pprof/retainers?#{token_query}", method: "HEAD")
      expect([head.status, head.body]).to eq([200, ""])
      expect(get("/debug/pprof/retainers").status).to eq(401)

      MemprofilerPprof::Retention::LOCK.synchronize do
        busy = get("/debug/pprof/retainers?#{token_query}")
        expect([busy.status, busy.headers["Retry-After"]]).to eq([503, "10"])
        expect(busy.body).to eq("retention report failed: a retention report is already running in this process\n")
      end
      collector.stop!
      stopped = get("/debug/pprof/retainers?#{token_query}")
      expect([stopped.status, stopped.body]).to match([503, /needs a running collector/])
      expect(logger.errors).to be_empty
    end
  end

  describe "mounting" do
    let(:inner) { ->(env) { [200, { "content-type" => "text/plain" }, ["app saw #{env['PATH_INFO']}"]] } }

    it "works under map \"/debug/pprof\"" do
      pprof = app
      fallback = inner
      builder = Rack::Builder.new do
        map("/debug/pprof") { run pprof }
        map("/") { run fallback }
      end
      heap = get("/debug/pprof/heap?#{token_query}", target: builder)
      expect(heap.status).to eq(200)
      expect(parse_profile(heap.body).default_sample_type).to eq("inuse_space")
      index = get("/debug/pprof/?#{token_query}", target: builder)
      expect(index.body).to include(%(href="/debug/pprof/heap?))
      expect(get("/debug/pprof/nope?#{token_query}", target: builder).status).to eq(404)
      expect(get("/other", target: builder).body).to eq("app saw /other")
    end

    it "works as middleware: answers /debug/pprof/..., passes everything else on" do
      fallback = inner
      builder = Rack::Builder.new do
        use MemprofilerPprof::RackApp::Middleware, MemprofilerPprof::Collector.new(sample_rate: 0.0),
            token: RackAppSpec::TOKEN, wait_timeout: 5
        run fallback
      end
      heap = get("/debug/pprof/heap?#{token_query}", target: builder)
      expect(heap.status).to eq(200)
      parse_profile(heap.body)
      expect(get("/debug/pprof/heap", target: builder).status).to eq(401)
      expect(get("/debug/pprof/heap?#{token_query}", target: builder, remote: "10.0.0.1").status).to eq(403)
      expect(get("/debug/pprof?#{token_query}", target: builder).status).to eq(200)
      %w[/ /users/1 /debug/pprofile /debug /heap].each do |path|
        response = get(path, target: builder, remote: "10.0.0.1", method: "POST")
        expect(response.body).to eq("app saw #{path}"), path
      end
      expect { MemprofilerPprof::RackApp::Middleware.new(nil, collector, token: RackAppSpec::TOKEN) }
        .to raise_error(TypeError, /app must respond to #call/)
      middleware = MemprofilerPprof::RackApp::Middleware.new(fallback, collector, token: RackAppSpec::TOKEN)
      expect(middleware.rack_app).to be_a(described_class)
    end

    it "links the index under the middleware's own mount point" do
      collector_app = collector
      builder = Rack::Builder.new do
        map("/admin") do
          use MemprofilerPprof::RackApp::Middleware, collector_app, token: RackAppSpec::TOKEN
          run ->(_env) { [404, {}, []] }
        end
      end
      index = get("/admin/debug/pprof/?#{token_query}", target: builder)
      expect(index.status).to eq(200)
      expect(index.body).to include(%(href="/admin/debug/pprof/heap?))
    end
  end

  # A real server (WEBrick through Rack's handler, in its own process; the
  # fixture says why not puma) read by a real go tool pprof.
  describe "served by a real server, read by go tool pprof", :slow do
    before(:all) do
      @dir = Dir.mktmpdir("rack-app-spec")
      File.write(File.join(@dir, "config.ru"), <<~RUBY)
        $LOAD_PATH.unshift(#{RackAppSpec::LIB.inspect})
        require "memprofiler_pprof_rs"
        require #{RackAppSpec::WORKLOAD.inspect}
        collector = MemprofilerPprof::Collector.new(sample_rate: 1.0, max_allocation_samples: 1_000_000,
                                                    max_heap_samples: 10_000_000).tap(&:start!)
        $kept = Workload::Allocator.new.outer(2000)
        use MemprofilerPprof::RackApp::Middleware, collector, token: ENV.fetch("PPROF_TOKEN")
        run lambda { |env|
          $last = Workload::Allocator.big_strings(500, 100) if env["PATH_INFO"] == "/allocate"
          [200, { "content-type" => "text/plain" }, ["ok\\n"]]
        }
      RUBY
      @log = File.join(@dir, "server.log")
      @pid = Process.spawn({ "PPROF_TOKEN" => RackAppSpec::TOKEN }, RbConfig.ruby, RackAppSpec::SERVE, "config.ru",
                           chdir: @dir, out: @log, err: [:child, :out])
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 30
      until (@port = File.read(@log)[%r{Listening on (?:http|tcp)://127\.0\.0\.1:(\d+)}, 1])
        raise "the server did not start:\n#{File.read(@log)}" if Process.waitpid(@pid, Process::WNOHANG)
        if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
          raise "the server did not start in 30 s:\n#{File.read(@log)}"
        end

        sleep 0.05
      end
    rescue StandardError
      stop_server
      raise
    end

    after(:all) { stop_server }

    def stop_server
      if @pid
        begin
          Process.kill("TERM", @pid)
          deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 10
          sleep 0.05 until Process.waitpid(@pid, Process::WNOHANG) ||
                           Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
          if Process.waitpid(@pid, Process::WNOHANG).nil?
            Process.kill("KILL", @pid)
            Process.waitpid(@pid)
          end
        rescue Errno::ESRCH, Errno::ECHILD
          nil
        end
        @pid = nil
      end
      FileUtils.rm_rf(@dir) if @dir
    end

    def url(path) = "http://127.0.0.1:#{@port}#{path}"

    def go_cache
      @go_cache ||= Open3.capture2("go", "env", "GOCACHE").first.strip
    end

    # pprof keeps what it fetched under HOME, so HOME is a fresh folder;
    # GOCACHE stays the user's, or go builds its pprof tool again (~30 s).
    def go_pprof_url(target)
      home = File.join(@dir, "home")
      FileUtils.mkdir_p(home)
      env = { "PPROF_TMPDIR" => home, "HOME" => home, "GOCACHE" => go_cache }
      Open3.capture3(env, "go", "tool", "pprof", "-top", target)
    end

    it "serves the heap profile to go tool pprof" do
      # (gc=1: garbage of earlier requests would hide it below pprof's node fraction.)
      out, err, status = go_pprof_url(url("/debug/pprof/heap?gc=1&#{token_query}"))
      expect(status).to be_success, "#{err}\n#{File.read(@log)}"
      expect(out).to include("Type: inuse_space", "Workload::Allocator#outer")
    end

    # Needs MemprofilerPprof::Profile (#to_pprof).
    it "serves the allocs profile to go tool pprof" do
      expect(Net::HTTP.get_response(URI(url("/allocate"))).code).to eq("200")
      out, err, status = go_pprof_url(url("/debug/pprof/allocs?#{token_query}"))
      expect(status).to be_success, "#{err}\n#{File.read(@log)}"
      expect(out).to include("Type: alloc_space", "Workload::Allocator.big_strings")
    end

    it "refuses go tool pprof without the token: 401, and pprof exits non-zero" do
      _out, err, status = go_pprof_url(url("/debug/pprof/heap"))
      expect(status).not_to be_success
      expect(err).to include("401")
      expect(Net::HTTP.get_response(URI(url("/debug/pprof/heap"))).code).to eq("401")
      expect(Net::HTTP.get_response(URI(url("/debug/pprof/heap?token=wrong-token-0123456789"))).code).to eq("401")
    end
  end
end
