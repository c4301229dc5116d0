# frozen_string_literal: true

# Shared helpers for bench/*.rb. Every bench compares variants measured in the same process run,
# alternating them round by round (A B C, B C A, ...), and reports medians: this machine is shared
# and noisy, so a number is only ever compared with one taken beside it.
#
# BENCH_SMOKE=1 shrinks every bench to a few seconds (CI runs them that way so they cannot rot);
# the numbers it prints are not worth quoting.

# This checkout's lib/, unless `ruby -I DIR` named another build's (a bench's child comparing two
# builds, see Bench.child): the gem a bench measures is the one its command line names.
BENCH_LIB = File.expand_path("../lib", __dir__)
$LOAD_PATH.unshift(BENCH_LIB) unless $LOAD_PATH.any? { |dir| File.file?(File.join(dir, "datadog_heap.rb")) }
require "datadog_heap"
require "etc"
require "json"
require "objspace"
require "rbconfig"

module Bench
  module_function

  def smoke?
    ENV["BENCH_SMOKE"] == "1"
  end

  # `full` normally, `smoke` under BENCH_SMOKE=1.
  def pick(full, smoke)
    smoke? ? smoke : full
  end

  def now
    Process.clock_gettime(Process::CLOCK_MONOTONIC)
  end

  def now_ns
    Process.clock_gettime(Process::CLOCK_MONOTONIC, :nanosecond)
  end

  # Seconds `block` takes.
  def time
    t = now
    yield
    now - t
  end

  # CPU seconds this process has used. Single-threaded benches time with it: on a shared machine
  # it does not count the time the OS gave another process, which wall time does.
  def cpu
    Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID)
  end

  # CPU seconds `block` takes.
  def cpu_time
    t = cpu
    yield
    cpu - t
  end

  def median(values)
    sorted = values.sort
    n = sorted.size
    return Float::NAN if n.zero?

    n.odd? ? sorted[n / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
  end

  # Runs each variant `rounds` times, rotating the order every round so no variant always runs
  # first (or always after the same one), with a GC before each run so every run starts from a
  # similar heap. The block gets the variant and returns a measurement (usually seconds).
  # Returns {variant => [measurements...]}.
  def alternate(variants, rounds, gc: true)
    results = variants.to_h { |v| [v, []] }
    rounds.times do |round|
      variants.rotate(round % variants.size).each do |variant|
        GC.start if gc
        results[variant] << yield(variant)
      end
    end
    results
  end

  # Median over rounds of variant/base, each round's pair measured side by side: steadier than a
  # ratio of medians when the machine's load drifts during the bench. `key` picks the number out
  # of each measurement when they are Hashes.
  def paired_ratio(results, variant, base, key = nil)
    pick = key ? ->(m) { m[key] } : ->(m) { m }
    median(results[variant].zip(results[base]).map { |v, b| pick.call(v).to_f / pick.call(b) })
  end

  # Prints a header naming the bench, the machine and its load, so a pasted table says where it
  # came from.
  def header(title, notes = [])
    puts
    puts "== #{title}#{smoke? ? " (BENCH_SMOKE: tiny sizes, numbers not meaningful)" : ""}"
    puts "   #{RUBY_DESCRIPTION}"
    puts "   #{Etc.nprocessors} cpus, load average #{load_average.map { |l| format("%.2f", l) }.join(" ")}, " \
      "datadog_heap #{DatadogHeap::VERSION}"
    notes.each { |n| puts "   #{n}" }
    puts
  end

  def load_average
    File.read("/proc/loadavg").split.first(3).map(&:to_f)
  rescue SystemCallError
    []
  end

  # Prints rows (arrays of cells) under headers as an aligned Markdown table: numbers right-aligned.
  def table(headers, rows)
    cells = [headers.map(&:to_s)] + rows.map { |r| r.map(&:to_s) }
    widths = headers.each_index.map { |i| cells.map { |r| r[i].to_s.size }.max }
    number = /\A[-+]?[\d.,]+( ?[a-zA-Zµ%×\/]+)?\z/
    numeric = headers.each_index.map do |i|
      filled = rows.map { |r| r[i].to_s }.reject(&:empty?)
      filled.any? && filled.all? { |c| c.match?(number) }
    end
    line = lambda do |r|
      "| " + r.each_with_index.map { |c, i| numeric[i] ? c.rjust(widths[i]) : c.ljust(widths[i]) }.join(" | ") + " |"
    end
    puts line.call(cells[0])
    puts "|" + widths.each_with_index.map { |w, i| numeric[i] ? "#{"-" * (w + 1)}:" : "-" * (w + 2) }.join("|") + "|"
    cells.drop(1).each { |r| puts line.call(r) }
    puts
  end

  # Formatting: nanoseconds, seconds, bytes, ratios.
  def ns(value)
    return "-" if value.nil? || (value.is_a?(Float) && value.nan?)

    if value.abs >= 10_000
      format("%.1f µs", value / 1000.0)
    elsif value.abs >= 100
      format("%.0f ns", value)
    else
      format("%.1f ns", value)
    end
  end

  def ms(seconds)
    format("%.1f ms", seconds * 1000.0)
  end

  def bytes(value)
    return "-" if value.nil?

    if value.abs >= 10 * 1024 * 1024
      format("%.1f MB", value / 1024.0 / 1024)
    elsif value.abs >= 10 * 1024
      format("%.1f kB", value / 1024.0)
    else
      format("%.0f B", value)
    end
  end

  def ratio(value)
    format("%.3f×", value)
  end

  def percent(value)
    format("%+.1f%%", value * 100.0)
  end

  # Current and peak resident set size of this process, in bytes (Linux /proc).
  # Runs the block (whose result stays alive until the count is done) under a recorder made with
  # `opts`; returns [the estimated live objects per class name, the block's result].
  def live_estimate(opts = {})
    rec = DatadogHeap::Recorder.new(**opts)
    rec.start
    kept = yield
    rec.stop
    rec.commit
    GC.start
    [rec.each_live_object.each_with_object(Hash.new(0)) { |o, h| h[o.class_name] += o.weight }, kept]
  end

  def rss
    proc_status_kb("VmRSS") * 1024
  end

  def peak_rss
    proc_status_kb("VmHWM") * 1024
  end

  def proc_status_kb(key)
    File.foreach("/proc/self/status") do |l|
      return l.split[1].to_i if l.start_with?("#{key}:")
    end
    0
  end

  # Runs `ruby -I lib script args...` and returns the JSON object it prints last on stdout. For
  # benches that want one clean process per measurement (RSS, peak RSS), or another build's gem
  # (`lib`: its lib/ directory, its extension built).
  def child(script, *args, env: {}, lib: BENCH_LIB)
    cmd = [RbConfig.ruby, "-I", lib, script, *args.map(&:to_s)]
    out = IO.popen(env, cmd, &:read)
    raise "#{cmd.join(" ")} failed (exit #{$?.exitstatus})" unless $?.success?

    JSON.parse(out.lines.last, symbolize_names: true)
  end

  # A stack of `depth` frames in the [name, path, line] form record_allocation takes, innermost
  # first. Stacks with different `variant`s differ in their innermost frames (`unique` of them),
  # and share the rest, as stacks of one program do.
  def synthetic_stack(depth, variant, unique: 2)
    Array.new(depth) do |i|
      if i < unique
        ["leaf_#{variant}_#{i}", "/app/lib/site_#{variant % 97}.rb", 10 + variant]
      else
        ["frame_#{i}", "/app/lib/common_#{i % 13}.rb", 100 + i]
      end
    end
  end

  # max_tracked_objects for recorders that must never hit the cap (every allocation sampled).
  NO_CAP = 2**40

  # Allocation loops the throughput benches share: name => ->(n) { n allocations }. Each assigns
  # what it allocates to a local (the compiler drops an unused `[i, i]` or `{a: i}`).
  LOOPS = {
    "BasicObject.new" => ->(n) { i = 0; while i < n; o = BasicObject.new; i += 1; end; o && nil },
    "[i, i]" => ->(n) { i = 0; while i < n; o = [i, i]; i += 1; end; o && nil },
    "small String" => ->(n) { s = "small"; i = 0; while i < n; o = s.dup; i += 1; end; o && nil },
    "mix: [i, i], String, Hash" => lambda do |n|
      s = "small"
      i = 0
      while i < n
        o = [i, i]
        o = s.dup
        o = {a: i}
        i += 3
      end
      o && nil
    end,
  }.freeze

  # A recorder with `count` tracked objects (kept alive in the returned array) spread over
  # `stacks` distinct stacks of `depth` frames, set up through record_allocation and explicit
  # commits so the counts are exact. Commits run in batches of the pending queue's size.
  # Returns [recorder, objects, GC count when they were recorded].
  def tracked_recorder(count, stacks:, depth: 20, size_enabled: true, objects: nil)
    rec = DatadogHeap::Recorder.new(sample_every: 1, size_enabled: size_enabled, max_tracked_objects: NO_CAP, max_overhead: nil)
    DatadogHeap::Testing._native_set_postponed_commits(rec, false)
    stack_list = Array.new(stacks) { |s| synthetic_stack(depth, s) }
    objects ||= Array.new(count) { |i| "tracked object #{i}" }
    # No GC while recording: every object gets the same allocation GC count (`gen`, returned), so
    # after one GC they are all of age 1 (young updates visit objects of age 1 and 2 only).
    GC.start
    GC.disable
    gen = GC.count
    objects.each_with_index do |obj, i|
      ok = rec.record_allocation(obj, weight: 1, class_name: "String", locations: stack_list[i % stacks])
      raise "record_allocation refused object #{i}: #{rec.stats.inspect}" unless ok

      rec.commit if (i & 255) == 255
    end
    rec.commit
    GC.enable
    st = rec.stats
    raise "expected #{count} records, got #{st[:num_object_records]}" unless st[:num_object_records] == count

    [rec, objects, gen]
  end
end
