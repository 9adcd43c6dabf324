# frozen_string_literal: true

require "net/http"
require "webrick"

# A loopback stand-in for the gateway in front of a hosted Pyroscope (as in
# Grafana Cloud): Pyroscope itself has no Basic auth (v1.12.0's server
# never reads Authorization; only its profilecli sends one). The gateway
# checks Basic credentials, makes the user the tenant (X-Scope-OrgID, as
# Grafana Cloud's stack id is), and forwards the request unchanged to a real
# multi-tenant server. Without valid credentials it answers 401 itself.
class AuthGateway
  attr_reader :seen

  # users: { "user" => "password" }.
  def initialize(upstream, users)
    @upstream = URI(upstream)
    @users = users
    @seen = Queue.new
    @server = WEBrick::HTTPServer.new(BindAddress: "127.0.0.1", Port: 0, Logger: WEBrick::Log.new(File::NULL),
                                      AccessLog: [])
    @server.mount_proc("/") { |req, res| forward(req, res) }
    @thread = Thread.new { @server.start }
  end

  def url = "http://127.0.0.1:#{@server.config[:Port]}"

  def stop
    @server.shutdown
    @thread.join(5)
  end

  private

  def forward(req, res)
    user = authenticated_user(req["Authorization"])
    @seen << [req.path, user]
    unless user
      res.status = 401
      res["WWW-Authenticate"] = 'Basic realm="pyroscope"'
      res["Content-Type"] = "application/json"
      res.body = '{"code":"unauthenticated","message":"invalid credentials"}'
      return
    end

    request = Net::HTTPGenericRequest.new(req.request_method, true, true, req.unparsed_uri)
    request["Content-Type"] = req["Content-Type"] if req["Content-Type"]
    request["X-Scope-OrgID"] = user
    request.body = req.body
    response = Net::HTTP.start(@upstream.host, @upstream.port) { |http| http.request(request) }
    res.status = response.code.to_i
    res["Content-Type"] = response["Content-Type"] if response["Content-Type"]
    res.body = response.body.to_s
  end

  def authenticated_user(header)
    scheme, encoded = header.to_s.split(" ", 2)
    return nil unless scheme&.casecmp?("basic") && encoded

    user, password = encoded.unpack1("m0").split(":", 2)
    user if user && @users.key?(user) && @users[user] == password
  rescue ArgumentError
    nil
  end
end
