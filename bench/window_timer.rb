# frozen_string_literal: true

# The windowed sampler's timer: ticks per second against windows_per_second (the timer's rate)
# asked, next to a thread that allocates in a tight loop without ever blocking, and what the
# windows cost. Before Ruby 3.3 the native timer signals the Ruby thread last seen running (see
# ext/datadog_heap/src/runtime/windows.rs); the Ruby timer thread (DATADOG_HEAP_WINDOW_TIMER=ruby)
# has to wait for the GVL, which a busy thread gives up every 100 ms. Each cell runs in a child
# process (the timer is chosen at load), with no overhead budget; the children alternate round
# by round.
#
# Run: rake bench:window_timer (or ruby -Ilib bench/window_timer.rb; BENCH_SMOKE=1 for a quick run)
require_relative "support"

ROUNDS = Bench.pick(3, 1)
SECONDS = Bench.pick(3.0, 0.5)
RATES = Bench.pick([20, 100, 1000], [100]).freeze
TIMERS = {"native" => {}, "Ruby thread" => {"DATADOG_HEAP_WINDOW_TIMER" => "ruby"}}.freeze

CHILD = <<~RUBY
  rate, seconds = ARGV.map(&:to_f)
  rec = DatadogHeap::Recorder.new(sampler: :windowed, windows_per_second: rate, max_overhead: nil)
  rec.start
  stop = false
  busy = Thread.new { x = nil; x = "x" * 10 until stop }
  t = Process.clock_gettime(Process::CLOCK_MONOTONIC)
  sleep seconds
  stop = true
  busy.join
  elapsed = Process.clock_gettime(Process::CLOCK_MONOTONIC) - t
  opened = rec.stats[:sampler_window_ticks]
  rec.stop
  print Marshal.dump([DatadogHeap._native_native_window_timer, opened / elapsed])
RUBY

def child(env, rate)
  lib = File.expand_path("../lib", __dir__)
  out = IO.popen(env, [RbConfig.ruby, "-I", lib, "-rdatadog_heap", "-e", CHILD, rate.to_s, SECONDS.to_s], err: File::NULL, &:read)
  Marshal.load(out) # rubocop:disable Security/MarshalLoad
end

Bench.header("bench/window_timer.rb: window timer ticks per second next to a busy thread",
  ["#{ROUNDS} rounds of #{SECONDS} s per cell, median (min..max); a thread allocating \"x\" * 10 in a loop, windowed sampler, no budget"])

rows = RATES.map do |rate|
  cells = TIMERS.map do |label, env|
    runs = Array.new(ROUNDS) { child(env, rate) }
    native = runs.map(&:first).uniq
    raise "#{label}: the timer was #{native.inspect}" unless native == [label == "native"]

    per_second = runs.map(&:last)
    format("%.1f/s (%.1f..%.1f)", Bench.median(per_second), per_second.min, per_second.max)
  end
  ["#{rate}/s", *cells]
end
Bench.table(["asked", *TIMERS.keys.map { |t| "#{t} timer" }], rows)
