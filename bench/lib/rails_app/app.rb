# frozen_string_literal: true

# The application bench/lib/rails_app.ru serves (see there): Rails 6.1's
# middleware stack, router, a controller and ActionView templates in
# rails_app/views, from Debian's ruby-actionpack, without railties.

require "ipaddr"
require "action_controller"
require "action_view"
require "active_support/key_generator"
require "active_support/messages/rotation_configuration"

module BenchRails
  SECRET = "0123456789abcdef" * 8

  # What Rails::Application#call merges into every request's env: the
  # cookie jar's keys and settings.
  ENV_CONFIG = {
    "action_dispatch.secret_key_base" => SECRET,
    "action_dispatch.key_generator" =>
      ActiveSupport::CachingKeyGenerator.new(ActiveSupport::KeyGenerator.new(SECRET, iterations: 1000)),
    "action_dispatch.signed_cookie_salt" => "signed cookie",
    "action_dispatch.encrypted_cookie_salt" => "encrypted cookie",
    "action_dispatch.encrypted_signed_cookie_salt" => "signed encrypted cookie",
    "action_dispatch.authenticated_encrypted_cookie_salt" => "authenticated encrypted cookie",
    "action_dispatch.use_authenticated_cookie_encryption" => true,
    "action_dispatch.cookies_serializer" => :json,
    "action_dispatch.cookies_rotations" => ActiveSupport::Messages::RotationConfiguration.new,
    "action_dispatch.use_cookies_with_metadata" => true,
    "action_dispatch.parameter_filter" => [:password],
    "action_dispatch.show_exceptions" => true,
    "action_dispatch.show_detailed_exceptions" => false
  }.freeze

  # The outermost layer: Rails::Application#call's env merge, and the probe.
  class Application
    def initialize(app)
      @app = app
    end

    def call(env)
      env.merge!(ENV_CONFIG)
      return @app.call(env) unless env["HTTP_X_BENCH_PROBE"]

      probe(env)
    end

    private

    # GC.stat(:total_allocated_objects) counts every thread's allocations:
    # the probe is sent while no other request is running.
    def probe(env)
      Thread.current[:bench_depth] = 0
      before = GC.stat(:total_allocated_objects)
      status, headers, body = @app.call(env)
      parts = []
      body.each { |part| parts << part }
      body.close if body.respond_to?(:close)
      allocated = GC.stat(:total_allocated_objects) - before
      headers = headers.merge("x-bench-allocated" => allocated.to_s,
                              "x-bench-depth" => Thread.current[:bench_depth].to_s)
      [status, headers, parts]
    ensure
      Thread.current[:bench_depth] = nil
    end
  end

  ROUTES = ActionDispatch::Routing::RouteSet.new
  ROUTES.draw do
    resources :products, only: %i[index show]
  end

  # Rails' production middleware stack (railties' default_middleware_stack),
  # less what railties, Sprockets and ActiveRecord add.
  def self.middleware
    stack = ActionDispatch::MiddlewareStack.new
    stack.use ActionDispatch::HostAuthorization, [IPAddr.new("127.0.0.1")]
    stack.use Rack::Sendfile
    stack.use ActionDispatch::Static, File.join(__dir__, "public")
    stack.use ActionDispatch::Executor, ActiveSupport::Executor
    stack.use Rack::Runtime
    stack.use Rack::MethodOverride
    stack.use ActionDispatch::RequestId, header: "X-Request-Id"
    stack.use ActionDispatch::RemoteIp
    stack.use ActionDispatch::ShowExceptions, ActionDispatch::PublicExceptions.new(File.join(__dir__, "public"))
    stack.use ActionDispatch::DebugExceptions, ROUTES
    stack.use ActionDispatch::Callbacks
    stack.use ActionDispatch::Cookies
    stack.use ActionDispatch::Session::CookieStore, key: "_bench_session"
    stack.use ActionDispatch::Flash
    stack.use ActionDispatch::ContentSecurityPolicy::Middleware
    stack.use ActionDispatch::PermissionsPolicy::Middleware
    stack.use Rack::Head
    stack.use Rack::ConditionalGet
    stack.use Rack::ETag
    stack.use Rack::TempfileReaper
    stack
  end

  # The Rack application: the env merge and probe, the middleware stack, the router.
  def self.app = Application.new(middleware.build(ROUTES))

  Product = Struct.new(:id, :name, :price, :stock, :tags, :updated_at, keyword_init: true)

  NAMES = %w[anvil bolt crate drill easel flange gasket hinge ingot jack].freeze
end

# Helpers the templates call; the deepest records the stack depth for the probe.
module ProductsHelper
  def stock_badge(product)
    depth = Thread.current[:bench_depth]
    Thread.current[:bench_depth] = [depth, caller.size + 1].max if depth
    tag.span(product.stock.positive? ? "#{product.stock} in stock" : "sold out",
             class: ["badge", ("badge-empty" unless product.stock.positive?)])
  end

  def price_line(product)
    safe_join([number_to_currency(product.price), number_with_delimiter(product.stock * 1000)], " / ")
  end
end

class ApplicationController < ActionController::Base
  include BenchRails::ROUTES.url_helpers

  self.view_paths = [File.join(__dir__, "views")]
  layout "application"
end

class ProductsController < ApplicationController
  helper ProductsHelper

  # Products on a page: enough for 20,000+ allocations a request.
  PER_PAGE = 30

  def index
    page = params.fetch(:page, 1).to_i
    @products = Array.new(PER_PAGE) do |i|
      id = (page * PER_PAGE) + i
      BenchRails::Product.new(id: id, name: "#{BenchRails::NAMES[id % 10]}-#{id}", price: (id * 7919 % 10_000) / 100.0,
                              stock: id % 7, tags: BenchRails::NAMES.sample(3, random: Random.new(id)),
                              updated_at: Time.at(1_700_000_000 + (id * 3600)).utc)
    end
  end
end
