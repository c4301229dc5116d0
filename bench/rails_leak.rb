# frozen_string_literal: true

# Does a profile find the leak? examples/rails_leak/app.rb (Rails 6.1, the Railtie, the endpoint)
# served by puma (single mode, 4 threads), REQUESTS requests (orders, search, health), then the
# endpoint's report: is the leak (ApplicationController#remember) the top row, and on how many live
# samples does that row rest? RUNS fresh servers per variant, variants alternating:
#   leak_hunt  config.datadog_heap.preset = :leak_hunt
#   defaults   the Railtie's defaults (windowed sampler, 1 in 4096, the 1% budget)
#   1024       config.datadog_heap.sample_every = 1024 (no budget: an interval set is kept)
#   leak_hunt_128  the preset at 1 in 128
#
# TREND=1: instead, each server also writes a profile every INTERVAL seconds (config.datadog_heap
# output and interval, default 2) while the requests are paced over about 20 s, and
# DatadogHeap::Profile.trend reads the series: which sites does it call growing?
#
# Run: ruby -Ilib bench/rails_leak.rb (RUNS=10 REQUESTS=2000 VARIANTS=leak_hunt,defaults; BENCH_SMOKE=1)
require_relative "support"
require "tmpdir"

require_relative "../examples/rails_leak/server"

REQUESTS = Integer(ENV.fetch("REQUESTS", Bench.pick(2000, 300).to_s), 10)
RUNS = Integer(ENV.fetch("RUNS", Bench.pick(10, 1).to_s), 10)
SETTINGS = {
  "leak_hunt" => {enabled: true, endpoint: true, preset: "leak_hunt"},
  "defaults" => {enabled: true, endpoint: true},
  "1024" => {enabled: true, endpoint: true, sample_every: 1024},
  "leak_hunt_128" => {enabled: true, endpoint: true, preset: "leak_hunt", sample_every: 128},
}.freeze
VARIANTS = ENV.fetch("VARIANTS", "leak_hunt,defaults").split(",").each { |v| SETTINGS.fetch(v) }
LEAK = /app\.rb:\d+ in ApplicationController#remember/

def with_server(settings, &block)
  RailsLeak.with_server(settings, &block)
end

# One request of the mix: 6 in 10 an order (HTML or JSON), 3 a search, 1 a health check.
def request(http, i)
  path = case i % 10
         when 0..2 then "/orders/#{i}"
         when 3..5 then "/orders/#{i}.json"
         when 6..8 then "/search?q=#{%w[red blue green large small][i % 5]}+widget"
         else "/health"
         end
  response = http.get(path)
  raise "GET #{path}: #{response.code}" unless response.code == "200"
end

# The report's site rows: [live bytes text, samples or nil, site text].
def rows(report)
  report.lines.grep(/\A\s*[\d.]+ (B|KiB|MiB|GiB)\s/).map(&:strip)
end

TREND = ENV["TREND"] == "1"
INTERVAL = Float(ENV.fetch("INTERVAL", "2"))

# TREND=1: the sites the series of profiles calls growing, after `requests` requests paced over
# about ten intervals.
def trend_run(variant)
  Dir.mktmpdir do |dir|
    with_server(SETTINGS.fetch(variant).merge(output: dir, interval: INTERVAL)) do |http|
      pace = INTERVAL * 10 / REQUESTS
      t = Bench.now
      REQUESTS.times do |i|
        request(http, i)
        ahead = t + i * pace - Bench.now
        sleep ahead if ahead > 0
      end
      sleep INTERVAL
    end
    profiles = Dir.glob(File.join(dir, "heap-*.pb.gz")).sort_by { |f| f[/-(\d+)\.pb\.gz\z/, 1].to_i }.map { |f| DatadogHeap::Profile.load(f) }
    sites = DatadogHeap::Profile.trend(profiles, app_root: File.dirname(RailsLeak::APP))
    growing = sites.select { |s| s.verdict == :growing }
    # What the leak keeps: sites allocated in the leak's method, or whose objects a profile of the
    # series found retained by its array (the preset writes retainer paths, for the heaviest sites
    # of each profile; other variants have none).
    kept = profiles.flat_map do |profile|
      profile.top_retained(1000, app_root: File.dirname(RailsLeak::APP))
        .select { |_, paths| paths.any? { |path, _, _| path.include?("RECENT") } }.map { |site, _| site.label }
    end.uniq
    leaks = ->(s) { "#{s.label} #{s.called_from}".match?(LEAK) || kept.include?(s.label) }
    {profiles: profiles.size, growing: growing.reject(&leaks).map { |s| "#{s.class_name} #{s.label}"[0, 140] },
     leak: growing.any?(&leaks), others: growing.count { |s| !leaks.call(s) }}
  end
end

def run(variant)
  return trend_run(variant) if TREND

  with_server(SETTINGS.fetch(variant)) do |http|
    t = Bench.now
    REQUESTS.times { |i| request(http, i) }
    elapsed = Bench.now - t
    report = http.get("/debug/heap?report=1&top=10&gc=1").body
    top = rows(report)
    rank = top.index { |row| row.match?(LEAK) }
    {rank: rank && rank + 1, top: top.first.to_s[0, 150], rps: REQUESTS / elapsed, notes: report.lines.grep(/^Note:/).map(&:strip)}
  end
end

if TREND
  Bench.header("bench/rails_leak.rb TREND=1: which sites does trend call growing?",
    ["#{REQUESTS} requests per run over about #{(INTERVAL * 10).round} s, a profile every #{INTERVAL} s, #{RUNS} runs per variant"])
  results = Bench.alternate(VARIANTS, RUNS, gc: false) { |v| run(v) }
  rows = VARIANTS.map do |v|
    runs = results[v]
    [v, runs.map { |r| r[:profiles] }.minmax.join("-"), "#{runs.count { |r| r[:leak] }} / #{runs.size}",
      runs.map { |r| r[:others] }.join(" ")]
  end
  Bench.table(["variant", "profiles", "leak growing", "other sites growing, per run"], rows)
  results.each do |v, runs|
    others = runs.flat_map { |r| r[:growing] }.tally
    others.first(5).each { |site, n| puts "#{v}: also growing in #{n} run(s): #{site}" }
  end
  exit
end

Bench.header("bench/rails_leak.rb: is the leak the report's top row?",
  ["#{REQUESTS} requests per run, #{RUNS} runs per variant, puma single mode 4 threads, report after a full GC (?gc=1)"])
results = Bench.alternate(VARIANTS, RUNS, gc: false) { |v| run(v) }
rows = VARIANTS.map do |v|
  runs = results[v]
  ranks = runs.map { |r| r[:rank] || "-" }
  [v, "#{runs.count { |r| r[:rank] == 1 }} / #{runs.size}", ranks.join(" "), format("%.0f", Bench.median(runs.map { |r| r[:rps] }))]
end
Bench.table(["variant", "leak on top", "leak's rank per run", "requests/s (median)"], rows)
VARIANTS.each do |v|
  misses = results[v].reject { |r| r[:rank] == 1 }
  next if misses.empty?

  puts "#{v}: top rows when the leak was not on top:"
  misses.first(3).each { |r| puts "  #{r[:top]}" }
end
results.each_value.flat_map { |runs| runs.flat_map { |r| r[:notes] } }.uniq.each { |n| puts n }
