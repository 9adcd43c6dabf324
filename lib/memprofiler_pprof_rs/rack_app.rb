# frozen_string_literal: true

require "ipaddr"
require "openssl"
require "uri"

module MemprofilerPprof
  # A Rack endpoint that serves the collector's profiles the way Go's
  # net/http/pprof does, so that `go tool pprof` can read a Ruby server:
  #
  #   # config.ru
  #   collector = MemprofilerPprof::Collector.new(sample_rate: 0.01).tap(&:start!)
  #   use MemprofilerPprof::RackApp::Middleware, collector, token: ENV.fetch("PPROF_TOKEN")
  #   run MyApp
  #
  #   go tool pprof -top 'http://127.0.0.1:9292/debug/pprof/heap?token=...'
  #
  # or mounted: `map("/debug/pprof") { run MemprofilerPprof::RackApp.new(collector, token: ...) }`.
  # Nothing is served unless the app is mounted; the gem does not depend on
  # rack (it only uses Rack's header class when Rack is loaded).
  #
  #   GET /debug/pprof/         an index of the profiles
  #   GET /debug/pprof/heap     flushes and returns the gzipped pprof, default
  #                             sample type inuse_space; ?gc=1 runs GC.start first
  #   GET /debug/pprof/allocs   the same profile, default sample type alloc_space;
  #                             ?seconds=N (1..300): flushes, waits N seconds and
  #                             returns the allocations of those N seconds
  #   ?debug=1                  a text summary (top 50 functions) instead
  #   GET /debug/pprof/retainers what holds the sites with the most memory in
  #                             use (Collector#retention_report), as text;
  #                             ?top=N&per_site=N&site=TEXT&timeout=S (1-300)
  #                             &max_objects=N&max_memory_mb=N&gc=1 (a full GC
  #                             first), format=json for the report
  #                             `memprofiler_pprof_rs retainers FILE` prints
  #
  # Security. Every request needs the token, as `?token=` (go tool pprof
  # cannot send headers) or `Authorization: Bearer <token>`; it is compared
  # in constant time (SHA-256 digests of both, fixed-length compare), and
  # a missing or wrong one gets 401. Nothing else of the query is read
  # before the token is right (only the first `token` pair is looked for),
  # and a query over MAX_QUERY_BYTES then gets 414. Before the token, the
  # peer address is checked: by default only loopback peers (127.0.0.0/8, ::1,
  # ::ffff:127.x.x.x) are served, others get 403; `allow_remote: true`
  # serves any address, an Array of CIDR ranges ("10.0.0.0/8", IPAddr)
  # serves those as well as loopback. The address is Rack's REMOTE_ADDR,
  # the TCP peer: X-Forwarded-For and the like are never trusted, since any
  # client can send them. Behind a reverse proxy on the same host every
  # request comes from loopback, so there the token is all that protects
  # the endpoint: keep it secret and long (at least 16 characters are
  # required; `SecureRandom.hex(32)` is a good one).
  #
  # Flushing. Every request ends the collector's allocation interval (it is
  # a Collector#flush), so if a BlockFlusher, FileFlusher or
  # PyroscopeFlusher also flushes the same collector, /allocs shows the
  # allocations since whichever flush came last, and the flusher's next
  # profile misses those this endpoint returned. Give the endpoint its own
  # collector if that matters. Heap (in-use) values are unaffected. Each
  # forked worker (puma's cluster mode) has its own collector and answers
  # for itself only; the index names the pid that answered.
  #
  # Two requests never flush at once: one waits for the other, for at most
  # `wait_timeout` seconds (5), then gets 503 with Retry-After. A
  # ?seconds=N request holds the endpoint (and its server thread) for its N
  # seconds; requests meanwhile get 503 at once, rather than each holding
  # a thread of the server too while they wait. A request never raises
  # into the server: a failed profile is a 500 "profile failed: <class>:
  # <message>", logged (to `logger`, or $stderr without one) and counted in
  # `error_count` and `last_error`.
  class RackApp
    PREFIX = "/debug/pprof"
    MIN_TOKEN_LENGTH = 16
    MAX_SECONDS = 300
    # Longer query strings get 414 (once the token is right): go tool pprof
    # sends a few short parameters, and parsing a megabyte of them took
    # seconds. Puma refuses more than 10 KiB itself.
    MAX_QUERY_BYTES = 8192
    # The first `token` pair's value, found without splitting the query
    # (linear: no backtracking past an '&').
    QUERY_TOKEN = /(?:\A|&)token(?:=([^&]*))?(?=&|\z)/n

    # name => [default sample type, description for the index]
    PROFILES = {
      "allocs" => ["alloc_space",
                   "Sampled allocations since the previous flush of this collector (this endpoint's or a " \
                   "flusher's); ?seconds=N for the allocations of the next N seconds."],
      "heap" => ["inuse_space", "Sampled objects still alive (in-use memory); ?gc=1 runs a GC first."]
    }.freeze

    RETAINERS = "retainers"
    RETAINERS_DESCRIPTION = "What holds the sites with the most memory in use: the chain of references from a " \
                            "GC root to a few of their sampled objects (?top=5&per_site=3&site=TEXT&timeout=30, " \
                            "format=json). Forks a child that walks the heap."

    LOOPBACK = [IPAddr.new("127.0.0.0/8"), IPAddr.new("::1/128")].freeze

    # Exceptions that become a 500. Others (SignalException, SystemExit, and
    # the request timeouts of Rack::Timeout and the like, which do not
    # inherit StandardError) are the server's business and pass through.
    RESCUED = [StandardError, ScriptError, SystemStackError, NoMemoryError].freeze

    BINARY = "application/octet-stream"
    TEXT = "text/plain; charset=utf-8"
    HTML = "text/html; charset=utf-8"
    JSON_TYPE = "application/json"

    attr_reader :collector, :wait_timeout, :logger, :allow_remote
    # Requests answered (whatever the status), errors logged (500s), the last
    # such error, and collector flushes made.
    attr_reader :request_count, :error_count, :last_error, :flush_count

    def initialize(collector, token:, allow_remote: false, wait_timeout: 5, logger: nil)
      Validation.instance(collector, MemprofilerPprof::Collector, :collector,
                          expected: "a MemprofilerPprof::Collector")
      @wait_timeout = Validation.seconds(wait_timeout, :wait_timeout, positive: false)
      @logger = Validation.responds_to(logger, :error, :logger, nil_ok: true, hint: "e.g. a Logger")
      @collector = collector
      @token_digest = self.class.token_digest(token)
      @allow_any, @networks = self.class.address_rule(allow_remote)
      @allow_remote = @allow_any || (@networks.empty? ? false : @networks.dup.freeze)
      @request_count = 0
      @error_count = 0
      @last_error = nil
      @flush_count = 0
      @state = Mutex.new
      @available = ConditionVariable.new
      @busy = false
      @busy_pid = nil
      @busy_until = nil
    end

    def call(env)
      @state.synchronize { @request_count += 1 }
      head = env["REQUEST_METHOD"] == "HEAD"
      begin
        answer(env, head)
      rescue *RESCUED => e
        report_error("request failed", e)
        text(500, "internal error: #{e.class}\n", head)
      end
    end

    def inspect
      rule = if @allow_any
               "any address"
             elsif @networks.empty?
               "loopback only"
             else
               "loopback and #{@networks.map { |n| "#{n}/#{n.prefix}" }.join(', ')}"
             end
      format("#<%s %s requests=%d flushes=%d errors=%d>", self.class.name, rule, request_count, flush_count,
             error_count)
    end
    alias to_s inspect

    # True for the paths the Middleware answers: /debug/pprof and below.
    def self.pprof_path?(path)
      path = path.to_s
      path == PREFIX || path.start_with?("#{PREFIX}/")
    end

    # Answers /debug/pprof/... with a RackApp and passes every other
    # request to the application untouched:
    #
    #   use MemprofilerPprof::RackApp::Middleware, collector, token: ENV.fetch("PPROF_TOKEN")
    class Middleware
      # The RackApp answering /debug/pprof (its counters, for instance).
      attr_reader :rack_app

      def initialize(app, collector, **options)
        @app = Validation.responds_to(app, :call, :app)
        @rack_app = RackApp.new(collector, **options)
      end

      def call(env)
        RackApp.pprof_path?(env["PATH_INFO"]) ? @rack_app.call(env) : @app.call(env)
      end
    end

    # ----- construction checks ----------------------------------------------

    # The SHA-256 digest of a valid token; errors never include the token.
    def self.token_digest(token)
      rule = "a String of at least #{MIN_TOKEN_LENGTH} characters"
      # (The token itself is never shown: only its class and length.)
      raise TypeError, "token is required: #{rule}, got nil" if token.nil?
      raise TypeError, "token must be #{rule}, got #{Validation.article(token.class)}" unless token.is_a?(String)
      raise ArgumentError, "token must be #{rule}, got an empty String" if token.empty?
      raise ArgumentError, "token is not valid #{token.encoding} text" unless token.valid_encoding?
      if token.length < MIN_TOKEN_LENGTH
        raise ArgumentError, "token is too short: #{token.length} characters, at least #{MIN_TOKEN_LENGTH} needed"
      end

      if token.match?(/[[:space:]]|[[:cntrl:]]/)
        raise ArgumentError, "token must not contain whitespace or control characters " \
                             "(read from a file or an environment variable? strip it)"
      end

      bytes = token.encoding == Encoding::BINARY ? token : token.encode(Encoding::UTF_8)
      OpenSSL::Digest.digest("SHA256", bytes.b)
    end

    # [allow any address?, extra networks]
    def self.address_rule(allow_remote)
      return [true, []] if allow_remote == true
      return [false, []] if allow_remote == false || allow_remote.nil?

      Validation.instance(allow_remote, Array, :allow_remote,
                          expected: "true, false or an Array of CIDR ranges (e.g. [\"10.0.0.0/8\"])")

      networks = allow_remote.map do |entry|
        next entry.dup if entry.is_a?(IPAddr)

        Validation.instance(entry, [String, IPAddr], "allow_remote entry",
                            expected: "an IP address or CIDR range String (e.g. \"10.0.0.0/8\") or an IPAddr")
        begin
          IPAddr.new(entry.strip)
        rescue ArgumentError # IPAddr::Error (an invalid address) is one too
          raise ArgumentError, "allow_remote entry #{entry.inspect} is not an IP address or CIDR range " \
                               "(e.g. \"10.0.0.0/8\", \"fd00::/8\")"
        end
      end
      [false, networks]
    end

    # REMOTE_ADDR as an IPAddr (IPv4-mapped IPv6 as IPv4), or nil. Only a
    # bare address: a "/prefix" would make IPAddr read a whole network.
    def self.parse_address(address)
      return nil unless address.is_a?(String)

      address = address.strip
      address = address[1...-1] if address.start_with?("[") && address.end_with?("]")
      address = address.sub(/%[\w.-]+\z/, "") # IPv6 zone: fe80::1%eth0
      return nil unless address.match?(/\A[0-9A-Fa-f:.]{2,45}\z/)

      ip = IPAddr.new(address)
      ip.ipv4_mapped? ? ip.native : ip
    rescue ArgumentError # IPAddr::Error (an invalid address) is one too
      nil
    end

    private

    # ----- the request --------------------------------------------------------

    def answer(env, head)
      return text(403, "forbidden: this address may not read profiles\n", head) unless address_allowed?(env)

      # The token first, and nothing else of the query before it is right.
      query = env["QUERY_STRING"].to_s
      query_token = query_token(query)
      query_ok = token_matches?(query_token)
      header_ok = token_matches?(bearer_token(env))
      unless query_ok || header_ok
        return text(401, "unauthorized: a valid token is required (?token= or Authorization: Bearer)\n", head,
                    "www-authenticate" => 'Bearer realm="pprof"')
      end
      if query.bytesize > MAX_QUERY_BYTES
        return text(414, "query string too long: #{query.bytesize} bytes, at most #{MAX_QUERY_BYTES}\n", head)
      end

      params, malformed = parse_query(query)

      name = route(env["PATH_INFO"])
      return text(404, "not found: the profiles are #{PROFILES.keys.join(' and ')}, and #{RETAINERS}\n", head) if name.nil?
      unless %w[GET HEAD].include?(env["REQUEST_METHOD"])
        return text(405, "method not allowed: use GET\n", head, "allow" => "GET, HEAD")
      end
      return text(400, "malformed query string\n", head) if malformed
      return index(env, query_ok ? query_token : nil, head) if name == :index
      return serve_retainers(params, head) if name == RETAINERS

      serve_profile(name, params, head)
    end

    # :index, a profile name, or nil (unknown).
    def route(path)
      path = path.to_s
      path = path[PREFIX.size..] if self.class.pprof_path?(path)
      return :index if path.empty? || path == "/"

      match = path.match(%r{\A/([^/]+)\z})
      match && (PROFILES.key?(match[1]) || match[1] == RETAINERS) ? match[1] : nil
    end

    # /retainers: a retention report, as text or JSON. One at a time per
    # process (RetentionError otherwise: 503).
    def serve_retainers(params, head)
      options = {}
      { "top" => 5, "per_site" => 3, "timeout" => 30, "max_objects" => 5_000_000, "max_memory_mb" => 512,
        "gc" => 0 }.each do |name, default|
        value = integer_param(params, name)
        return text(400, "#{name} must be a whole number\n", head) if value == :invalid

        options[name.to_sym] = value || default
      end
      return text(400, "gc must be 0 or 1\n", head) unless [0, 1].include?(options[:gc])

      options[:gc] = options[:gc] == 1
      unless options[:timeout].between?(1, MAX_SECONDS)
        return text(400, "timeout must be a whole number of seconds from 1 to #{MAX_SECONDS}\n", head)
      end

      options[:sites] = [params["site"]] if params["site"] && !params["site"].empty?
      json = params["format"] == "json"
      return text(400, "format must be json or left out (text)\n", head) if params.key?("format") && !json
      return [200, headers(json ? JSON_TYPE : TEXT, nil, {}), []] if head

      report = @collector.retention_report(**options)
      json ? respond(200, report.to_json, JSON_TYPE, false) : respond(200, report.to_s, TEXT, false)
    rescue ArgumentError => e
      text(400, "#{e.message}\n", head)
    rescue RetentionError, StateError => e
      text(503, "retention report failed: #{e.message}\n", head, "retry-after" => "10")
    rescue *RESCUED => e
      detail = "#{e.class}: #{e.message}"
      report_error("retention report failed", e, detail)
      text(500, "retention report failed: #{detail}\n", head)
    end

    def serve_profile(name, params, head)
      debug = integer_param(params, "debug")
      gc = integer_param(params, "gc")
      seconds = integer_param(params, "seconds")
      return text(400, "debug must be 0 (pprof) or 1 (text)\n", head) if debug == :invalid
      return text(400, "gc must be 0 or 1\n", head) if gc == :invalid

      if params.key?("seconds")
        if name != "allocs"
          return text(400, "seconds is only supported on #{PREFIX}/allocs (in-use memory is a snapshot)\n", head)
        end
        unless seconds.is_a?(Integer) && seconds.between?(1, MAX_SECONDS)
          return text(400, "seconds must be a whole number from 1 to #{MAX_SECONDS}\n", head)
        end
      end
      debug = debug.to_i.positive?
      content_type = debug ? TEXT : BINARY
      disposition = debug ? {} : { "content-disposition" => %(attachment; filename="#{name}#{'-delta' if seconds}") }
      # HEAD checks everything but does not flush: no side effect, and so no
      # Content-Length either.
      return [200, headers(content_type, nil, disposition), []] if head

      status, value = with_flush_slot(seconds) { collect(gc.to_i.positive?, seconds) }
      if status == :busy
        return text(503, "busy: another profile request is under way; retry later\n", false,
                    "retry-after" => value.to_s)
      end

      sample_type = PROFILES.fetch(name).first
      body = if debug
               MemprofilerPprof::Profile.parse(value).top(sample_index: sample_type, by: :function, limit: 50).to_s
             elsif name == "heap"
               value
             else
               MemprofilerPprof::Profile.parse(value).to_pprof(default_sample_type: sample_type)
             end
      respond(200, body, content_type, false, disposition)
    rescue *RESCUED => e
      # (Exception#message once: on Ruby 3.1 error_highlight parses the
      # failing file again on each call.)
      detail = "#{e.class}: #{e.message}"
      report_error("#{name} profile failed", e, detail)
      text(500, "profile failed: #{detail}\n", head)
    end

    # The flushed profile's bytes; with `seconds`, of a second flush that
    # many seconds after a first one.
    def collect(gc, seconds)
      if seconds
        flush
        sleep(seconds)
      end
      GC.start if gc
      flush
    end

    def flush
      data = @collector.flush
      @state.synchronize { @flush_count += 1 }
      data.pprof_data
    end

    # Runs the block while no other request of this app does, waiting up
    # to wait_timeout for one under way. [:ok, block's value] or [:busy,
    # seconds to suggest in Retry-After].
    def with_flush_slot(seconds)
      # The slot is taken and released with asynchronous exceptions (a
      # request timeout's Thread#raise) deferred, so that one can never
      # leave it taken; they may still interrupt the wait and the work.
      Thread.handle_interrupt(Object => :never) do
        taken, retry_after = Thread.handle_interrupt(Object => :on_blocking) { take_slot(seconds) }
        return [:busy, retry_after] unless taken

        begin
          [:ok, Thread.handle_interrupt(Object => :immediate) { yield }]
        ensure
          release_slot
        end
      end
    end

    def take_slot(seconds)
      deadline = now + @wait_timeout
      @state.synchronize do
        # Taken in the parent by a thread that did not survive a fork.
        @busy = false if @busy && @busy_pid != Process.pid
        while @busy
          # A ?seconds= window: no use waiting for it on a server thread.
          return [false, [(@busy_until - now).ceil, 1].max] if @busy_until

          remaining = deadline - now
          unless remaining.positive?
            left = @busy_until && (@busy_until - now).ceil
            return [false, [left || 1, 1].max]
          end

          @available.wait(@state, remaining)
          @busy = false if @busy && @busy_pid != Process.pid
        end
        @busy = true
        @busy_pid = Process.pid
        @busy_until = seconds && (now + seconds)
        [true, nil]
      end
    end

    def release_slot
      @state.synchronize do
        @busy = false
        @busy_until = nil
        @available.broadcast
      end
    end

    def index(env, query_token, head)
      base = "#{env['SCRIPT_NAME']}#{PREFIX if self.class.pprof_path?(env['PATH_INFO'])}"
      token = query_token && "token=#{URI.encode_www_form_component(query_token)}"
      rows = PROFILES.sort.map do |name, (_type, description)|
        href = "#{base}/#{name}"
        plain = token ? "#{href}?#{token}" : href
        text = "#{href}?#{[token, 'debug=1'].compact.join('&')}"
        "<tr><td><a href=\"#{escape(plain)}\">#{name}</a></td><td><a href=\"#{escape(text)}\">text</a></td>" \
          "<td>#{escape(description)}</td></tr>"
      end
      href = "#{base}/#{RETAINERS}#{"?#{token}" if token}"
      rows << "<tr><td><a href=\"#{escape(href)}\">#{RETAINERS}</a></td><td></td>" \
              "<td>#{escape(RETAINERS_DESCRIPTION)}</td></tr>"
      body = <<~HTML
        <!DOCTYPE html>
        <html><head><meta charset="utf-8"><title>#{escape(base)}/</title></head><body>
        <h1>#{escape(base)}/</h1>
        <p>Memory profiles of this Ruby process (pid #{Process.pid}), from memprofiler_pprof_rs.
        Each request flushes the collector.</p>
        <table>
        #{rows.join("\n")}
        </table>
        <p>Read one with <code>go tool pprof 'http://HOST#{escape(base)}/heap?token=TOKEN'</code>;
        add <code>debug=1</code> for a text summary.</p>
        </body></html>
      HTML
      respond(200, body, HTML, head, "referrer-policy" => "no-referrer")
    end

    # ----- checks -------------------------------------------------------------

    def address_allowed?(env)
      return true if @allow_any

      ip = self.class.parse_address(env["REMOTE_ADDR"])
      return false if ip.nil?

      LOOPBACK.any? { |net| net.include?(ip) } || @networks.any? { |net| net.include?(ip) }
    end

    # Constant time whatever the candidate: its digest is compared with the
    # token's, both 32 bytes, so neither length nor content leaks.
    def token_matches?(candidate)
      return false if candidate.nil?

      OpenSSL.fixed_length_secure_compare(OpenSSL::Digest.digest("SHA256", candidate.b), @token_digest)
    end

    # The value of the query's first `token` pair, decoded ("" without a
    # value), or nil: none, not valid %-encoding or UTF-8, or longer than a
    # query may be (then it is not decoded at all).
    def query_token(query)
      match = QUERY_TOKEN.match(query.b)
      return nil if match.nil?

      value = match[1].to_s
      return nil if value.bytesize > MAX_QUERY_BYTES

      token = URI.decode_www_form_component(value)
      token.valid_encoding? ? token : nil
    rescue ArgumentError
      nil
    end

    def bearer_token(env)
      match = env["HTTP_AUTHORIZATION"].to_s.match(/\A\s*Bearer\s+(\S+)\s*\z/i)
      match && match[1]
    end

    # First value of each name (as Go's FormValue); true as the second
    # element if some pair was not valid %-encoding.
    def parse_query(query)
      params = {}
      malformed = false
      query.to_s.split("&").each do |pair|
        next if pair.empty?

        key, value = pair.split("=", 2)
        begin
          key = URI.decode_www_form_component(key)
          value = URI.decode_www_form_component(value.to_s)
        rescue ArgumentError
          malformed = true
          next
        end
        # %FF and the like: not text, so not a name or value this app reads.
        unless key.valid_encoding? && value.valid_encoding?
          malformed = true
          next
        end
        params[key] = value unless params.key?(key)
      end
      [params, malformed]
    end

    # nil when absent, an Integer, or :invalid.
    def integer_param(params, name)
      return nil unless params.key?(name)

      value = params[name]
      value.match?(/\A\d{1,9}\z/) ? Integer(value, 10) : :invalid
    end

    # ----- responses ----------------------------------------------------------

    def text(status, message, head, extra = {})
      # X-Go-Pprof makes go tool pprof print the message, not only the status.
      respond(status, message, TEXT, head, { "x-go-pprof" => "1" }.merge(extra))
    end

    def respond(status, body, content_type, head, extra = {})
      body = body.b
      [status, headers(content_type, body.bytesize, extra), head ? [] : [body]]
    end

    def headers(content_type, length, extra)
      headers = header_class.new
      headers["content-type"] = content_type
      headers["content-length"] = length.to_s if length
      headers["cache-control"] = "no-store"
      headers["x-content-type-options"] = "nosniff"
      extra.each { |key, value| headers[key] = value }
      headers
    end

    # Rack 3's Rack::Headers, Rack 2's case-insensitive HeaderHash, or a
    # Hash: lower-case names suit all of them.
    def header_class
      if defined?(::Rack::Headers)
        ::Rack::Headers
      elsif defined?(::Rack::Utils::HeaderHash)
        ::Rack::Utils::HeaderHash
      else
        Hash
      end
    end

    def escape(string)
      string.to_s.gsub(/[&<>"']/, "&" => "&amp;", "<" => "&lt;", ">" => "&gt;", '"' => "&quot;", "'" => "&#39;")
    end

    def report_error(what, error, detail = "#{error.class}: #{error.message}")
      @state.synchronize do
        @error_count += 1
        @last_error = error
      end
      ErrorLog.write(@logger, "RackApp", "#{what}: #{detail}")
    rescue StandardError
      # Nor may counting it turn a 500 into an exception.
      nil
    end

    def now
      Process.clock_gettime(Process::CLOCK_MONOTONIC)
    end
  end
end
