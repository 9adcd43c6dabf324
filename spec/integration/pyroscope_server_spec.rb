# frozen_string_literal: true

require "json"
require "net/http"
require "securerandom"

# Against a real Grafana Pyroscope (v1.12.0, built from its Go module):
# `script/pyroscope run [--multitenant] -- rspec spec/integration/pyroscope_server_spec.rb`,
# both of which script/test runs. Without PYROSCOPE_URL these examples are
# not defined; PYROSCOPE_MULTITENANT=1 (set by --multitenant) chooses the
# tenant examples. spec/support/fake_pyroscope.rb stays for fault injection.
url = ENV.fetch("PYROSCOPE_URL", nil)
multitenant = ENV.fetch("PYROSCOPE_MULTITENANT", "0") == "1"

# Home of the classes the cardinality example makes.
module PyroscopeCardinality; end

# Querying the server, and the profile the examples push.
module PyroscopeServerHelpers
  # A querier call (Connect protocol, JSON); times in milliseconds.
  def query(url, method, body, tenant: nil)
    uri = URI("#{url}/querier.v1.QuerierService/#{method}")
    headers = { "Content-Type" => "application/json" }
    headers["X-Scope-OrgID"] = tenant if tenant
    response = Net::HTTP.post(uri, JSON.generate(body), headers)
    expect(response.code).to eq("200"), "#{method}: #{response.code} #{response.body}"
    JSON.parse(response.body)
  end

  def allocate_widgets_for_pyroscope = Array.new(2_000) { |i| "widget #{i}" * 2 }

  # A profile of this process allocating widgets, some of them kept.
  def widget_profile
    kept = nil
    data = MemprofilerPprof::Collector.new(sample_rate: 1.0).profile(sample_labels: :class_frame) do
      kept = allocate_widgets_for_pyroscope
    end
    expect(kept.size).to eq(2_000)
    data
  end

  def time_range(data) = [(data.started_at.to_f * 1000).floor - 1000, (data.finished_at.to_f * 1000).ceil + 60_000]
end

RSpec.describe "a real Grafana Pyroscope server", if: url && !multitenant do
  memory_types = %w[memory:alloc_objects:count:space:bytes memory:alloc_space:bytes:space:bytes
                    memory:inuse_objects:count:space:bytes memory:inuse_space:bytes:space:bytes].freeze

  include PyroscopeServerHelpers

  # The merged profile the server returns for one type (SelectMergeProfile,
  # as JSON): its total, and the function names of its heaviest stack.
  def merged(url, type, selector, range)
    profile = query(url, "SelectMergeProfile",
                    { profileTypeID: type, labelSelector: selector, start: range.first, end: range.last })
    strings = profile.fetch("stringTable")
    functions = profile.fetch("function", []).to_h { |f| [f["id"], strings[f["name"].to_i]] }
    names = profile.fetch("location", []).to_h { |l| [l["id"], functions[l.dig("line", 0, "functionId")]] }
    by_stack = Hash.new(0)
    profile.fetch("sample", []).each { |s| by_stack[s["locationId"].map { |id| names[id] }] += s["value"].first.to_i }
    [by_stack.values.sum, by_stack.max_by { |_, v| v }&.first]
  end

  %i[push ingest].each do |api|
    context "through the #{api} API" do
      let(:app) { "memprofiler-e2e-#{api}-#{SecureRandom.hex(4)}" }

      it "stores the four memory types under service_name, with the user's labels" do
        data = widget_profile
        uploader = MemprofilerPprof::PyroscopeUploader.new(server_address: url, application_name: app, api: api,
                                                           labels: { env: "e2e", region: "local" })
        result = uploader.upload(data)
        expect(result).to be_ok, result.inspect
        range = time_range(data)

        types = query(url, "ProfileTypes", { start: range.first, end: range.last }).fetch("profileTypes", [])
        expect(types.map { |t| t["ID"] }).to include(*memory_types)
        names = query(url, "LabelNames", { matchers: ["{service_name=\"#{app}\"}"], start: range.first, end: range.last })
        expect(names.fetch("names")).to include("service_name", "env", "region")
        values = query(url, "LabelValues", { name: "service_name", start: range.first, end: range.last })
        expect(values.fetch("names")).to include(app)
        envs = query(url, "LabelValues", { name: "env", matchers: ["{service_name=\"#{app}\"}"],
                                           start: range.first, end: range.last })
        expect(envs.fetch("names")).to eq(["e2e"])
      end

      it "gives back what was pushed: the totals of every type, and the allocating method in the heaviest stack" do
        data = widget_profile
        ours = MemprofilerPprof::PprofReader.parse(data.pprof_data)
        uploader = MemprofilerPprof::PyroscopeUploader.new(server_address: url, application_name: app, api: api)
        expect(uploader.upload(data)).to be_ok
        range = time_range(data)
        selector = "{service_name=\"#{app}\"}"

        { "alloc_objects" => memory_types[0], "alloc_space" => memory_types[1],
          "inuse_objects" => memory_types[2], "inuse_space" => memory_types[3] }.each do |name, type|
          total, stack = merged(url, type, selector, range)
          expect(total).to eq(ours.total(name)), "#{type}: server #{total}, ours #{ours.total(name)}"
          expect(stack.grep(/allocate_widgets_for_pyroscope/)).not_to be_empty, "#{type}: heaviest stack #{stack.inspect}"
        end
      end
    end
  end
