# frozen_string_literal: true

# A real service under the profiler: requests per second and latency of the example
# service (examples/service/: Sinatra on a puma cluster, 2 workers x 4 threads, preload_app!)
# under wrk on loopback (keep-alive, examples/service/load.lua's endpoint mix, one request in four
# leaking), with and without the profiler, and each worker's memory after the run. An empty
# NEWOBJ hook (bench/service/empty_hook.rb, no recorder) shows the floor that any sampler built on
# that hook pays on Ruby 3.1.
#
# A run boots a fresh cluster with the variant's environment, warms it up (WARMUP_REQUESTS), times
# REQUESTS more with wrk (a run that takes longer than TIME_LIMIT seconds fails), reads each
# worker's RSS and PSS, and stops the cluster with SIGTERM. Every run serves the same number of
# requests, so the leak has grown by as much in each when memory is read. Besides wrk's numbers
# it reads the workers' CPU time (user + system, /proc) over the timed requests: CPU per request
# is what caps req/s once the cores are busy, and unlike wall time it barely moves when another
# process takes a core. Profiled variants run with RUBYOPT=-rdatadog_heap/auto, as users run it,
# and write a profile every PROFILE_INTERVAL seconds and at exit from each worker (a run fails
# unless each worker wrote one). Variants alternate round by round; a ratio is the median over
# rounds of the variant's number over the baseline's from the same round. "no profiler (again)"
# is a second baseline: its ratio to the first is the noise band of this machine during the run.
#
# Run: rake bench:service (or ruby -Ilib bench/service.rb; BENCH_SMOKE=1 for a quick run).
# Needs puma, ruby-sinatra and wrk (bin/setup --dev installs them).
require_relative "support"
require "fileutils"
require "tmpdir"
require_relative "../examples/service/cluster"

ROUNDS = Bench.pick(7, 2)
REQUESTS = Bench.pick(50_000, 4_000)
WARMUP_REQUESTS = Bench.pick(10_000, 1_000)
# Seconds: ten times what REQUESTS takes here (5-8k requests/s).
TIME_LIMIT = Bench.pick(90, 15)
PROFILE_INTERVAL = Bench.pick(5, 1)
CONNECTIONS = 8 # workers x threads: every puma thread has a keep-alive connection
BASELINE = "no profiler"

# Variant label => a lambda from the run's profile directory to the environment the cluster gets
# (nil: nothing added). Profiled variants run auto mode, which picks the sampler from
# DATADOG_HEAP_SAMPLER.
profiled = ->(extra = {}) { ->(out) { ServiceCluster.profiler_env(out, interval: PROFILE_INTERVAL).merge(extra) } }
VARIANTS = {
  BASELINE => nil,
  "no profiler (again)" => nil,
  "empty NEWOBJ hook (VM floor)" => ->(_) { {"RUBYOPT" => "-I#{ServiceCluster::LIB} -r#{File.join(__dir__, "service", "empty_hook.rb")}"} },
  # The hook and auto mode's machinery (writer thread, updates, profiles of nothing) without a
  # single sample: what the samplers' rows cost beyond it is sampling and what it records.
  "countdown, never sampling" => profiled.call("DATADOG_HEAP_SAMPLE_EVERY" => (2**32 - 1).to_s),
  "countdown sampler, default settings" => profiled.call,
  "windowed sampler (sample_every 4096)" => profiled.call("DATADOG_HEAP_SAMPLER" => "windowed"),
}.freeze

missing = ServiceCluster.missing_tools
abort "bench/service.rb needs #{missing.join(", ")}: run bin/setup --dev" unless missing.empty?

CLOCK_TICKS = Etc.sysconf(Etc::SC_CLK_TCK)

# CPU seconds (user + system, every thread's) the process `pid` has used.
def cpu_seconds(pid)
  fields = File.read("/proc/#{pid}/stat").split(") ").last.split
  (Integer(fields[11]) + Integer(fields[12])).to_f / CLOCK_TICKS
end

def memory_kb(pid)
  rss = File.read("/proc/#{pid}/status")[/^VmRSS:\s+(\d+)/, 1].to_i
  pss = File.read("/proc/#{pid}/smaps_rollup")[/^Pss:\s+(\d+)/, 1].to_i
  [rss, pss]
rescue SystemCallError
  [0, 0]
end

