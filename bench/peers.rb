# frozen_string_literal: true

# The same question, "which sites hold the retained objects?", answered on the same workload by
# three tools:
# - ObjectSpace.trace_object_allocations during the run, then a walk of the live objects grouped
#   by allocation site (file:line), summing ObjectSpace.memsize_of;
# - memory_profiler (Debian package ruby-memory-profiler): its retained memory by location;
# - datadog_heap at the default settings (sample_every: 1024): start, run, a GC, `profile`, and the
#   live objects (each_live_object) grouped by their innermost frame's file:line, weighted.
# The workload retains one string in four at LEAK_LINE (the right answer), keeps a bounded cache
# at another line and makes garbage at several others (the busiest allocation site retains
# little). Each tool, and the workload alone, runs in its own child process, alternating round by
# round: wall time (run + answer) against the workload alone, peak RSS (VmHWM) of the process, and
# whether the tool's top site is LEAK_LINE. Medians.
#
# Run: rake bench:peers (or ruby -Ilib bench/peers.rb; BENCH_SMOKE=1 for a quick run)
require_relative "support"

module PeersWorkload
  LEAK = []
  CACHE = {}

  def self.run(n)
    i = 0
    while i < n
      s = "request #{i} " * 3
      h = {id: i, name: s, tags: [s, i.to_s]}
      out = h.map { |k, v| "#{k}=#{v}" }.join("&")
      LEAK << out.ljust(256) if (i & 3) == 0 # LEAK_LINE: the most retained memory is allocated here
      CACHE[i % 1000] = out if i % 3 == 0
      i += 1
    end
  end
end
LEAK_LINE = File.foreach(__FILE__).find_index { |l| l.include?("# LEAK_" "LINE:") } + 1
RIGHT = "#{File.basename(__FILE__)}:#{LEAK_LINE}"

def top_site(bytes_by_site)
  bytes_by_site.max_by { |_, v| v }&.first
end

def child_main(tool, n)
  require "memory_profiler" if tool == "memory_profiler"
  GC.start
  top = allocated = nil
  t0 = Bench.now
  case tool
  when "none"
    allocated = GC.stat(:total_allocated_objects)
    PeersWorkload.run(n)
    t1 = Bench.now
    allocated = GC.stat(:total_allocated_objects) - allocated
  when "trace_object_allocations"
    ObjectSpace.trace_object_allocations { PeersWorkload.run(n) }
    t1 = Bench.now
    GC.start
    bytes = Hash.new(0)
    ObjectSpace.each_object do |o|
      file = ObjectSpace.allocation_sourcefile(o) or next
      bytes["#{File.basename(file)}:#{ObjectSpace.allocation_sourceline(o)}"] += ObjectSpace.memsize_of(o)
    end
    top = top_site(bytes)
  when "memory_profiler"
    report = MemoryProfiler.report { PeersWorkload.run(n) }
    t1 = Bench.now
    site = report.retained_memory_by_location.first
    top = site && site[:data].sub(/\A.*\//, "")
  when "datadog_heap"
    rec = DatadogHeap::Recorder.new
    rec.start
    PeersWorkload.run(n)
    t1 = Bench.now
    rec.stop
    GC.start # objects that have not been through a GC yet are left out of profiles
    rec.profile
    bytes = Hash.new(0)
    rec.each_live_object do |o|
      _, file, line = o.locations.first
      bytes["#{File.basename(file.to_s)}:#{line}"] += o.weight * o.size
    end
    top = top_site(bytes)
  else
    abort "unknown tool #{tool}"
  end
  t2 = Bench.now
  puts JSON.generate(run: t1 - t0, total: t2 - t0, hwm: Bench.peak_rss, top: top, allocated: allocated)
end

if ARGV[0] == "--child"
  child_main(ARGV[1], Integer(ARGV[2]))
  exit
end

N = Bench.pick(150_000, 12_000)
ROUNDS = Bench.pick(3, 1)
MEMORY_PROFILER = begin
  require "memory_profiler"
  true
rescue LoadError
  warn "bench/peers.rb: memory_profiler is not installed (bin/setup --dev installs ruby-memory-profiler); skipping it"
  false
end
TOOLS = ["none", "trace_object_allocations", *("memory_profiler" if MEMORY_PROFILER), "datadog_heap"].freeze

res = Bench.alternate(TOOLS, ROUNDS, gc: false) { |tool| Bench.child(__FILE__, "--child", tool, N) }

Bench.header("bench/peers.rb: which sites hold the retained objects? three tools, same workload",
  ["#{N} iterations (#{res["none"].first[:allocated]} allocations, #{N / 4} retained at #{RIGHT}), " \
   "one child process per run, #{ROUNDS} rounds, medians"])
med = ->(tool, key) { Bench.median(res[tool].map { |r| r[key] }) }
rows = TOOLS.map do |tool|
  tops = res[tool].map { |r| r[:top] }.uniq
  right = if tool == "none" then ""
  elsif tops == [RIGHT] then "yes"
  else "no (#{tops.join(", ")})"
  end
  [tool == "none" ? "no tool (workload alone)" : tool, format("%.2f s", med.call(tool, :total)),
    Bench.ratio(Bench.paired_ratio(res, tool, "none", :total)), Bench.ratio(Bench.paired_ratio(res, tool, "none", :run)),
    Bench.bytes(med.call(tool, :hwm)), Bench.ratio(med.call(tool, :hwm).to_f / med.call("none", :hwm)), right]
end
Bench.table(["tool", "wall (run + answer)", "wall ratio", "run-only ratio", "peak RSS", "RSS ratio", "top site right?"], rows)