end

RSpec.describe "a real Grafana Pyroscope server with tenants (--multitenant)", if: url && multitenant do
  include PyroscopeServerHelpers

  let(:app) { "memprofiler-e2e-tenant-#{SecureRandom.hex(4)}" }

  %i[push ingest].each do |api|
    it "lands a #{api} in the tenant given (X-Scope-OrgID) and nowhere else" do
      data = widget_profile
      uploader = MemprofilerPprof::PyroscopeUploader.new(server_address: url, application_name: app, api: api,
                                                         tenant_id: "team-a")
      expect(uploader.upload(data)).to be_ok
      range = time_range(data)
      body = { name: "service_name", start: range.first, end: range.last }
      expect(query(url, "LabelValues", body, tenant: "team-a").fetch("names")).to include(app)
      expect(query(url, "LabelValues", body, tenant: "team-b").fetch("names", [])).not_to include(app)
    end
  end

  # In tenants of their own: the active series limit (5,000) is per tenant.
  it "keeps a service at 4 series with class frames, where class labels make a series per class" do
    classes = Array.new(400) { |i| Class.new.tap { |c| PyroscopeCardinality.const_set(:"Widget#{i}", c) } }
    selector = { matchers: ["{service_name=\"#{app}\"}"] }
    series = {}
    %i[keep class_frame].each do |sample_labels|
      tenant = "labels-#{sample_labels}-#{SecureRandom.hex(3)}"
      kept = []
      data = MemprofilerPprof::Collector.new(sample_rate: 1.0).profile(sample_labels: sample_labels) do
        classes.each { |c| kept << c.new }
      end
      uploader = MemprofilerPprof::PyroscopeUploader.new(server_address: url, application_name: app, tenant_id: tenant)
      expect(uploader.upload(data)).to be_ok
      range = time_range(data)
      found = query(url, "Series", selector.merge(start: range.first, end: range.last), tenant: tenant)
      series[sample_labels] = found.fetch("labelsSet", []).map { |set| set["labels"].to_h { |l| l.values_at("name", "value") } }
    end
    # A series per (profile type, class): every Widget and the classes of
    # everything else the block allocated.
    widgets = series[:keep].map { |labels| labels["class"] }.grep(/PyroscopeCardinality::Widget/).uniq
    expect(widgets.size).to eq(400)
    expect(series[:keep].size).to be >= 4 * 400
    expect(series[:class_frame].size).to eq(4)
    expect(series[:class_frame].flat_map(&:keys)).not_to include("class")
  end

  it "makes a series per profile type and label set of with_labels, beside the 4 of the unlabelled" do
    tenant = "context-labels-#{SecureRandom.hex(3)}"
    endpoints = ["GET /leaky", "GET /users/:id", "POST /orders"]
    kept = []
    data = MemprofilerPprof::Collector.new(sample_rate: 1.0).profile(sample_labels: :class_frame) do
      endpoints.each { |e| MemprofilerPprof.with_labels(endpoint: e) { kept << Array.new(50) { "x" * 30 } } }
      MemprofilerPprof.with_labels(endpoint: "GET /leaky", job: "Mailer") { kept << "y" * 30 }
    end
    uploader = MemprofilerPprof::PyroscopeUploader.new(server_address: url, application_name: app, tenant_id: tenant)
    expect(uploader.upload(data)).to be_ok
    range = time_range(data)
    selector = { matchers: ["{service_name=\"#{app}\"}"], start: range.first, end: range.last }
    found = query(url, "Series", selector, tenant: tenant)
    series = found.fetch("labelsSet", []).map { |set| set["labels"].to_h { |l| l.values_at("name", "value") } }
    sets = series.map { |labels| labels.slice("endpoint", "job") }
    expect(sets.tally).to eq({ {} => 4, { "endpoint" => "GET /leaky", "job" => "Mailer" } => 4 }
      .merge(endpoints.to_h { |e| [{ "endpoint" => e }, 4] }))
    expect(kept.size).to eq(4)
  end

  context "behind a gateway that checks Basic auth (as Grafana Cloud's does; Pyroscope has none)" do
    # A token as Grafana Cloud's are: base64, with '/', '+' and '='.
    let(:token) { "glc_ey+Jv/IjoiMTIz=" }
    let(:gateway) { AuthGateway.new(url, "123456" => token) }
    after { gateway.stop }

    it "lands in the tenant the credentials name, given as keywords or in the URL" do
      data = widget_profile
      range = time_range(data)
      body = { name: "service_name", start: range.first, end: range.last }
      keywords = MemprofilerPprof::PyroscopeUploader.new(server_address: gateway.url, application_name: app,
                                                         basic_auth_username: "123456", basic_auth_password: token)
      expect(keywords.upload(data)).to be_ok
      expect(query(url, "LabelValues", body, tenant: "123456").fetch("names")).to include(app)

      in_url = gateway.url.sub("//", "//123456:#{token.gsub('/', '%2F')}@")
      other_app = "#{app}-url"
      uploader = MemprofilerPprof::PyroscopeUploader.new(server_address: in_url, application_name: other_app,
                                                         api: :ingest)
      expect(uploader.upload(data)).to be_ok
      expect(query(url, "LabelValues", body, tenant: "123456").fetch("names")).to include(other_app)
    end

    it "gets the gateway's 401 for a wrong token, does not retry it, and never logs the token" do
      messages = []
      logger = Object.new.tap { |l| l.define_singleton_method(:error) { |text| messages << text } }
      uploader = MemprofilerPprof::PyroscopeUploader.new(server_address: gateway.url, application_name: app,
                                                         basic_auth_username: "123456",
                                                         basic_auth_password: "#{token}x", logger: logger)
      result = uploader.upload(widget_profile)
      expect([result.ok?, result.status, result.attempts]).to eq([false, 401, 1])
      expect(messages.join).to include("401", "invalid credentials")
      expect(messages.join).not_to include(token)
      expect(gateway.seen.size).to eq(1)
    end
  end

  it "gets the server's 401 without a tenant, and does not retry it" do
    messages = []
    logger = Object.new.tap { |l| l.define_singleton_method(:error) { |text| messages << text } }
    uploader = MemprofilerPprof::PyroscopeUploader.new(server_address: url, application_name: app, logger: logger)
    result = uploader.upload(widget_profile)
    expect(result).not_to be_ok
    expect([result.status, result.attempts]).to eq([401, 1])
    expect(messages.join).to include("401", "no org id")
  end
end
