# frozen_string_literal: true

# The example service's worker CPU per request with the recorder at its defaults on vs off,
# measured inside each worker (the +1% target). bench/service.rb compares whole runs,
# each its own cluster: on this shared 2-core machine two runs of the same cluster differ by up to
# ±15% in CPU per request, more than the effect to measure. Here each worker switches the
# recorder on and off every PHASE seconds (bench/service/toggle.rb) under one steady wrk load, so
# each "on" phase is compared with the "off" phases on either side of it, a few seconds apart.
#
# Rows: "recorder on/off" switches a Recorder at its defaults (windowed, sample_every 4096, 100
# windows/s, max_overhead 0.01; stop keeps what it tracks, so the tracked set grows over the run
# as it would); "countdown recorder" the same with sampler: :countdown (sample_every 1024, the
# default once);
# "empty NEWOBJ hook" switches a hook that does nothing (the floor any NEWOBJ sampler pays on
# this Ruby); "A/A (both off)" switches nothing, the method's own noise; "windowed at
# TOGGLE_SAMPLE_EVERY" (mode dense, only when asked for) is the windowed sampler at that interval
# (1024 unless set) under the default budget: a denser default, tried before it is one. Each row
# is its own cluster; the rows alternate round by round. CPU per request: process CPU time (all
# threads) over requests served, per phase, from the phases that fall wholly inside the timed wrk
# run. Overhead = the median over phases of (on phase / mean of the off phases beside it) - 1,
# and the pooled ratio (all on CPU / on requests over all off CPU / off requests) - 1.
# Split of the pooled overhead: the gem's own threads' share of the "on" phases' CPU (its window
# timers), the pooled overhead of the program's threads alone (each phase's CPU less the gem's
# threads'), where the window jobs, samples and slow-path allocations run, and GC's part (the
# VM's GC time per request, on less off, over the CPU per request off; Ruby 3.1 and later).
#
# Run: rake bench:service_toggle (or ruby -Ilib bench/service_toggle.rb; BENCH_SMOKE=1 for a quick run).
# Needs puma, ruby-sinatra and wrk (bin/setup --dev installs them).
require_relative "support"
require "fileutils"
require "tmpdir"
require_relative "../examples/service/cluster"

ROUNDS = Bench.pick(2, 1)
SECONDS = Bench.pick(60, 8)
PHASE = Bench.pick(2.0, 1.0)
WARMUP_REQUESTS = Bench.pick(10_000, 1_000)
ALL_VARIANTS = {"recorder on/off (defaults)" => "on", "countdown recorder on/off" => "countdown", "empty NEWOBJ hook on/off (VM floor)" => "hook",
                "A/A (both off)" => "off", "countdown at exactly 1024, no budget" => "fixed",
                "windowed at TOGGLE_SAMPLE_EVERY (1024), default budget" => "dense",
                "recorder on/off, timer at TOGGLE_WINDOWS_PER_SECOND (25)" => "timer",
                "window timer alone (sample_every 2**32 - 1, no budget)" => "ticks",
                "window timer alone at TOGGLE_WINDOWS_PER_SECOND (25)" => "slow_ticks"}.freeze
# TOGGLE_VARIANTS=on,off (modes, comma-separated) runs those rows only; by default every row but
# "fixed", which is for comparing two builds (TOGGLE_COMPARE_LIB below), "dense", "timer",
# "ticks" and "slow_ticks" (the timer's ticks and wake-ups without the windows, to split the
# default's cost).
SELECTED = if ENV["TOGGLE_VARIANTS"]
  ALL_VARIANTS.select { |_, m| ENV["TOGGLE_VARIANTS"].split(",").include?(m) }
else
  ALL_VARIANTS.reject { |_, m| %w[fixed dense timer ticks slow_ticks].include?(m) }
end
# SERVICE_APPS=sinatra,rails (the default): each row on the sinatra service and on the Rails app
# of examples/rails_leak (its leak off). BENCH_SMOKE runs the sinatra one only (CI's time; the
# Rails app is exercised by bench/rails_leak.rb's smoke run).
APPS = ENV.fetch("SERVICE_APPS", Bench.pick(ServiceCluster::APPS, ["sinatra"]).join(",")).split(",")
# TOGGLE_COMPARE_LIB=DIR (another build's lib/ directory, its extension built): each row is run
# with that build too, alternating with this one, so two builds are compared in one run.
LIBS = {"" => ServiceCluster::LIB}
LIBS[" [#{ENV["TOGGLE_COMPARE_LIB"]}]"] = File.expand_path(ENV["TOGGLE_COMPARE_LIB"]) if ENV["TOGGLE_COMPARE_LIB"]
VARIANTS = APPS.product(SELECTED.to_a, LIBS.to_a).to_h do |app, (label, mode), (tag, lib)|
  ["#{app}: #{label}#{tag}", [mode, app, lib]]
end

missing = APPS.flat_map { |app| ServiceCluster.missing_tools(app) }.uniq
abort "bench/service_toggle.rb needs #{missing.join(", ")}: run bin/setup --dev" unless missing.empty?

