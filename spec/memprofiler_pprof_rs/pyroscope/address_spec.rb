# frozen_string_literal: true

# Credentials in a Pyroscope server address (issue 36, item 5): a password
# pasted unencoded may hold '/', '#', '?', '@' or '%', and wherever the
# address is shown (an exception, a warning, a log line, #inspect) none of
# it may appear. The wrapper's stderr is in spec/integration/wrapper_spec.rb.
RSpec.describe "Pyroscope server addresses with credentials" do
  uploader_class = MemprofilerPprof::PyroscopeUploader
  characters = { "/" => "slash", "#" => "hash", "?" => "question mark", "@" => "at sign", "%" => "percent" }

  def uploader(address, **options)
    MemprofilerPprof::PyroscopeUploader.new(server_address: address, application_name: "shop", **options)
  end

  def refusal(address)
    uploader(address)
  rescue ArgumentError => e
    e.message
  else
    raise "#{address} was accepted"
  end

  characters.each do |char, name|
    describe "a password with a #{name} (#{char})" do
      let(:password) { "ab#{char}SECRET" }

      it "is taken whole as Basic auth, and never shown by inspect" do
        up = uploader("https://123456:#{password}@profiles.example.com:4040/base")
        expect(up.instance_variable_get(:@basic_auth)).to eq(["123456", password])
        expect(up.server_address).to eq("https://profiles.example.com:4040/base")
        flusher = MemprofilerPprof::PyroscopeFlusher.new(MemprofilerPprof::Collector.new,
                                                         server_address: "https://123456:#{password}@host",
                                                         application_name: "shop")
        [up.inspect, up.to_s, flusher.inspect, flusher.to_s].each do |shown|
          expect(shown).not_to include("SECRET", "123456")
        end
      end

      it "never reaches the ArgumentError of an address refused for another reason" do
        ["ftp://123456:#{password}@host", "https://123456:#{password}@", "https://123456:#{password}@/path",
         "123456:#{password}@host", "https:/123456:#{password}@host"].each do |address|
          message = refusal(address)
          expect(message).to include("server_address")
          expect(message).not_to include("SECRET", "123456")
        end
      end

      # A URL parser reads https://123456:123#SECRET@host as host 123456,
      # port 123 and a fragment, and https://123456:ab@cd/SECRET@host as
      # host cd. Either reading could be meant, so such an address is
      # refused. (A '%' never ends the part before the host.)
      unless char == "%"
        it "read by a URL parser as a port, a host or a path, is refused as ambiguous without being shown" do
          address = char == "@" ? "https://123456:ab@cd/SECRET@host" : "https://123456:123#{char}SECRET@host"
          message = refusal(address)
          expect(message).not_to include("SECRET", "123456", "cd/")
          expect(message).to include("https://[FILTERED]@host", "%40", "basic_auth_password")
        end
      end

      it "never reaches EnvConfig's warnings or inspect" do
        config = MemprofilerPprof::EnvConfig.new(
          "PYROSCOPE_SERVER_ADDRESS" => "ftp://123456:#{password}@host",
          "PYROSCOPE_BASIC_AUTH_PASSWORD" => "OTHER_SECRET"
        )
        expect(config.pyroscope_options).to be_nil
        expect(config.warnings.join).to include("not sending profiles to Pyroscope")
        expect(config.warnings.join).not_to include("SECRET", "123456")
        expect(config.inspect).not_to include("SECRET", "123456")
        expect(config.to_s).not_to include("SECRET", "123456")
        accepted = MemprofilerPprof::EnvConfig.new("PYROSCOPE_SERVER_ADDRESS" => "https://123456:#{password}@host")
        expect(accepted.pyroscope_options).to include(server_address: "https://123456:#{password}@host")
        expect(accepted.inspect).to include("https://[FILTERED]@host")
        expect(accepted.inspect).not_to include("SECRET", "123456")
      end
    end
  end

  it "percent-decodes a proper URL's credentials, and keeps a '%' that starts no escape" do
    expect(uploader_class.split_credentials("https://u:a%23b%3Fc%2Fd%40e%25f@host"))
      .to eq(["https://host", "u", "a#b?c/d@e%f"])
    expect(uploader_class.split_credentials("https://u:a%zz#b@host")).to eq(["https://host", "u", "a%zz#b"])
  end

  it "refuses an '@' left after the host, whatever it is, rather than guess where the host is" do
    ["https://host/t@evil.example", "https://u:tok@host/p?e=a@evil.example", "https://u:x/y@host/p?q=a@b",
     "https://u:ab@cd/ef@host"].each do |address|
      message = refusal(address)
      expect(message).to include("after its host", "%40")
      expect(message).not_to include("tok", "x/y", "ab@cd", "cd/ef")
    end
  end

  describe MemprofilerPprof::PyroscopeAddress do
    it "hides everything between the scheme and the last '@', whatever it holds" do
      {
        "https://u:p#?/@%x@host:4040/p" => "https://[FILTERED]@host:4040/p",
        "https://host/p" => "https://host/p",
        "u:p@host" => "[FILTERED]@host",
        "https:/u:p@host" => "[FILTERED]@host",
        "http://u:p\xFF@h".b => "http://[FILTERED]@h",
        "" => ""
      }.each do |address, shown|
        expect(described_class.redact(address)).to eq(shown)
      end
      expect(described_class.redact(URI("https://u:p@h"))).to eq("https://[FILTERED]@h")
      expect(described_class.redact(nil)).to eq("")
    end
  end
end
