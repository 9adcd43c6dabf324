# frozen_string_literal: true

module MemprofilerPprof
  # Rack middleware that labels each request's samples with its endpoint
  # (see Labels), so the profiles say which endpoint allocated what, and
  # whose objects are still alive:
  #
  #   # config.ru
  #   use MemprofilerPprof::RackLabels
  #   use MemprofilerPprof::RackLabels, labels: ->(env) { { tenant: env["HTTP_X_TENANT"] } }
  #
  # `endpoint` is the request method and the path with its ids collapsed:
  # GET /users/42/orders/9f1c...e2 reads "GET /users/:id/orders/:id". A
  # segment is an id when it is a number, a UUID, 16 or more hex digits,
  # or 20 or more characters with a digit among them; a path keeps its
  # first MAX_SEGMENTS segments ("/..." stands for the rest).
  #
  # Paths are what clients send: slugs, and every path a scanner probes,
  # are endpoints of their own. So the middleware names at most
  # `max_endpoints` (default 200) distinct ones, the first seen; later ones
  # read "GET (other)" (any method outside HTTP's own reads OTHER), and the
  # process's table of label sets is not used up by a scan. Route patterns
  # the framework knows (the Railtie's `action` label, controller#action)
  # are bounded by the app's code, not by its clients.
  #
  # `labels:` (a callable, given the Rack env) adds the app's own; if it
  # raises or returns bad labels, the request goes on without them and the
  # error is reported (to `logger`, or $stderr) once per error class. No
  # failure of the middleware's own fails a request.
  #
  # Allocations made while the server iterates a streamed body, after the
  # app returned, are not labelled.
  class RackLabels
    MAX_SEGMENTS = 8
    DEFAULT_MAX_ENDPOINTS = 200
    METHODS = %w[GET HEAD POST PUT PATCH DELETE OPTIONS TRACE CONNECT].to_h { |m| [m, m] }.freeze
    ID_SEGMENT = %r{\A(?:\d+|\h{8}-\h{4}-\h{4}-\h{4}-\h{12}|\h{16,}|(?=[^/]*\d)[^/]{20,})\z}

    attr_reader :logger

    def initialize(app, labels: nil, logger: nil, max_endpoints: DEFAULT_MAX_ENDPOINTS)
      @app = app
      @labels = Validation.responds_to(labels, :call, :labels, nil_ok: true, hint: "e.g. a lambda taking the env")
      @logger = Validation.responds_to(logger, :error, :logger, nil_ok: true, hint: "e.g. a Logger")
      @max_endpoints = Validation.integer(max_endpoints, :max_endpoints, min: 1, max: 50_000)
      @endpoints = {}
      @endpoints_lock = Mutex.new
      @reported = {}
    end

    def call(env)
      Labels.with_id(labels_id(env)) { @app.call(env) }
    end

    # "GET /users/:id" for GET /users/42. Bytes as they came (a path is not
    # always valid in the encoding it is tagged with).
    def self.endpoint(method, path)
      segments = path.to_s.b.split("/", MAX_SEGMENTS + 2).reject(&:empty?)
      more = segments.size > MAX_SEGMENTS
      segments = segments.first(MAX_SEGMENTS).map { |s| s.match?(ID_SEGMENT) ? ":id" : s }
      "#{METHODS.fetch(method.to_s, 'OTHER')} /#{segments.join('/')}#{more ? '/...' : ''}"
    end

    private

    # The request's label set: a bad label from `labels:` costs its
    # labels, and any other failure the request's labels, never the request.
    def labels_id(env)
      endpoint = { endpoint: bounded_endpoint(env) }
      begin
        extra = @labels&.call(env)
        raise TypeError, "must return a Hash or nil, got #{Validation.show(extra)}" unless extra.nil? || extra.is_a?(Hash)

        return Labels.id_for(extra ? endpoint.merge(extra) : endpoint)
      rescue StandardError => e
        report(e)
      end
      Labels.id_for(endpoint)
    rescue StandardError => e
      report(e)
      nil
    end

    # The endpoint, or "METHOD (other)" past max_endpoints distinct ones.
    def bounded_endpoint(env)
      method = METHODS.fetch(env["REQUEST_METHOD"].to_s, "OTHER")
      endpoint = self.class.endpoint(method, env["PATH_INFO"])
      return endpoint if @endpoints.key?(endpoint)

      @endpoints_lock.synchronize do
        return "#{method} (other)" if @endpoints.size >= @max_endpoints

        @endpoints[endpoint] = true
      end
      endpoint
    end

    def report(error)
      return if @reported[error.class]

      @reported[error.class] = true
      ErrorLog.write(@logger, "RackLabels", "labels: failed (#{error.class}: #{error.message}); " \
                                            "requests go on with the endpoint label only")
    end
  end
end
