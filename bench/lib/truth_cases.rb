# frozen_string_literal: true

# Synthetic programs whose kept objects a sampler must estimate: what the default sampler once
# could not see (one long C call, a short burst between idle stretches, short phases). Each case
# keeps its objects in `kept` until the caller has read the recorder, and is deterministic, so
# the exact truth (Ruby's own allocation tracing, in another run) holds for every run.
#
# Used by bench/sampler_truth.rb.
require "json"

module TruthCases
  Pair = Struct.new(:a, :b)

  # Built before any recorder starts: the blob is loaded, the text parsed, inside the cases.
  BLOB = Marshal.dump(Array.new(100_000) { |i| "m#{i}" })
  TEXT = JSON.generate(Array.new(50_000) { |i| {"n" => i} })

  module_function

  # The case names, in the order they run.
  def names
    %w[marshal json burst long_burst phases threads]
  end

  # Runs case `name`, keeping its objects in `kept`.
  def run(name, kept)
    send(:"case_#{name}", kept)
  end

  # One C call builds 100,001 kept objects, then Ruby code keeps 20,000 Hashes right after it.
  def case_marshal(kept)
    kept << Marshal.load(BLOB)
    kept << Array.new(20_000) { |i| {i => i} }
    churn(100_000)
  end

  # One C extension's call builds 50,000 kept Hashes.
  def case_json(kept)
    churn(100_000)
    kept << JSON.parse(TEXT)
    churn(100_000)
  end

  # 30,000 objects kept in a burst of a few milliseconds between two idle stretches.
  def case_burst(kept)
    sleep 0.02
    kept << Array.new(30_000) { Pair.new(1, 2) }
    sleep 0.02
    churn(50_000)
  end

  # 200,000 objects kept in a burst of about 30 ms between two idle stretches: several strata
  # of windows go by before the timer's next tick.
  def case_long_burst(kept)
    sleep 0.02
    kept << Array.new(200_000) { Pair.new(1, 2) }
    sleep 0.02
    churn(50_000)
  end

  # Three phases of about 20, 80 and 300 ms, each keeping one object in four it allocates.
  def case_phases(kept)
    kept << keep_one_in_four(100_000) { Pair.new(1, 2) }
    kept << keep_one_in_four(400_000) { |i| "p#{i}" }
    kept << keep_one_in_four(1_500_000) { |i| [i] }
  end

  # Four threads keep 10,000 objects each in bursts of 200, waiting on a pipe between bursts, as a
  # server's threads wait on their sockets.
  def case_threads(kept)
    reader, writer = IO.pipe
    threads = Array.new(4) do
      Thread.new do
        mine = []
        50.times do
          200.times { mine << Pair.new(1, 2) }
          IO.select([reader], nil, nil, 0.0003)
        end
        mine
      end
    end
    kept.concat(threads.map(&:value))
  ensure
    reader&.close
    writer&.close
  end

  def keep_one_in_four(n)
    out = []
    i = 0
    while i < n
      x = yield(i)
      out << x if (i & 3).zero?
      i += 1
    end
    out
  end

  # Garbage: allocations nobody keeps.
  def churn(n)
    x = nil
    n.times { x = Object.new }
    x
  end

  # The innermost frame's "path:line" of a recorder's live object: the site rule of
  # Ruby's own allocation tracing, which the truth uses.
  def site_of(locations)
    _name, path, line = locations.first
    "#{path}:#{line}"
  end

  # The exact truth: the objects case `name` keeps, per site, from Ruby's allocation tracing.
  # Counted by walking what the case keeps rather than every object in the heap: the first
  # collections after tracing leave some of the last garbage alive for a while (a few percent of
  # the last phase), which a heap walk would count.
  def truth(name)
    require "objspace"
    kept = []
    GC.start
    ObjectSpace.trace_object_allocations { run(name, kept) }
    counts = Hash.new(0)
    seen = {}.compare_by_identity
    todo = kept.dup
    until todo.empty?
      o = todo.pop
      next if seen.key?(o)
      seen[o] = true
      file = ObjectSpace.allocation_sourcefile(o)
      next unless file
      counts["#{file}:#{ObjectSpace.allocation_sourceline(o)}"] += 1
      ObjectSpace.reachable_objects_from(o)&.each { |r| todo << r unless r.is_a?(ObjectSpace::InternalObjectWrapper) }
    end
    ObjectSpace.trace_object_allocations_clear
    counts
  end

  # One run of case `name` under a recorder made with `options`: estimated live objects per site,
  # the recorder's stats, and per site the profile's own estimate and its one-sigma error (what
  # `datadog-heap report` prints as ±), by "file:line" of the innermost Ruby frame.
  def estimate(name, options)
    require "tmpdir"
    kept = []
    rec = DatadogHeap::Recorder.new(**options)
    rec.start
    run(name, kept)
    rec.stop
    GC.start
    estimates = Hash.new(0)
    rec.each_live_object { |o| estimates[site_of(o.locations)] += o.weight }
    rows = Dir.mktmpdir do |dir|
      rec.write_profile(File.join(dir, "p.pprof"), gc: false)
      profile = DatadogHeap::Profile.load(File.join(dir, "p.pprof"))
      # Keyed by the innermost frame of the row's stack, as the truth is (a row's own location skips
      # frames such as <internal:marshal>).
      profile.top(1000, group: :location, by: :count).to_h { |s| [site_of(s.locations), [s.live_objects, s.objects_stddev]] }
    end
    [estimates, rec.stats, rows]
  ensure
    kept&.clear
  end
end
