# frozen_string_literal: true

require "rack"
require "rack/mock"
require "net/http"
require "logger"
require "stringio"

RSpec.describe MemprofilerPprof::RackLabels do
  it "names the endpoint by method and path, ids collapsed, at most 8 segments" do
    {
      ["GET", "/users/42"] => "GET /users/:id",
      ["POST", "/users/42/orders/9f1c0a2b3c4d5e6f7a8b"] => "POST /users/:id/orders/:id",
      ["GET", "/files/123e4567-e89b-12d3-a456-426614174000"] => "GET /files/:id",
      ["GET", "/t/abcdefghij0123456789xyz"] => "GET /t/:id",
      ["GET", "/posts/my-first-post"] => "GET /posts/my-first-post",
      ["GET", "/"] => "GET /",
      ["GET", ""] => "GET /",
      ["GET", "/x//y/"] => "GET /x/y",
      ["GET", "/a/b/c/d/e/f/g/h/i/j"] => "GET /a/b/c/d/e/f/g/h/...",
      ["GET", "/#{'a/' * 100_000}"] => "GET /a/a/a/a/a/a/a/a/..."
    }.each do |(method, path), endpoint|
      expect(described_class.endpoint(method, path)).to eq(endpoint), path[0, 50]
    end
  end

  it "names at most max_endpoints paths, reads what clients send as bytes, and never fails a request" do
    seen = []
    app = lambda { |_env|
      seen << MemprofilerPprof.labels["endpoint"]
      [200, {}, ["ok"]]
    }
    stack = described_class.new(app, max_endpoints: 3)
    requests = [
      ["GET", "/a"], ["GET", "/b/1"], ["GET", "/users/\xff/x".dup.force_encoding("UTF-8")],
      ["GET", "/probe-1"], ["POST", "/a"], ["GET", "/a"], ["G\u00CBT", "/caf\xC3\xA9".b], ["BREW", "/b/2"]
    ]
    requests.each do |method, path|
      status, = stack.call(Rack::MockRequest.env_for("/").merge("REQUEST_METHOD" => method, "PATH_INFO" => path))
      expect(status).to eq(200)
    end
    expect(seen).to eq(["GET /a", "GET /b/:id", "GET /users/\uFFFD/x", "GET (other)", "POST (other)", "GET /a",
                        "OTHER (other)", "OTHER (other)"])
    expect { described_class.new(app, max_endpoints: 0) }.to raise_error(ArgumentError, /max_endpoints/)
  end

  it "labels each request's samples, alive or not, and leaves none on the thread after it" do
    leaked = []
    app = lambda do |env|
      MemprofilerPprof.labels.then { |labels| env["seen"] = labels }
      if env["PATH_INFO"].start_with?("/leak")
        100.times { leaked << ("l" * 100) }
      else
        100.times { ("c" * 100).size }
      end
      [200, { "content-type" => "text/plain" }, ["ok"]]
    end
    seen = []
    stack = described_class.new(->(env) { app.call(env).tap { seen << env["seen"] } })
    collector = MemprofilerPprof::Collector.new(sample_rate: 1.0)
    data = collector.profile do
      5.times do |i|
        Rack::MockRequest.new(Rack::Lint.new(stack)).get("/leak/#{i}")
        Rack::MockRequest.new(Rack::Lint.new(stack)).get("/clean/#{i}")
      end
      GC.start
    end
    profile = parse_profile(data)
    inuse = sums_by_label(profile, "endpoint", "inuse_objects")
    expect(inuse["GET /leak/:id"]).to be_between(500, 600)
    expect(inuse["GET /clean/:id"]).to be < 60
    expect(sums_by_label(profile, "endpoint", "alloc_objects")["GET /clean/:id"]).to be >= 500
    expect(seen.uniq).to eq([{ "endpoint" => "GET /leak/:id" }, { "endpoint" => "GET /clean/:id" }])
    expect(MemprofilerPprof.labels).to eq({})
    expect(leaked.size).to eq(500)
  end

  it "adds the app's labels, and goes on without them (reported once) when they raise or are bad" do
    log = StringIO.new
    calls = Hash.new(0)
    labels = lambda do |env|
      calls[env["PATH_INFO"]] += 1
      case env["PATH_INFO"]
      when "/tenant" then { tenant: env["HTTP_X_TENANT"] }
      when "/raises" then raise KeyError, "no tenant"
      when "/bad" then { "bad-key" => 1 }
      when "/array" then [1]
      end
    end
    seen = []
    app = lambda { |_env|
      seen << MemprofilerPprof.labels
      [200, {}, ["ok"]]
    }
    stack = described_class.new(app, labels: labels, logger: Logger.new(log))
    %w[/tenant /raises /raises /bad /array /none].each do |path|
      response = Rack::MockRequest.new(stack).get(path, "HTTP_X_TENANT" => "acme")
      expect(response.status).to eq(200)
    end
    expect(seen).to eq([
                         { "endpoint" => "GET /tenant", "tenant" => "acme" },
                         { "endpoint" => "GET /raises" }, { "endpoint" => "GET /raises" },
                         { "endpoint" => "GET /bad" }, { "endpoint" => "GET /array" }, { "endpoint" => "GET /none" }
                       ])
    expect(log.string.scan("KeyError: no tenant").size).to eq(1)
    expect(log.string).to include('ArgumentError: label key "bad-key"', "TypeError: must return a Hash or nil, got [1]")
    expect { described_class.new(app, labels: 3) }.to raise_error(TypeError, /labels must respond to #call.*got 3/)
  end

  it "keeps the labels the app sets inside the request nested within the endpoint's" do
    app = lambda do |_env|
      inner = MemprofilerPprof.with_labels(action: "UsersController#show") { MemprofilerPprof.labels }
      [200, {}, [inner.sort.flatten.join(",")]]
    end
    body = Rack::MockRequest.new(described_class.new(app)).get("/users/7").body
    expect(body).to eq("action,UsersController#show,endpoint,GET /users/:id")
  end

  # A real server in its own process (WEBrick: spec/fixtures/serve_rack.rb
  # says why), its heap read over HTTP from the gem's own endpoint.
  it "names the leaking endpoint in the in-use profile of a real server", :slow do
    Dir.mktmpdir("rack-labels") do |dir|
      lib = File.join(PROJECT_ROOT, "lib")
      File.write(File.join(dir, "config.ru"), <<~RUBY)
        $LOAD_PATH.unshift(#{lib.inspect})
        require "memprofiler_pprof_rs"
        collector = MemprofilerPprof::Collector.new(sample_rate: 0.1, seed: 3).tap(&:start!)
        $kept = []
        use MemprofilerPprof::RackApp::Middleware, collector, token: "secret-token-1234567890"
        use MemprofilerPprof::RackLabels
        run lambda { |env|
          if env["PATH_INFO"].start_with?("/orders/")
            $kept << Array.new(20) { "order line" * 10 }
          else
            Array.new(20) { "page" * 10 }
          end
          [200, { "content-type" => "text/plain" }, ["ok\\n"]]
        }
      RUBY
      serve_rackup("config.ru", dir: dir) do |port|
        Net::HTTP.start("127.0.0.1", port) do |http|
          60.times do |i|
            expect(http.get("/orders/#{i}").code).to eq("200")
            expect(http.get("/pages/#{i}").code).to eq("200")
          end
          response = http.get("/debug/pprof/heap?gc=1&token=secret-token-1234567890")
          expect(response.code).to eq("200"), response.body
          inuse = sums_by_label(parse_profile(response.body), "endpoint", "inuse_space")
          # 60 requests kept 1,200 Strings of 100 bytes (and their Arrays);
          # the pages kept nothing. (Unlabelled: the server's own objects.)
          expect(inuse["GET /orders/:id"]).to be > 100_000
          expect(inuse["GET /orders/:id"]).to be > 20 * inuse.fetch("GET /pages/:id", 0)
        end
      end
    end
  end
end
