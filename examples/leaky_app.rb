# frozen_string_literal: true

# A small service-like program with a leak, and nothing of datadog_heap in it: each request builds
# JSON, parses it and renders a template, keeps the last 500 responses (retained, but bounded) and
# puts one entry into a cache that never evicts (the leak). examples/demo.rb (bin/demo) profiles
# it in-process; README's quick start profiles it from the outside:
#
#   DATADOG_HEAP_PRESET=leak_hunt datadog-heap run --out tmp/heap -- ruby examples/leaky_app.rb
#
# `ruby examples/leaky_app.rb 60000` serves 60000 requests instead of 15000.
require "json"
require "erb"

# A cache that never evicts: one entry per request, forever.
class LeakyCache
  def initialize
    @entries = {}
  end

  def remember(key, payload)
    @entries[key] = "#{payload}:#{key}" * 4
  end

  def size
    @entries.size
  end

  def each_value(&block)
    @entries.each_value(&block)
  end
end

module LeakyApp
  DEFAULT_REQUESTS = 15_000
  TEMPLATE = ERB.new("<li><%= name %>: <%= total %></li>")
  # What keeps the leak alive: the cache, held by a constant as long as the program runs.
  CACHE = LeakyCache.new
  # Recent responses, bounded: retained, but not a leak.
  RECENT = []

  module_function

  # One request: JSON built, parsed and rendered; returns the page's length.
  def handle_request(i)
    body = JSON.generate({id: i, items: Array.new(8) { |n| {name: "item#{n}", price: n * 3} }})
    parsed = JSON.parse(body)
    html = parsed["items"].map { |it| TEMPLATE.result_with_hash(name: it["name"], total: it["price"]) }.join
    CACHE.remember(i, html[0, 40]) # the leak
    RECENT << parsed
    RECENT.shift if RECENT.size > 500
    html.size
  end

  # Serves `requests` requests, yielding the count served after each one when a block is given.
  def serve(requests)
    requests.times do |i|
      handle_request(i)
      yield i + 1 if block_given?
    end
  end
end

if $PROGRAM_NAME == __FILE__
  arg = ARGV.fetch(0, LeakyApp::DEFAULT_REQUESTS.to_s)
  requests = Integer(arg, 10, exception: false)
  abort "leaky_app.rb: REQUESTS must be a whole number >= 1, got #{arg.inspect}" unless requests&.positive?
  LeakyApp.serve(requests)
  puts "served #{requests} requests; the cache holds #{LeakyApp::CACHE.size} entries"
end
