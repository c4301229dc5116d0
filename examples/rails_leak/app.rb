# frozen_string_literal: true

# A small Rails 6.1 app with a leak, for bench/rails_leak.rb and spec/stress/rails_leak_spec.rb:
# a class-level log of recent requests that every request adds to and nothing ever trims
# (ApplicationController#remember), beside ordinary request work (params, JSON, an ERB view,
# ActiveSupport), which allocates far more but keeps nothing. Configured from the environment:
#
#   HEAP_SETTINGS  a JSON object of config.datadog_heap settings (default: {"enabled": true,
#                  "endpoint": true}); "preset" and "sampler" values become Symbols
#
#   puma -b tcp://127.0.0.1:3000 examples/rails_leak/config.ru

require "json"
require "tmpdir"
require "logger"
ENV["RAILS_ENV"] ||= "production"
require "rails"
require "action_controller/railtie"
require "action_view/railtie"
require "datadog_heap"
# The gem may have been loaded before Rails (RUBYOPT=-rdatadog_heap... in the benches), when its
# Railtie could not be: load it now.
require "datadog_heap/railtie"

class LeakyApp < Rails::Application
  config.root = __dir__
  config.eager_load = false
  config.logger = Logger.new(nil)
  config.log_level = :fatal
  config.secret_key_base = "0" * 64
  config.hosts.clear
  config.consider_all_requests_local = false
  config.action_controller.perform_caching = false
  config.cache_store = :null_store

  settings = JSON.parse(ENV.fetch("HEAP_SETTINGS", '{"enabled": true, "endpoint": true}'))
  settings.each do |key, value|
    value = value.to_sym if %w[preset sampler].include?(key) && value
    config.datadog_heap[key] = value
  end

  routes.append do
    get "/orders/:id" => "orders#show"
    get "/search" => "search#index"
    get "/health" => "health#show"
  end
end

# An order as the app builds it from "the database": a few nested values.
Order = Struct.new(:id, :customer, :lines, :total, :placed_at, keyword_init: true) do
  def self.find(id)
    lines = Array.new(3 + id % 4) do |i|
      {sku: "SKU-#{id}-#{i}", quantity: 1 + i, price: (9.99 * (i + 1)).round(2), note: "line #{i} of order #{id}"}
    end
    new(id: id, customer: {name: "Customer #{id % 97}", email: "c#{id % 97}@example.com"},
      lines: lines, total: lines.sum { |l| l[:quantity] * l[:price] }.round(2), placed_at: Time.at(1_700_000_000 + id))
  end
end

class ApplicationController < ActionController::Base
  # The leak: every request's path, parameters and time, kept for the process's life (meant to be
  # the last hundred, but nothing trims it).
  RECENT = []

  # LEAKY_APP_LEAK=0: no leak (the service benches' Rails rows measure cost, not a leak).
  after_action :remember unless ENV["LEAKY_APP_LEAK"] == "0"

  private

  def remember
    RECENT << {path: request.path, params: params.to_unsafe_h.except(:controller, :action), at: Time.now.to_f}
  end
end

class OrdersController < ApplicationController
  def show
    order = Order.find(Integer(params[:id], 10))
    respond_to do |format|
      format.html { render "orders/show", locals: {order: order} }
      format.json { render json: {order: order.to_h, items: order.lines.size, currency: "USD"} }
    end
  end


end

class SearchController < ApplicationController
  def index
    terms = params.fetch(:q, "widget blue large").to_s.split
    results = Array.new(20) { |i| {id: i, title: "#{terms.sample(random: Random.new(i)).capitalize} #{i}", score: (1.0 / (i + 1)).round(3)} }
    render json: {query: terms, results: results.select { |r| r[:score] > 0.05 }.map(&:stringify_keys)}
  end
end

class HealthController < ApplicationController
  def show
    render plain: "ok #{Process.pid}"
  end
end

Rails.application.initialize!
