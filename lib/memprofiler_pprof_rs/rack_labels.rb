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
  # first MAX_SEGMENTS segments ("/..." stands for the rest). `labels:`
  # (a callable, given the Rack env) adds the app's own; if it raises or
  # returns bad labels, the request goes on without them and the error is
  # reported (to `logger`, or $stderr) once per error class.
  #
  # Route patterns the framework knows (Rails' controller#action) are set
  # by the framework integration, inside the request, nested in these.
  class RackLabels
    MAX_SEGMENTS = 8
    ID_SEGMENT = %r{\A(?:\d+|\h{8}-\h{4}-\h{4}-\h{4}-\h{12}|\h{16,}|(?=[^/]*\d)[^/]{20,})\z}

    attr_reader :logger

    def initialize(app, labels: nil, logger: nil)
      @app = app
      @labels = Validation.responds_to(labels, :call, :labels, nil_ok: true, hint: "e.g. a lambda taking the env")
      @logger = Validation.responds_to(logger, :error, :logger, nil_ok: true, hint: "e.g. a Logger")
      @reported = {}
    end

    def call(env)
      Labels.with_id(labels_id(env)) { @app.call(env) }
    end

    # "GET /users/:id" for GET /users/42.
    def self.endpoint(method, path)
      segments = path.to_s.split("/", MAX_SEGMENTS + 2).reject(&:empty?)
      more = segments.size > MAX_SEGMENTS
      segments = segments.first(MAX_SEGMENTS).map { |s| s.match?(ID_SEGMENT) ? ":id" : s }
      "#{method} /#{segments.join('/')}#{more ? '/...' : ''}"
    end

    private

    # The request's label set: a bad label from `labels:` costs its
    # labels, never the request.
    def labels_id(env)
      endpoint = { endpoint: self.class.endpoint(env["REQUEST_METHOD"], env["PATH_INFO"]) }
      begin
        extra = @labels&.call(env)
        raise TypeError, "must return a Hash or nil, got #{Validation.show(extra)}" unless extra.nil? || extra.is_a?(Hash)

        return Labels.id_for(extra ? endpoint.merge(extra) : endpoint)
      rescue StandardError => e
        report(e)
      end
      Labels.id_for(endpoint)
    end

    def report(error)
      return if @reported[error.class]

      @reported[error.class] = true
      ErrorLog.write(@logger, "RackLabels", "labels: failed (#{error.class}: #{error.message}); " \
                                            "requests go on with the endpoint label only")
    end
  end
end
