# frozen_string_literal: true

# The application bench/lib/rails_ar_app.ru serves: a Rails 6.1 app as
# `rails new` makes one (Rails::Application with its railties, production
# environment, eager loading), from Debian's ruby-rails and ruby-sqlite3,
# with an ActiveRecord model on SQLite and a rendered view: GET /orders
# queries 30 orders with their customer (two SELECTs) and renders each in
# a partial with the usual helpers, in a layout.

require "tmpdir"
require "logger"
require "rails"
require "active_record/railtie"
require "action_controller/railtie"
require "action_view/railtie"

module BenchRailsAr
  DATABASE = File.join(Dir.tmpdir, "memprofiler-bench-rails-ar-#{Process.pid}.sqlite3")

  class Application < Rails::Application
    config.root = __dir__
    config.eager_load = true
    config.cache_classes = true
    config.consider_all_requests_local = false
    config.logger = Logger.new(nil)
    config.log_level = :fatal
    config.secret_key_base = "0123456789abcdef" * 8
    config.hosts.clear
    config.paths["app/views"] = File.join(__dir__, "views")
    config.active_record.legacy_connection_handling = false if config.active_record.respond_to?(:legacy_connection_handling=)

    routes.append do
      get "/orders" => "bench_rails_ar/orders#index"
    end
  end

  class Customer < ActiveRecord::Base
    has_many :orders
  end

  class Order < ActiveRecord::Base
    belongs_to :customer
  end

  class OrdersController < ActionController::Base
    layout "application"

    def index
      page = params.fetch(:page, 1).to_i
      @orders = Order.includes(:customer).where(status: %w[open shipped]).order(:id)
                     .offset(((page - 1) % 5) * 30).limit(30).to_a
      @total = @orders.sum(&:amount_cents)
    end
  end

  module_function

  # A fresh database of 200 customers and 1,000 orders (deleted at exit).
  def setup_database
    ActiveRecord::Schema.verbose = false
    ActiveRecord::Schema.define do
      create_table :customers do |t|
        t.string :name, null: false
        t.string :email, null: false
      end
      create_table :orders do |t|
        t.references :customer, null: false
        t.string :status, null: false
        t.integer :amount_cents, null: false
        t.string :note
        t.timestamps
      end
      add_index :orders, :status
    end
    now = Time.utc(2026, 1, 1)
    Customer.insert_all(Array.new(200) { |i| { name: "Customer #{i}", email: "customer#{i}@example.com" } })
    Order.insert_all(Array.new(1_000) do |i|
      { customer_id: (i % 200) + 1, status: %w[open shipped cancelled][i % 3], amount_cents: 1_000 + (i * 37 % 9_000),
        note: "note for order #{i}", created_at: now - (i * 3_600), updated_at: now }
    end)
    at_exit { File.delete(DATABASE) if File.exist?(DATABASE) }
  end

  def app
    @app ||= begin
      File.delete(DATABASE) if File.exist?(DATABASE)
      # (config/database.yml in an app from `rails new`)
      ENV["DATABASE_URL"] = "sqlite3:#{DATABASE}?pool=8"
      Application.initialize!
      setup_database
      Application
    end
  end
end
