# Live objects and live bytes of real programs nobody here wrote, against exact truth (issues 27
# and 23).
#
# Each program runs in-process in a forked child, with ObjectSpace.trace_object_allocations and a
# recorder both started before the program is even required; the recorder samples at exactly
# sample_every (max_overhead: nil). When it is done: the recorder stops, a GC runs, the recorder
# writes its profile (a full update: sizes as memsize_of says now), then the truth is walked:
# every live object the trace saw allocated, memsize_of each, summed by allocation file:line.
# Printed: estimated / true live objects and bytes, and how many of the 10 true heaviest sites (by
# bytes, by objects) are in the profile's 10 heaviest; then, per program and sample_every, the 10
# sites with the most live objects: truth, estimate, error, its sampling sigma and z, and how many
# of them our top 10 finds against what the sampling model expects (2000 profiles simulated from
# the truth). The harness, the site rule shared by both sides and the model are in
# bench/lib/real_programs.rb (spec/real_programs_spec.rb asserts on the same numbers).
#
# Programs (Debian packages; a missing one is skipped with a message):
# - jekyll: `jekyll build` of a generated 300-post site (apt-get install jekyll);
# - rubocop: rubocop over three stdlib folders, net/, uri/ and csv/ (apt-get install rubocop).
# BENCH_SMOKE=1: 15 posts, one small folder, sample_every 64 only. RUNS=n: n runs of each.
#
# Run: rake bench:real_programs (or ruby -Ilib bench/real_programs.rb; BENCH_SMOKE=1 for a quick run)
require_relative "support"
require_relative "lib/real_programs"
require "tmpdir"

# REAL_PROGRAMS_EVERY=64 and REAL_PROGRAMS_ONLY=rubocop narrow the run.
# REAL_PROGRAMS_EVERY=defaults: a Recorder.new with nothing given (the sampler, interval and
# budget a user gets), its interval at the end standing for it in the error columns.
# The windowed sampler's knobs, with REAL_PROGRAMS_AS_USER=1 (bench/lib/real_programs.rb):
# REAL_PROGRAMS_WINDOWS=N ticks a second of the window timer, REAL_PROGRAMS_WINDOW_MEAN=M (the mean
# interval inside windows, 64 by default). REAL_PROGRAMS_EXCESS=1 prints each run's sites whose
# estimate is furthest from the truth.
SAMPLE_EVERYS = ENV["REAL_PROGRAMS_EVERY"]&.split(",")&.map { |e| (e == "defaults") ? :defaults : Integer(e, 10) } ||
  Bench.pick([64, 1024], [64])
RUNS = Integer(ENV.fetch("RUNS", "1"))
PROGRAMS = RealPrograms.programs(posts: Bench.pick(300, 15), rubocop_dirs: Bench.pick(%w[net uri csv], %w[optparse]))

def top10(hash, index)
  RealPrograms.top(hash, 10, index)
end

def mega(bytes)
  format("%.2fM", bytes / 1e6)
end

def signed_percent(est, truth)
  return "n/a" if truth.zero?

  format("%+.0f%%", 100.0 * (est - truth) / truth)
end

Bench.header("bench/real_programs.rb: live objects and bytes of real programs, estimate vs truth",
  ["truth: trace_object_allocations + memsize_of of every live object at the end, by allocation file:line",
    "top-10: how many of the 10 heaviest true sites are in the profile's 10 heaviest (by bytes, by objects)",
    "sampling at exactly sample_every (max_overhead: nil)"])

