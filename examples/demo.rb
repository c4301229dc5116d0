# frozen_string_literal: true

# The demo: a small service-like program with a leaking cache, profiled with the default
# settings. Writes tmp/demo/heap.pb.gz (gzip pprof: open it with `go tool pprof`) and prints the
# sites that hold the most live memory. Run it with `bin/demo` (or `rake demo`).
require "datadog_heap"
require "json"
require "erb"
require "fileutils"

# A cache that never evicts: the leak the profile should point at.
class LeakyCache
  def initialize
    @entries = {}
  end

  def remember(key, payload)
    @entries[key] = "#{payload}:#{key}" * 4
  end
end

TEMPLATE = ERB.new("<li><%= name %>: <%= total %></li>")

def handle_request(cache, i)
  body = JSON.generate({id: i, items: Array.new(8) { |n| {name: "item#{n}", price: n * 3} }})
  parsed = JSON.parse(body)
  html = parsed["items"].map { |it| TEMPLATE.result_with_hash(name: it["name"], total: it["price"]) }.join
  cache.remember(i, html[0, 40]) # the leak: one entry per request, forever
  html.size
end

puts "datadog_heap #{DatadogHeap::VERSION} (native #{DatadogHeap._native_version}) on ruby #{RUBY_VERSION}"
recorder = DatadogHeap.start
cache = LeakyCache.new
started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
15_000.times do |i|
  handle_request(cache, i)
  print "\rrequests: #{i + 1}" if ((i + 1) % 5_000).zero?
end
DatadogHeap.stop
GC.start
elapsed = Process.clock_gettime(Process::CLOCK_MONOTONIC) - started
puts

out = File.expand_path("../tmp/demo/heap.pb.gz", __dir__)
FileUtils.mkdir_p(File.dirname(out))
DatadogHeap.write_profile(out)

# Top sites by estimated live bytes (weight x size), keyed by the innermost frame in this file.
sites = Hash.new { |h, k| h[k] = {bytes: 0, objects: 0, classes: Hash.new(0)} }
recorder.each_live_object do |obj|
  frame = obj.locations.find { |_, path, _| path == __FILE__ } || obj.locations.first
  site = sites["#{frame[0]} (#{File.basename(frame[1])}:#{frame[2]})"]
  site[:bytes] += obj.weight * obj.size
  site[:objects] += obj.weight
  site[:classes][obj.class_name || "?"] += obj.weight
end
total = sites.values.sum { |s| s[:bytes] }.nonzero? || 1
stats = recorder.stats
puts format("profiled %d requests in %.2fs; %d allocations seen, %d sampled (1 in %d)",
  15_000, elapsed, stats[:sampler_allocations_seen], stats[:sampler_samples_recorded], recorder.sample_every)
puts "wrote #{out} (#{File.size(out)} bytes)"
puts
puts format("%12s %10s %7s  %-10s %s", "live bytes", "objects", "share", "class", "site")
sites.sort_by { |_, s| -s[:bytes] }.first(8).each do |name, s|
  puts format("%12d %10d %6.1f%%  %-10s %s", s[:bytes], s[:objects], 100.0 * s[:bytes] / total,
    s[:classes].max_by(&:last)&.first, name)
end
