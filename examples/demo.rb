# frozen_string_literal: true

# The demo: a small service-like program with a leaking cache, profiled with the default
# settings. Writes tmp/demo/heap.pb.gz (gzip pprof: open it with `go tool pprof`) and prints the
# sites that hold the most live memory (the CLI's report). Run it with `bin/demo` (or `rake demo`);
# `bin/demo 60000` serves 60000 requests instead of 15000.
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

# Recent responses, bounded: retained, but not a leak.
RECENT = []

def handle_request(cache, i)
  body = JSON.generate({id: i, items: Array.new(8) { |n| {name: "item#{n}", price: n * 3} }})
  parsed = JSON.parse(body)
  html = parsed["items"].map { |it| TEMPLATE.result_with_hash(name: it["name"], total: it["price"]) }.join
  cache.remember(i, html[0, 40]) # the leak: one entry per request, forever
  RECENT << parsed
  RECENT.shift if RECENT.size > 500
  html.size
end

requests = Integer(ARGV.fetch(0, "15000"), 10)
puts "datadog_heap #{DatadogHeap::VERSION} (native #{DatadogHeap._native_version}) on ruby #{RUBY_VERSION}"
recorder = DatadogHeap.start
cache = LeakyCache.new
started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
# Progress: one line per step into a file or pipe; on a terminal, one line rewritten in place.
progress_end = $stdout.tty? ? "\r" : "\n"
requests.times do |i|
  handle_request(cache, i)
  print "requests: #{i + 1}#{progress_end}" if ((i + 1) % 5_000).zero?
end
DatadogHeap.stop
GC.start
elapsed = Process.clock_gettime(Process::CLOCK_MONOTONIC) - started
puts if $stdout.tty?

out = File.expand_path("../tmp/demo/heap.pb.gz", __dir__)
FileUtils.mkdir_p(File.dirname(out))
DatadogHeap.write_profile(out)

stats = recorder.stats
puts format("profiled %d requests in %.2fs; %d allocations seen, %d sampled (1 in %d)",
  requests, elapsed, stats[:sampler_allocations_seen], stats[:sampler_samples_recorded], recorder.sample_every)
puts "wrote #{out}: `exe/datadog-heap report #{out}` (or go tool pprof) reads it"
puts

# The same report the CLI prints: the leak (LeakyCache#remember) should be on top.
require "datadog_heap/cli"
DatadogHeap::CLI.new.run(["report", out, "--top", "8"])
