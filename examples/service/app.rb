# frozen_string_literal: true

# The example service (examples/service/): a Sinatra app with the endpoints a small JSON/HTML
# service has, and one bug. Served by puma in cluster mode (puma.rb), profiled from outside
# (RUBYOPT=-rdatadog_heap/auto, or `datadog-heap run -- puma ...`): the app knows nothing of the
# profiler.
#
#   GET /health             "ok"
#   GET /orders.json?page=N a JSON list of 20 orders, built per request
#   GET /dashboard          an ERB page with a table of 20 rows
#   GET /price/:id          a price from a bounded LRU cache (capacity 256): memory stays flat
#   GET /report?account=N&… a report (50 rows) memoized by its whole query string: the leak, since every
#                           request carries a distinct query (a request id), so nothing is ever
#                           evicted
#
# The lines marked `leak site` and `lru site` are where the retained objects are allocated; the
# spec and bench look them up by those markers.

require "erb"
require "json"
require "sinatra/base"

# A thread-safe least-recently-used cache: at most `capacity` entries, the least recently read
# one evicted first. Relies on Hash keeping insertion order: a hit moves its key to the end.
class LruCache
  attr_reader :capacity

  def initialize(capacity)
    @capacity = capacity
    @entries = {}
    @lock = Mutex.new
  end

  # The value cached for `key`, else the block's, cached.
  def fetch(key)
    @lock.synchronize do
      if @entries.key?(key)
        value = @entries.delete(key)
        return @entries[key] = value
      end
    end
    value = yield
    @lock.synchronize do
      @entries[key] = value
      @entries.shift while @entries.size > @capacity
    end
    value
  end

  def size
    @lock.synchronize { @entries.size }
  end
end

# A memo of computed values that never forgets: fine for a bounded key space, a leak for an
# unbounded one (which is how /report uses it).
class MemoCache
  def initialize
    @entries = {}
    @lock = Mutex.new
  end

  def fetch(key)
    @lock.synchronize { return @entries[key] if @entries.key?(key) }
    value = yield
    @lock.synchronize { @entries[key] = value }
  end

  def size
    @lock.synchronize { @entries.size }
  end
end

class ServiceApp < Sinatra::Base
  PRICES = LruCache.new(256)
  REPORTS = MemoCache.new
  PRODUCTS = %w[kettle toaster blender grinder scale lamp fan heater].freeze

  DASHBOARD = ERB.new(<<~HTML, trim_mode: "-")
    <!doctype html>
    <html><head><title><%= title %></title></head>
    <body>
    <h1><%= title %></h1>
    <table>
    <%- rows.each do |row| -%>
      <tr class="<%= row[:status] %>"><td><%= row[:id] %></td><td><%= row[:product] %></td><td><%= format("%.2f", row[:total]) %></td></tr>
    <%- end -%>
    </table>
    </body></html>
  HTML

  configure do
    set :logging, false
    set :show_exceptions, false
    set :dump_errors, true
  end

  helpers do
    def orders(seed, count = 20)
      Array.new(count) do |i|
        n = seed * count + i
        {id: n, product: PRODUCTS[n % PRODUCTS.size], quantity: 1 + n % 5,
         total: (n % 97) * 1.25, status: n.even? ? "paid" : "pending", tags: ["web", "batch-#{n % 10}"]}
      end
    end

    def render_dashboard(rows)
      DASHBOARD.result_with_hash(title: "Orders dashboard", rows: rows)
    end

    # Each cached value is allocated on one line that goes on after the allocation: Ruby (and so
    # the profile) puts an object made by the last expression of a method or block on the line
    # of the `end` that follows.
    def compute_price(id)
      "product #{id}: #{format("%.2f", 3.5 + (id % 89) * 0.75)} EUR incl. VAT, list #{id % 13}".freeze # lru site
    end

    def build_report(account)
      Array.new(50) { |i| {line: i, account: account, title: "account #{account}, line #{i}: #{PRODUCTS[i % 8]} x#{i % 7 + 1}, shipped by parcel from the north warehouse, invoiced monthly, net 30"} } # leak site
    end
  end

  get "/health" do
    "ok"
  end

  get "/orders.json" do
    content_type :json
    JSON.generate(orders(Integer(params.fetch("page", "0"), 10)))
  end

  get "/dashboard" do
    render_dashboard(orders(7))
  end

  get "/price/:id" do
    id = Integer(params[:id], 10)
    content_type :json
    JSON.generate(id: id, price: PRICES.fetch(id) { compute_price(id) })
  end

  get "/report" do
    account = Integer(params.fetch("account", "0"), 10)
    rows = REPORTS.fetch(request.query_string) { build_report(account) }
    content_type :json
    JSON.generate(account: account, lines: rows.size, first: rows.first[:title])
  end

  get "/stats" do
    content_type :json
    JSON.generate(pid: Process.pid, prices: PRICES.size, reports: REPORTS.size)
  end
end
