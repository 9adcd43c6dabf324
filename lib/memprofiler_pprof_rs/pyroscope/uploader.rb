# frozen_string_literal: true

require "net/http"
require "openssl"
require "timeout"
require "uri"
require "zlib"
require_relative "address"

module MemprofilerPprof
  # Sends profiles to Grafana Pyroscope, through its push API (Connect,
  # binary protobuf; the default) or its older /ingest API. Usable directly
  # from an `on_flush` callback:
  #
  #   uploader = MemprofilerPprof::PyroscopeUploader.new(
  #     server_address: "https://profiles-prod-001.grafana.net",
  #     application_name: "shop", labels: { env: "prod" },
  #     basic_auth_username: "123456", basic_auth_password: ENV["GRAFANA_TOKEN"])
  #   result = uploader.upload(collector.flush(sample_labels: :class_frame))   # never raises
  #
  # (:class_frame, as PyroscopeFlusher flushes: the default :keep's `class`
  # label makes a series per class, and in-use averages over time are then
  # divided by their number; docs/pyroscope-protocol.md.)
  #
  # Profiles go as heap profiles: series name `memory`, `service_name` the
  # application name, `__delta__="false"` (this gem's alloc_* values already
  # cover only the interval since the previous flush; inuse_* are absolute).
  #
  # Network errors, 429 and 5xx are retried with exponential backoff and full
  # jitter; other 4xx are not (the server's message is logged), with two
  # exceptions that follow what a real Pyroscope answers: its rate limit on
  # /ingest (a 422 saying resource_exhausted) is retried like a 429, and its
  # active-series limit (a 429) is not. Every attempt
  # is bounded by `open_timeout` and `read_timeout`: each connect, read and
  # write by net/http's own, the whole exchange by open + 2 x read (a
  # server trickling its headers or a TLS record a byte at a time passes
  # every per-read timeout). Credentials never appear
  # in logs, exceptions or #inspect, whatever characters they hold
  # (PyroscopeAddress). See docs/pyroscope-protocol.md for the server
  # behaviour this follows.
  class PyroscopeUploader
    APIS = %i[push ingest].freeze
    PUSH_PATH = "/push.v1.PusherService/Push"
    INGEST_PATH = "/ingest"
    # Pyroscope's label name rule: letters, digits, `_` and `.`, not starting
    # with a digit (it rejects `-`).
    LABEL_NAME = /\A[A-Za-z_.][A-Za-z0-9_.]*\z/
    RESERVED_LABELS = %w[__name__ service_name __delta__].freeze

    # The outcome of one upload.
    Result = Struct.new(:ok, :status, :attempts, :error, keyword_init: true) do
      def ok? = ok
    end

    RETRYABLE_ERRORS = [SystemCallError, IOError, SocketError, Timeout::Error, EOFError, Net::ProtocolError,
                        Net::HTTPBadResponse, Zlib::Error].freeze
    MAX_BACKOFF = 30.0
    # A real Pyroscope (v1.12.0) answers its ingestion rate limit with 429 on
    # push, but /ingest wraps every error in a 422 (v2.2 answers 429 there):
    # {"code":"unknown","message":"pushing IngestInput-pprof failed
    # resource_exhausted: push rate limit (4.0 MiB) exceeded while adding …"}.
    # It passes once the tenant's bucket refills, so it is retried.
    INGEST_RATE_LIMITED = "resource_exhausted: push rate limit"
    # Its active-series limit is a 429 too, but a series stays active until
    # unused for 10 minutes: no retry within the backoff gets through, and a
    # retry would write again the series that did (docs/pyroscope-protocol.md,
    # "Limits of a real server").
    SERIES_LIMITED = "Maximum active series limit exceeded"
    # What is kept of a response's body (Pyroscope's errors are a few
    # hundred bytes).
    MAX_RESPONSE_BYTES = 64 * 1024

    attr_reader :server_address, :application_name, :labels, :api, :tenant_id,
                :open_timeout, :read_timeout, :retries

    def initialize(server_address:, application_name:, labels: {}, api: :push, basic_auth_username: nil,
                   basic_auth_password: nil, tenant_id: nil, headers: {}, open_timeout: 5, read_timeout: 10,
                   retries: 3, retry_base_delay: 0.5, logger: nil, spy_name: "memprofiler_pprof_rs",
                   warn_class_labels: true)
      # Credentials in the URL (https://user:token@host) become Basic auth;
      # the address kept and shown never carries them.
      unless server_address.is_a?(String) || server_address.is_a?(URI::Generic)
        # Other objects are named by class only: their inspect could hold
        # credentials.
        shown = case server_address
                when nil, true, false, Numeric, Symbol then Validation.show(server_address)
                else "a #{server_address.class}"
                end
        raise TypeError, "server_address must be an http(s) URL String, got #{shown}"
      end

      address, user, password = PyroscopeAddress.split(server_address.to_s)
      check_no_at_sign_left(address, server_address)
      @base = parse_address(address)
      if user
        basic_auth_username ||= user
        basic_auth_password ||= password
      end
      @server_address = @base.to_s
      @application_name = check_application_name(application_name)
      @api = Validation.one_of(api, APIS, :api)
      @labels = check_labels(labels)
      if basic_auth_username.nil? != basic_auth_password.nil?
        raise ArgumentError, "basic_auth_username and basic_auth_password go together (got only one)"
      end

      @basic_auth = basic_auth_username && [basic_auth_username.to_s, basic_auth_password.to_s]
      @tenant_id = tenant_id&.to_s
      if @tenant_id && (@tenant_id.empty? || @tenant_id.b.match?(/[\r\n\0]/n))
        Validation.value_error!(:tenant_id, "a non-empty String without line breaks", @tenant_id)
      end
      Validation.instance(headers, Hash, :headers)

      @headers = headers.to_h { |k, v| [k.to_s, v.to_s] }
      @headers.each do |name, value|
        if "#{name.b}#{value.b}".match?(/[\r\n\0]/n) || name.empty?
          raise ArgumentError, "header #{name.inspect} has an empty name or a line break"
        end
      end
      @open_timeout = Validation.seconds(open_timeout, :open_timeout)
      @read_timeout = Validation.seconds(read_timeout, :read_timeout)
      @retries = Validation.integer(retries, :retries, min: 0)
      @retry_base_delay = Validation.seconds(retry_base_delay, :retry_base_delay)
      @logger = Validation.responds_to(logger, :error, :logger, nil_ok: true, hint: "e.g. a Logger")
      @spy_name = spy_name.to_s
      # Said once (false: sending `class` labels is meant).
      @warned_class_labels = !Validation.flag(warn_class_labels, :warn_class_labels)
    end

    # Sends one ProfileData (or gzipped pprof bytes, with `from`/`to` Times
    # for the ingest API). Returns a Result; never raises.
    def upload(data, from: nil, to: nil)
      bytes = data.respond_to?(:pprof_data) ? data.pprof_data : data
      unless bytes.is_a?(String)
        raise TypeError, "upload needs a ProfileData or a String of gzipped pprof bytes, got #{data.inspect[0, 100]}"
      end

      warn_class_labels if !@warned_class_labels && data.respond_to?(:sample_labels) && data.sample_labels == :keep
      from ||= data.respond_to?(:started_at) ? data.started_at : nil
      to ||= data.respond_to?(:finished_at) ? data.finished_at : nil
      request = build_request(bytes.b, from || Time.now, to || Time.now)
      send_with_retries(request)
    rescue StandardError => e
      log("upload failed: #{e.class}: #{e.message}")
      Result.new(ok: false, status: nil, attempts: 0, error: e)
    end

    def inspect
      auth = @basic_auth ? " basic_auth=[FILTERED]" : ""
      tenant = @tenant_id ? " tenant_id=#{@tenant_id}" : ""
      address = PyroscopeAddress.redact(@server_address)
      "#<#{self.class.name} #{@api} #{address}#{auth}#{tenant} application_name=#{@application_name.inspect}>"
    end
    alias to_s inspect

    # The series labels a push carries, in order.
    def series_labels
      [["__name__", "memory"], ["service_name", @application_name], ["__delta__", "false"]] + @labels.to_a
    end

    # Class methods, above `private` (which does not apply to them):
    # instances call printable through self.class, and the specs call
    # split_credentials.

    # [address without credentials, user, password]: PyroscopeAddress.split.
    def self.split_credentials(address)
      PyroscopeAddress.split(address)
    end

    # A server's words for a log line: control characters (a CR, an
    # ANSI sequence) made visible, invalid UTF-8 replaced, 300 characters.
    def self.printable(text)
      text.to_s.dup.force_encoding(Encoding::UTF_8).scrub("?")[0, 300]
          .gsub(/\p{Cc}/) { |c| format("\\x%02x", c.ord) }
    end

    private

    # Once per uploader (unless warn_class_labels: false): the profile is
    # sent as it is, but its `class` labels become a series per class on
    # the server.
    def warn_class_labels
      @warned_class_labels = true
      log("this profile was flushed with sample_labels: :keep; Pyroscope makes a series of every class " \
          "(at most 5,000 active series per tenant by default), and in-use averages are split among them. " \
          "Flush with sample_labels: :class_frame (PyroscopeFlusher's default) to send the class as a frame.")
    end

    # An '@' left once the credentials are taken off was either in a path
    # or query, or in a token that a URL parser read as a port or a host
    # (https://1234:56#x@host is host 1234, port 56). Which was meant
    # cannot be told, and guessing wrong sends uploads, with any
    # credentials, to the wrong host.
    def check_no_at_sign_left(address, given)
      return unless address.b.include?("@")

      raise ArgumentError, "server_address #{PyroscopeAddress.redact(given).inspect} has an '@' after its host " \
                           "(as a URL parser reads it), so where its credentials end is unclear: write an '@' in " \
                           "a password, path or query as %40 ('/' as %2F, '?' %3F, '#' %23, '%' %25), or give the " \
                           "credentials apart (basic_auth_username: and basic_auth_password:, or " \
                           "PYROSCOPE_BASIC_AUTH_USER and PYROSCOPE_BASIC_AUTH_PASSWORD)"
    end

    def parse_address(address)
      uri = URI.parse(address.to_s)
      unless %w[http https].include?(uri.scheme) && uri.host && !uri.host.empty?
        raise ArgumentError, "server_address must be an http(s) URL, got #{PyroscopeAddress.redact(address).inspect}"
      end

      uri.path = uri.path.chomp("/")
      uri
    rescue URI::InvalidURIError
      raise ArgumentError, "server_address must be an http(s) URL, got #{PyroscopeAddress.redact(address).inspect}"
    end

    def check_application_name(name)
      expected = "a non-empty String of letters, digits, '_', '.', '-', '/'"
      Validation.instance(name, String, :application_name, expected: expected)
      Validation.value_error!(:application_name, expected, name) unless name.b.match?(%r{\A[A-Za-z0-9_.\-/]+\z}n)

      name
    end

    # Pyroscope's limits: 30 labels in all (3 are ours), values up to 2048
    # characters, names compared after '.' becomes '_'.
    MAX_USER_LABELS = 27
    MAX_LABEL_VALUE = 2048

    def check_labels(labels)
      Validation.instance(labels, Hash, :labels)
      raise ArgumentError, "labels must be at most #{MAX_USER_LABELS}, got #{labels.size}" if labels.size > MAX_USER_LABELS

      checked = labels.to_h do |key, value|
        name = key.to_s
        unless name.match?(LABEL_NAME) && !RESERVED_LABELS.include?(name)
          raise ArgumentError, "label name #{key.inspect} is not allowed (letters, digits, '_' and '.'; " \
                               "not #{RESERVED_LABELS.join(', ')})"
        end
        value = value.to_s
        raise ArgumentError, "label #{name} is longer than #{MAX_LABEL_VALUE} characters" if value.size > MAX_LABEL_VALUE
        # The ingest API's label-set syntax cannot carry these.
        if @api == :ingest && value.match?(/[,{}=]/)
          raise ArgumentError, "label #{name}=#{value.inspect}: the ingest API cannot carry ',', '{', '}' or '='"
        end

        [name, value]
      end
      clash = checked.keys.group_by { |name| name.tr(".", "_") }.find { |_, names| names.size > 1 }
      raise ArgumentError, "labels #{clash[1].join(' and ')} are the same name to Pyroscope" if clash

      checked
    end

    def build_request(bytes, from, to)
      request = case @api
                when :push then push_request(bytes)
                when :ingest then ingest_request(bytes, from, to)
                end
      request.basic_auth(*@basic_auth) if @basic_auth
      request["X-Scope-OrgID"] = @tenant_id if @tenant_id
      request["User-Agent"] = "memprofiler_pprof_rs/#{MemprofilerPprof::VERSION}"
      @headers.each { |k, v| request[k] = v }
      request
    end

    # PushRequest{ series: [RawProfileSeries{ labels, samples: [RawSample{
    # raw_profile }] }] } in protobuf's wire format.
    def push_request(bytes)
      labels = series_labels.map { |name, value| Protobuf.message(1, Protobuf.string(1, name) + Protobuf.string(2, value)) }
      sample = Protobuf.message(2, Protobuf.bytes(1, bytes))
      series = Protobuf.message(1, labels.join.b + sample)
      request = Net::HTTP::Post.new(@base.path + PUSH_PATH)
      request["Content-Type"] = "application/proto"
      request.body = series
      request
    end

    def ingest_request(bytes, from, to)
      tags = @labels.map { |k, v| "#{k}=#{v}" }.join(",")
      query = URI.encode_www_form(
        name: "#{@application_name}{#{tags}}", from: from.to_i, until: [to.to_i, from.to_i].max,
        format: "pprof", spyName: @spy_name
      )
      request = Net::HTTP::Post.new("#{@base.path}#{INGEST_PATH}?#{query}")
      request["Content-Type"] = "application/octet-stream"
      request.body = bytes
      request
    end

    def send_with_retries(request)
      attempts = 0
      loop do
        attempts += 1
        status, error, body = attempt(request)
        return Result.new(ok: true, status: status, attempts: attempts, error: nil) if status && status < 300

        if !retryable?(status, body) || attempts > @retries
          return Result.new(ok: false, status: status, attempts: attempts, error: error)
        end

        sleep(rand * [@retry_base_delay * (2**(attempts - 1)), MAX_BACKOFF].min)
      end
    end

    # Network errors, 5xx and 429 are worth another attempt, and /ingest's
    # 422 for the rate limit; the active-series limit is not.
    def retryable?(status, body)
      return true if status.nil? || status >= 500
      return !body.include?(SERIES_LIMITED) if status == 429

      status == 422 && @api == :ingest && body.include?(INGEST_RATE_LIMITED)
    end

    # One HTTP exchange: [status, error, body] (body "" unless it failed;
    # at most MAX_RESPONSE_BYTES).
    # Logs failures (never credentials).
    def attempt(request)
      http = Net::HTTP.new(@base.hostname, @base.port) # hostname: IPv6 without brackets
      http.use_ssl = @base.scheme == "https"
      http.verify_mode = OpenSSL::SSL::VERIFY_PEER if http.use_ssl?
      http.open_timeout = @open_timeout
      http.read_timeout = @read_timeout
      http.write_timeout = @read_timeout
      body = +"".b
      status = nil
      # net/http's timeouts bound each wait, not how many: the status line,
      # headers and TLS records are read with no hook between waits, so only
      # a timer bounds the exchange. (Its interrupt can land anywhere in this
      # block, which holds nothing but this attempt's own connection, closed
      # by `start` on the way out.)
      Timeout.timeout(@open_timeout + (2 * @read_timeout)) do
        http.start do |connection|
          connection.request(request) do |answer|
            status = answer.code.to_i
            # Read through, keeping the first MAX_RESPONSE_BYTES: a server's
            # error body is only logged and searched, and a huge one must
            # not be held whole.
            answer.read_body do |chunk|
              body << chunk.byteslice(0, MAX_RESPONSE_BYTES - body.bytesize) if body.bytesize < MAX_RESPONSE_BYTES
            end
          end
        end
      end
      return [status, nil, ""] if status < 300

      log("#{request.method} #{request.path.split('?').first} answered #{status}: #{self.class.printable(body)}")
      [status, nil, body]
    rescue *RETRYABLE_ERRORS, OpenSSL::SSL::SSLError => e
      # A 2xx whose body did not arrive in time was still taken: sending it
      # again would count its allocations twice.
      return [status, nil, ""] if status && status < 300

      log("#{request.method} #{@base.host}: #{e.class}: #{self.class.printable(e.message)}")
      [nil, e, ""]
    end

    def log(message)
      ErrorLog.write(@logger, "PyroscopeUploader", message)
    end

    # The little of protobuf's wire format a push needs.
    module Protobuf
      module_function

      def varint(value)
        out = +""
        loop do
          byte = value & 0x7f
          value >>= 7
          out << (value.zero? ? byte : byte | 0x80).chr
          return out.b if value.zero?
        end
      end

      def bytes(field, data) = varint((field << 3) | 2) + varint(data.bytesize) + data.b

      # Pyroscope rejects invalid UTF-8: replace bad bytes.
      def string(field, text)
        utf8 = text.to_s.encode(Encoding::UTF_8, invalid: :replace, undef: :replace).scrub
        bytes(field, utf8)
      end

      def message(field, encoded) = bytes(field, encoded)
    end
  end
end
