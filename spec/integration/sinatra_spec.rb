# frozen_string_literal: true

require "rack"
require "rack/mock"

# SinatraLabels in a real Sinatra app (Debian's Sinatra 3), behind
# RackLabels: the route's pattern labels what its block allocates.
# Host only, as for Rails (MEMPROFILER_SKIP_FRAMEWORKS=1 in the Debian roots).
RSpec.describe "MemprofilerPprof::SinatraLabels in a Sinatra app", :slow do
  before do
    skip "Sinatra is not installed in this root (MEMPROFILER_SKIP_FRAMEWORKS=1)" if ENV["MEMPROFILER_SKIP_FRAMEWORKS"]
    require "sinatra/base"
  end

  let(:app) do
    Class.new(Sinatra::Base) do
      register MemprofilerPprof::SinatraLabels
      set :kept, []

      get("/orders/:id") do
        settings.kept << Array.new(20) { |i| "order #{params[:id]} line #{i}" * 4 }
        MemprofilerPprof.labels.sort.flatten.join(",")
      end
      get("/pages/:id") do
        Array.new(20) { |i| "page #{params[:id]} line #{i}" * 4 }
        "ok"
      end
      get("/halts") { halt 403, MemprofilerPprof.labels["route"] }
      get("/passes") { pass }
      get("/passes") { MemprofilerPprof.labels["route"] }
    end
  end

  it "labels each route's work with its pattern, nested in RackLabels' endpoint, halts and passes too" do
    request = Rack::MockRequest.new(Rack::Lint.new(MemprofilerPprof::RackLabels.new(app)))
    expect(request.get("/orders/7").body).to eq("endpoint,GET /orders/:id,route,GET /orders/:id")
    halted = request.get("/halts")
    expect([halted.status, halted.body]).to eq([403, "GET /halts"])
    expect(request.get("/passes").body).to eq("GET /passes")
    expect(request.get("/missing").status).to eq(404)
    expect(MemprofilerPprof.labels).to eq({})
  end

  it "names the leaking route in inuse_space" do
    request = Rack::MockRequest.new(app)
    data = MemprofilerPprof::Collector.new(sample_rate: 1.0).profile do
      50.times do |i|
        request.get("/orders/#{i}")
        request.get("/pages/#{i}")
      end
      GC.start
    end
    routes = sums_by_label(parse_profile(data), "route", "inuse_objects")
    expect(routes["GET /orders/:id"]).to be_between(50 * 21, 50 * 21 + 60)
    expect(routes["GET /pages/:id"]).to be < 60
    expect(app.settings.kept.size).to eq(50)
  end

  it "says what holds the leaking route's objects: the setting's block" do
    request = Rack::MockRequest.new(app)
    collector = MemprofilerPprof::Collector.new(sample_rate: 1.0).tap(&:start!)
    50.times { |i| request.get("/orders/#{i}") }
    report = collector.retention_report(top: 1, per_site: 2, sites: [File.basename(__FILE__)])
    paths = report.sites.first["objects"].map { |object| MemprofilerPprof::RetentionReport.path_text(object) }
    # `set :kept, []` keeps the Array in the block of a method it defines
    # on the app's singleton class.
    block = %r{#<Class:#<Class:0x\h+>> \(a method's definition\) -> Proc \(block at sinatra/base\.rb:\d+\) -> }
    expect(paths).to all(match(/#{block}captured variable value -> Array\[\d+\] -> Array\[\d+\] -> String\z/))
  ensure
    collector&.stop!
  end
end