rows = []
worst = []
per_site = []
found = []
PROGRAMS.each do |name, program|
  next if ENV["REAL_PROGRAMS_ONLY"] && !ENV["REAL_PROGRAMS_ONLY"].split(",").include?(name.to_s)
  unless RealPrograms.installed?(name)
    puts "#{name}: skipped, not installed (apt-get install #{name})"
    next
  end
  Dir.mktmpdir("datadog_heap_real") do |dir|
    program[:setup].call(dir)
    SAMPLE_EVERYS.each do |sample_every|
      RUNS.times do |run|
        r = RealPrograms.in_child { RealPrograms.measure(program, sample_every, dir) }
        est, truth = r[:est], r[:truth]
        if ENV["REAL_PROGRAMS_EXCESS"] == "1"
          excess = (est.keys | truth.keys).map { |k| [est.fetch(k, [0])[0] - truth.fetch(k, [0])[0], k] }.sort
          puts "#{program[:describe]}, #{sample_every}, run #{run + 1}: live objects estimated over (+) and under (-) the truth"
          (excess.last(8).reverse + excess.first(4)).each { |d, k| puts format("  %+8d  %s", d, k) }
        end
        asked = sample_every
        n = r[:sample_every] # the interval at exit, at the defaults
        sum = ->(h, i) { h.values.sum { |v| v[i] } }
        objects_est, objects_true, bytes_est, bytes_true = sum.call(est, 0), sum.call(truth, 0), sum.call(est, 1), sum.call(truth, 1)
        # Sampling error of the totals: a sample stands for N allocations, so the variance is about
        # (N - 1) times the objects' count (for objects) or their sum of squared sizes (for bytes)
        # (see bench/lib/real_programs.rb). The windowed sampler's clusters make its spread wider.
        z = ->(e, t, squares) { format("%+.1f", (e - t) / Math.sqrt((n - 1) * squares)) }
        rows << [program[:describe], (asked == :defaults) ? "defaults (#{n} at exit)" : n, run + 1,
          r[:stats][:num_object_records],
          "#{objects_est} / #{objects_true} (#{signed_percent(objects_est, objects_true)}, z #{z.call(objects_est, objects_true, objects_true)})",
          "#{mega(bytes_est)} / #{mega(bytes_true)} (#{signed_percent(bytes_est, bytes_true)}, z #{z.call(bytes_est, bytes_true, sum.call(truth, 2))})",
          "#{(top10(truth, 1) & top10(est, 1)).size} of 10", "#{(top10(truth, 0) & top10(est, 0)).size} of 10",
          format("%.1f s", r[:seconds])]
        top10(truth, 1).each do |loc|
          t = truth[loc]
          e = est.fetch(loc, [0, 0])
          sigma = Math.sqrt((n - 1) * t[2])
          worst << [name, n, run + 1, RealPrograms.short(loc), "#{e[1]} / #{t[1]}",
            signed_percent(e[1], t[1]), sigma.zero? ? "n/a" : format("%+.1f", (e[1] - t[1]) / sigma)]
        end

        c = RealPrograms.compare(r, draws: Bench.pick(2000, 200))
        c[:sites].each do |site|
          per_site << [name, n, run + 1, RealPrograms.short(site[:location]), site[:truth], site[:estimate],
            format("%+.0f%%", 100 * site[:error]), format("%.0f%%", 100 * site[:relative_sigma]),
            format("%+.2f", site[:z]), format("%.1f", site[:expected_samples]),
            format("%.0e", [site[:p_low], site[:p_high]].min)]
        end
        top_est, top_true = c[:totals][:top]
        found << [program[:describe], n, run + 1, "#{c[:found]} of 10",
          "#{c[:overlap_median]} (worst #{c[:overlap_min]})",
          "#{top_est} / #{top_true} (#{signed_percent(top_est, top_true)}, z #{format("%+.1f", (top_est - top_true) / RealPrograms.sigma(top_true, n))})",
          "#{c[:line0]} (#{format("%.1f%%", 100.0 * c[:line0] / objects_true)})",
          r[:stats].values_at(:sampler_samples_recorded, :lifetime_thinnings).join(" / ")]
      end
    end
  end
end

unless rows.empty?
  Bench.table(["program", "sample_every", "run", "live samples", "live objects est / true", "live bytes est / true",
    "top-10 by bytes", "top-10 by objects", "run time"], rows)
  puts
  puts "The 10 heaviest true sites by bytes (z: (est - true) / sigma, sigma = sqrt((N - 1) * sum of size^2)):"
  Bench.table(%w[program N run site bytes_est/true error z], worst)
  puts
  puts "The 10 sites with the most live objects (sigma = sqrt((N - 1) n) for n live objects, relative; " \
    "expected samples n/N; tail: the smaller tail probability of the estimate under the sampling model):"
  Bench.table(%w[program N run site true est error sigma z samples tail], per_site)
  puts
  puts "Our top 10 by live objects against the true top 10 (the model's median and worst of the simulated profiles); " \
    "the 10 sites' sum; live objects at sites of line 0 (C extensions' Init; see bench/lib/real_programs.rb):"
  Bench.table(["program", "N", "run", "true top 10 found", "model expects", "top 10 est / true", "line-0 truth", "samples / thinnings"], found)
end