def run((mode, app, lib), scratch)
  out = Dir.mktmpdir("toggle-", scratch)
  env = {"RUBYOPT" => "-I#{lib} -r#{File.join(__dir__, "service", "toggle.rb")}", "TOGGLE_OUT" => out,
         "TOGGLE_PHASE" => PHASE.to_s, "TOGGLE_MODE" => mode}
  cluster = ServiceCluster::Cluster.new(env: env, log: File.join(scratch, "puma.log"), app: app)
  cluster.wait_booted
  workers = cluster.worker_pids
  ServiceCluster.wrk(cluster.port, seconds: 60, max_requests: WARMUP_REQUESTS, app: app)
  from = Process.clock_gettime(Process::CLOCK_MONOTONIC)
  result = ServiceCluster.wrk(cluster.port, seconds: SECONDS, max_requests: 10**9, app: app)
  to = Process.clock_gettime(Process::CLOCK_MONOTONIC)
  sleep PHASE + 0.5 # the phase running at the end is written when it ends
  cluster.stop
  errors = result[:errors].values.sum
  raise "#{mode}: #{errors} failed requests" unless errors.zero?

  workers.map do |pid|
    data = JSON.parse(File.read(File.join(out, "#{pid}.json")), symbolize_names: true)
    phases = data[:phases].select { |p| p[:started] >= from && p[:ended] <= to && p[:requests] > 0 }
    {phases: phases, stats: data[:stats]}
  end
ensure
  cluster&.kill_all unless cluster.nil? || cluster.exited?
end

# Per worker: each "on" phase's CPU per request over the mean of its neighbouring "off" phases'.
def paired(phases)
  per = phases.map { |p| [p[:state], p[:cpu] / p[:requests]] }
  per.each_index.filter_map do |i|
    next unless per[i][0] == "on"

    off = [per[i - 1], per[i + 1]].compact.select { |s, _| s == "off" }.map(&:last)
    off.empty? || i.zero? ? nil : per[i][1] / (off.sum / off.size)
  end
end

# The block's value summed over the phases in `state` ("on" or "off"), per request served.
def per_request(phases, state)
  ps = phases.select { |p| p[:state] == state }
  ps.sum { |p| yield(p).to_f } / [ps.sum { |p| p[:requests] }, 1].max
end

# `minus_own`: the program's threads only (each phase's CPU less the gem's own threads', see
# bench/service/toggle.rb).
def pooled(phases, minus_own: false)
  on, off = %w[on off].map { |state| per_request(phases, state) { |p| p[:cpu] - (minus_own ? p[:own].to_f : 0) } }
  on / off
end

# GC's part of the pooled overhead: (GC time per request on - off) over the CPU per request off;
# and GCs per 1,000 requests, on / off.
def gc_part(phases)
  gc_on, gc_off = %w[on off].map { |state| per_request(phases, state) { |p| p[:gc] } }
  gcs_on, gcs_off = %w[on off].map { |state| 1000 * per_request(phases, state) { |p| p[:gcs] } }
  [(gc_on - gc_off) / per_request(phases, "off") { |p| p[:cpu] }, gcs_on, gcs_off]
end

# The gem's own threads' CPU over all CPU in the "on" phases.
def own_share(phases)
  on = phases.select { |p| p[:state] == "on" }
  on.sum { |p| p[:own].to_f } / [on.sum { |p| p[:cpu] }, 1e-9].max
end

Bench.header("bench/service_toggle.rb: worker CPU per request, recorder on vs off inside each worker",
  ["puma 2 workers x 4 threads, wrk -t2 -c8 for #{SECONDS} s per run after #{WARMUP_REQUESTS} requests of warm-up, " \
   "phases of #{PHASE} s, #{ROUNDS} rounds; recorder at its defaults"])

res = Dir.mktmpdir("bench-service-toggle-") do |scratch|
  Bench.alternate(VARIANTS.keys, ROUNDS, gc: false) { |label| run(VARIANTS.fetch(label), scratch) }
end

rows = VARIANTS.keys.map do |label|
  workers = res[label].flatten
  phases = workers.flat_map { |w| w[:phases] }
  ratios = workers.flat_map { |w| paired(w[:phases]) }
  stats = workers.map { |w| w[:stats] }
  [label, ratios.size.to_s, Bench.percent(Bench.median(ratios) - 1),
    format("%s..%s", Bench.percent(ratios.min - 1), Bench.percent(ratios.max - 1)),
    Bench.percent(pooled(phases) - 1),
    Bench.percent(own_share(phases)),
    Bench.percent(pooled(phases, minus_own: true) - 1),
    gc_part(phases).then { |part, on_gcs, off_gcs| format("%s (GCs %.1f / %.1f)", Bench.percent(part), on_gcs, off_gcs) },
    format("%.0f µs", 1e6 * per_request(phases, "on") { |p| p[:cpu] }),
    stats.map { |s| s[:sampler_effective_sample_every] }.minmax.uniq.join(".."),
    stats.map { |s| Bench.percent(s[:sampler_last_overhead].to_f) }.join(" / "),
    stats.map { |s| s[:num_object_records] }.join(" / "),
    # The windowed sampler: the share of the allocations its hook was installed for (watched +
    # armed, over the allocations its samples stand for).
    # (Not for the timer-alone rows, whose samples stand for next to nothing.)
    stats.map { |s| (s[:sampler_window_ticks].to_i.zero? || s[:sampler_effective_sample_every].to_i > 2**30) ? "-" : Bench.percent((s[:sampler_window_allocations] + s[:sampler_window_armed_allocations]).fdiv([s[:sampler_allocations_seen], 1].max)) }.join(" / "),
    stats.map { |s| "#{s[:sampler_window_ticks]} #{s[:signals].inspect} #{s[:wakes]}" }.join(" / ")]
end
Bench.table(["variant", "on phases", "overhead (median)", "range", "overhead (pooled)", "gem's threads (share of on CPU)",
  "program's threads (pooled)", "GC's part (GCs per 1,000 requests on / off)", "CPU/request (on)", "interval at exit",
  "budget's own share (last period)", "records at exit", "hook installed (windowed)", "ticks, signals, timer wake-ups"], rows)
