# frozen_string_literal: true

# Where a sample's time goes in the example service, with the recorder at its defaults: boots the
# cluster with bench/service/stage_worker.rb in each worker, runs wrk for SECONDS (default 40),
# and prints each worker's numbers: CPU, requests served (wrk's total split evenly), allocations,
# samples, the budget's own total and each stage's (name, nanoseconds, count). Not part of
# `rake bench`; README "The service's CPU per request" quotes one run.
#
# SERVICE_APP=rails runs the Rails app of examples/rails_leak (its leak off) instead of the
# sinatra service; STAGE_SAMPLER=windowed|countdown and STAGE_SAMPLE_EVERY=N pick the recorder;
# STAGE_LIB=DIR (another build's lib/ directory, its extension built) is the build the workers
# load (the default: this checkout's).
#
# Run: ruby -Ilib bench/service/stage_run.rb
require_relative "../support"
require "tmpdir"
require_relative "../../examples/service/cluster"

seconds = Integer(ENV.fetch("SECONDS", "40"))
Dir.mktmpdir("stage-run-") do |out|
  lib = File.expand_path(ENV.fetch("STAGE_LIB", ServiceCluster::LIB))
  env = {"RUBYOPT" => "-I#{lib} -r#{File.join(__dir__, "stage_worker.rb")}", "STAGE_OUT" => out}
  app = ENV.fetch("SERVICE_APP", "sinatra")
  cluster = ServiceCluster::Cluster.new(env: env, log: File.join(out, "puma.log"), app: app)
  begin
    cluster.wait_booted
    ServiceCluster.wrk(cluster.port, seconds: 60, max_requests: 4_000, app: app) # warm-up
    result = ServiceCluster.wrk(cluster.port, seconds: seconds, max_requests: 10**9, app: app)
    sleep 2.5 # each worker writes every 2 s
    cluster.stop
  ensure
    cluster.kill_all unless cluster.exited?
  end
  workers = Dir[File.join(out, "*.json")].map { |f| JSON.parse(File.read(f), symbolize_names: true) }
  per_worker = result[:requests].fdiv(workers.size)
  puts "#{lib}: #{result[:requests]} requests in #{(result[:duration_us] / 1e6).round(1)} s over #{workers.size} workers"
  workers.each do |w|
    samples = w[:stats][:sampler_samples_recorded]
    stages = w[:stages].to_h { |name, ns, count, median| [name, [ns, count, median || 0]] }
    timed = %w[sample commit young_update].sum { |name| stages.fetch(name, [0])[0] }
    # All in, from medians: the hook's sampled path and the commit per sample, the young
    # updates' total spread over the samples.
    median_all_in = (stages.fetch("sample", [0, 0, 0])[2] + stages.fetch("commit", [0, 0, 0])[2] +
      stages.fetch("young_update", [0])[0].fdiv([samples, 1].max)) / 1e3
    puts format("worker: %.1f s CPU, %.0f allocations per request, %d samples, budget total %.3f s (%.2f%%), stages %.3f s, %.1f µs per sample (mean), %.1f µs (medians)",
      w[:cpu], w[:allocations] / per_worker, samples, w[:stats][:sampler_overhead_ns_total] / 1e9,
      100.0 * w[:stats][:sampler_overhead_ns_total] / 1e9 / w[:cpu], timed / 1e9, timed / 1e3 / [samples, 1].max, median_all_in)
    puts "  " + stages.map { |name, (ns, count, median)|
      "#{name} #{count}× mean #{(ns.fdiv([count, 1].max) / 1e3).round(2)} / median #{(median / 1e3).round(2)} µs"
    }.join(", ")
    hits, misses = w[:stats].values_at(:lifetime_stack_cache_hits, :lifetime_stack_cache_misses)
    puts format("  stack cache hits %.0f%% (%d / %d), %d GCs, interval at exit %d", 100.0 * hits / [hits + misses, 1].max,
      hits, hits + misses, w[:gcs], w[:stats][:sampler_effective_sample_every])
    next unless w[:stats][:sampler_windows_opened].to_i > 0

    # The windowed sampler: the share of the allocations its hook was installed for.
    st = w[:stats]
    puts format("  windows %d, ticks %d: watched %.2f%%, armed %.2f%% of the allocations; moved by late ticks %d, spanned %d",
      st[:sampler_windows_opened], st[:sampler_window_ticks], 100.0 * st[:sampler_window_allocations] / w[:allocations],
      100.0 * st[:sampler_window_armed_allocations] / w[:allocations], st[:sampler_window_late_allocations], st[:sampler_windows_spanned])
  end
end