def run(label, scratch)
  out = File.join(scratch, "profiles-#{Process.clock_gettime(Process::CLOCK_MONOTONIC, :nanosecond)}")
  env = VARIANTS.fetch(label)&.call(out)
  log = File.join(scratch, "puma.log")
  cluster = ServiceCluster::Cluster.new(env: env || {}, log: log)
  cluster.wait_booted
  workers = cluster.worker_pids
  raise "#{label}: #{workers.size} workers running, expected 2\n#{File.read(log)}" unless workers.size == 2

  cpu = nil
  result = [WARMUP_REQUESTS, REQUESTS].map do |count|
    cpu = workers.sum { |pid| cpu_seconds(pid) }
    r = ServiceCluster.wrk(cluster.port, seconds: TIME_LIMIT, max_requests: count, connections: CONNECTIONS)
    raise "#{label}: #{count} requests took more than #{TIME_LIMIT} s: #{r}" unless r[:capped]

    r
  end.last
  cpu_per_request = (workers.sum { |pid| cpu_seconds(pid) } - cpu) / result[:requests]

  errors = result[:errors].values.sum
  raise "#{label}: #{errors} failed requests: #{result[:errors]}\n#{File.read(log)}" unless errors.zero?
  raise "#{label}: workers changed during the run\n#{File.read(log)}" unless cluster.worker_pids == workers

  memory = workers.map { |pid| memory_kb(pid) }
  status = cluster.stop
  raise "#{label}: the cluster did not stop within 30 s of SIGTERM\n#{File.read(log)}" unless status

  if env&.key?("DATADOG_HEAP_OUTPUT")
    unwritten = workers.reject { |pid| Dir[File.join(out, "heap-#{pid}-*.pb.gz")].any? }
    raise "#{label}: workers #{unwritten} wrote no profile\n#{File.read(log)}" unless unwritten.empty?
  end
  FileUtils.rm_rf(out)
  result.merge(cpu_us: cpu_per_request * 1e6, rss_kb: memory.sum(&:first) / memory.size.to_f,
    pss_kb: memory.sum(&:last) / memory.size.to_f)
ensure
  cluster&.kill_all unless cluster.nil? || cluster.exited?
end

Bench.header("bench/service.rb: the example puma service under wrk, with and without the profiler",
  ["puma 2 workers x 4 threads (preload_app!), wrk -t2 -c#{CONNECTIONS} on 127.0.0.1, #{REQUESTS} requests timed per run " \
   "after #{WARMUP_REQUESTS} of warm-up, #{ROUNDS} rounds; profiled runs write a profile every #{PROFILE_INTERVAL} s per worker",
   "ratios: median over rounds of variant / #{BASELINE} in the same round; latency is wrk's (closed loop)"])

labels = VARIANTS.keys
res = Dir.mktmpdir("bench-service-") do |scratch|
  Bench.alternate(labels, ROUNDS, gc: false) { |label| run(label, scratch) }
end

med = ->(label, key) { Bench.median(res[label].map { |r| key.is_a?(Array) ? r.dig(*key) : r[key] }) }
rows = labels.map do |label|
  base = label == BASELINE
  ratio = ->(key) { base ? "" : Bench.ratio(Bench.median(res[label].zip(res[BASELINE]).map { |v, b| v.dig(*key).to_f / b.dig(*key) })) }
  [label, format("%.0f", med.call(label, :requests_per_second)), ratio.call([:requests_per_second]),
    format("%.0f µs", med.call(label, :cpu_us)), ratio.call([:cpu_us]),
    Bench.ms(med.call(label, [:latency_us, :p50]) / 1e6), ratio.call([:latency_us, :p50]),
    Bench.ms(med.call(label, [:latency_us, :p99]) / 1e6), ratio.call([:latency_us, :p99]),
    Bench.bytes(med.call(label, :rss_kb) * 1024), Bench.bytes(med.call(label, :pss_kb) * 1024)]
end
Bench.table(["variant", "req/s", "req/s ratio", "worker CPU/request", "CPU ratio", "p50", "p50 ratio", "p99", "p99 ratio", "RSS per worker", "PSS per worker"], rows)

# Every round's numbers, so the spread behind each median is visible.
round_rows = ROUNDS.times.flat_map do |round|
  labels.map do |label|
    r = res[label][round]
    b = res[BASELINE][round]
    [round + 1, label, format("%.0f", r[:requests_per_second]), Bench.ratio(r[:requests_per_second] / b[:requests_per_second]),
      format("%.0f µs", r[:cpu_us]), Bench.ratio(r[:cpu_us] / b[:cpu_us]),
      Bench.ms(r[:latency_us][:p50] / 1e6), Bench.ms(r[:latency_us][:p99] / 1e6), Bench.bytes(r[:rss_kb] * 1024)]
  end
end
Bench.table(["round", "variant", "req/s", "vs #{BASELINE}", "CPU/request", "vs #{BASELINE}", "p50", "p99", "RSS per worker"], round_rows)

[[:requests_per_second, "req/s"], [:cpu_us, "worker CPU per request"]].each do |key, what|
  noise = res["no profiler (again)"].zip(res[BASELINE]).map { |a, b| a[key] / b[key] - 1 }
  puts "noise band on #{what} (no profiler (again) vs #{BASELINE}, per round): " \
    "#{noise.map { |n| Bench.percent(n) }.join(" ")}; median #{Bench.percent(Bench.median(noise))}"
end
