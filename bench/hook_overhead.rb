# Quick hook-overhead check (the full bench/ suite is its own issue): BasicObject.new in a loop,
# no recorder vs sample_every: 1024, alternating runs, medians of 5.
# Run: ruby -Ilib bench/hook_overhead.rb
require "datadog_heap"
N = 3_000_000
def run(n) = (t = Process.clock_gettime(Process::CLOCK_MONOTONIC); i = 0; while i < n; BasicObject.new; i += 1; end; Process.clock_gettime(Process::CLOCK_MONOTONIC) - t)
run(N)
res = Hash.new { |h, k| h[k] = [] }
rec = DatadogHeap::Recorder.new(sample_every: 1024)
5.times do
  res[:base] << run(N)
  rec.start; res[:on] << run(N); rec.stop
end
med = res.transform_values { |v| v.sort[2] * 1e9 / N }
puts format("baseline %.1f ns/alloc, sample_every=1024 %.1f ns/alloc, ratio %.3f", med[:base], med[:on], med[:on] / med[:base])
st = rec.stats
puts format("samples %d, mean sample cost %.0f ns", st[:sampler_samples_recorded], st[:sampler_time_ns_total].to_f / [st[:sampler_samples_recorded], 1].max)
