# frozen_string_literal: true

# Each sampler against the exact truth on synthetic programs (bench/lib/truth_cases.rb): one
# Marshal.load that builds 100,001 kept objects, a JSON.parse of 50,000 Hashes, a burst of a few
# milliseconds between idle stretches, three phases of 20 / 80 / 300 ms. The truth comes from
# Ruby's own allocation tracing, once per case; every estimate from a fresh process (a forked
# child that loads the gem first with CHILD=1), RUNS runs per sampler.
#
#   ruby -Ilib bench/sampler_truth.rb                       # both samplers, 20 runs, parent
#   RUNS=5 CHILD=1 SAMPLERS=windowed ruby -Ilib bench/sampler_truth.rb
#
# Samplers: `windowed` and `countdown`; SAMPLE_EVERY (default 1024; `default` for the recorder's
# own, the budget included) applies to each. A sampler written `windowed@DIR` loads the gem from
# DIR (another build's lib/, to compare two builds in one run); CASES=burst,threads picks cases.
# Per case and site with at least 25 expected samples it prints the truth, the mean estimate and
# its standard error over the runs (bias z = (mean - truth) / se), each run's error against the
# countdown's sigma sqrt(truth * sample_every) (runs within 3.5 of it) and against the run's own
# reported sigma (runs within 3), and how many runs read 0.
require_relative "support"
require_relative "lib/truth_cases"
require "rbconfig"

module SamplerTruth
  module_function

  SITE_MIN_SAMPLES = 25

  def samplers
    (ENV["SAMPLERS"] || "windowed,countdown").split(",")
  end

  def case_names
    ENV["CASES"] ? ENV["CASES"].split(",") & TruthCases.names : TruthCases.names
  end

  def runs
    Integer(ENV.fetch("RUNS", Bench.pick(20, 2)))
  end

  def sample_every
    ENV["SAMPLE_EVERY"] == "default" ? nil : Integer(ENV.fetch("SAMPLE_EVERY", "1024"))
  end

  # At SAMPLE_EVERY=default nothing but the sampler is given, so the overhead budget is on, as a
  # user gets it; otherwise the interval is exactly the one given.
  def options_for(sampler)
    opts = sample_every ? {sample_every: sample_every, max_overhead: nil} : {}
    case sampler.split("@").first
    when "countdown" then opts.merge(sampler: :countdown)
    else opts.merge(sampler: :windowed)
    end
  end

  # In this (fresh) process: one run of every case; prints JSON.
  def one_run(sampler)
    require "datadog_heap"
    out = case_names.to_h do |name|
      estimates, stats, rows = TruthCases.estimate(name, options_for(sampler))
      [name, {estimates: estimates, rows: rows, sample_every: stats[:sampler_effective_sample_every],
              stats: stats.slice(:sampler_windows_opened, :sampler_window_allocations, :sampler_window_armed_allocations,
                :sampler_window_late_allocations, :sampler_windows_spanned, :sampler_window_wakeups, :sampler_samples_recorded)}]
    end
    JSON.generate(out)
  end

  def child_run(sampler)
    reader, writer = IO.pipe
    pid = fork do
      reader.close
      writer.write(one_run(sampler))
      writer.close
      exit!(0)
    end
    writer.close
    out = reader.read
    Process.wait(pid)
    out
  end

  # `lib`: the gem's lib/ directory to load (this checkout's when nil).
  def ruby_cmd(*args, lib: nil)
    [RbConfig.ruby, "-I", lib || File.expand_path("../lib", __dir__), __FILE__, *args]
  end

  def spawn_json(*args, lib: nil)
    out = IO.popen(ruby_cmd(*args, lib: lib), &:read)
    raise "run failed: #{args.join(" ")}" unless $?.success?
    JSON.parse(out)
  end

  def truth
    spawn_json("--truth")
  end

  def main
    truth = self.truth
    per = Hash.new { |h, k| h[k] = [] }
    # Alternated run by run, so the machine's load falls on every sampler alike.
    runs.times do
      samplers.each { |s| per[s] << spawn_json("--run", s, ENV["CHILD"] == "1" ? "child" : "parent", lib: s.split("@")[1]) }
    end
    puts "Ruby #{RUBY_VERSION}, #{runs} runs per sampler, sample_every #{sample_every || "default"}, " \
         "#{ENV["CHILD"] == "1" ? "gem first loaded in a forked child" : "parent"}"
    case_names.each { |name| report(name, truth[name], per) }
  end

  def report(name, truth, per)
    puts "\n## #{name}"
    puts format("%-11s %-22s %8s %9s %8s %7s %12s %12s %5s", "sampler", "site", "truth", "mean", "se", "bias z",
      "in 3.5 cd-sd", "in 3 own-sd", "zero")
    samplers.each do |sampler|
      results = per[sampler].map { |r| r[name] }
      every = results.map { |r| r["sample_every"] }.max
      sites = truth.select { |_, n| n.to_f / every >= SITE_MIN_SAMPLES }.sort_by { |_, n| -n }
      sites += [["(all sites)", truth.values.sum]]
      sites.each do |site, count|
        ests = results.map { |r| site == "(all sites)" ? r["estimates"].values.sum : r["estimates"].fetch(site, 0) }
        mean = ests.sum.to_f / ests.size
        sd = Math.sqrt(ests.sum { |e| (e - mean)**2 } / [ests.size - 1, 1].max)
        se = sd / Math.sqrt(ests.size)
        cd_sigma = Math.sqrt(count * every)
        within = ests.count { |e| (e - count).abs <= 3.5 * cd_sigma }
        z = se.zero? ? (mean == count ? 0.0 : Float::INFINITY) : (mean - count) / se
        # The row the profile prints for this site, in each run that has one: its error within 3
        # of its own ±?
        own = results.filter_map { |r| row_of(r["rows"], site) }
        honest = own.count { |objects, sd| (objects - count).abs <= 3 * sd.to_f }
        puts format("%-11s %-22s %8d %9.0f %8.0f %7.2f %6d of %2d %6d of %2d %5d", label(sampler), short(site), count, mean, se, z,
          within, ests.size, honest, own.size, ests.count(&:zero?))
      end
      stats = results.map { |r| r["stats"] }
      next unless stats.first.key?("sampler_window_late_allocations") && !sampler.start_with?("countdown")
      late = stats.sum { |s| s["sampler_window_late_allocations"].to_i }
      watched = stats.sum { |s| s["sampler_window_allocations"] }
      armed = stats.sum { |s| s["sampler_window_armed_allocations"].to_i }
      puts format("%-10s windows %d, watched %d, armed %d, late %d, windows no check fell in %d, wake-ups %d (all runs)",
        label(sampler), stats.sum { |s| s["sampler_windows_opened"] }, watched, armed, late,
        stats.sum { |s| s["sampler_windows_spanned"].to_i }, stats.sum { |s| s["sampler_window_wakeups"].to_i })
    end
  end

  # A sampler's name in the table: `windowed@DIR` as `windowed@` and the name of DIR's parent.
  def label(sampler)
    name, lib = sampler.split("@", 2)
    lib ? "#{name}@#{File.basename(File.dirname(lib))}" : name
  end

  # The profile's row (objects, stddev) for a truth site, by file name and line.
  def row_of(rows, site)
    return nil if site == "(all sites)"
    key = short(site)
    rows.find { |location, _| short(location) == key }&.last
  end

  def short(site)
    path, line = site.rpartition(":").values_at(0, 2)
    "#{File.basename(path)}:#{line}"[-22..] || "#{File.basename(path)}:#{line}"
  end
end

case ARGV[0]
when "--truth"
  puts JSON.generate(SamplerTruth.case_names.to_h { |name| [name, TruthCases.truth(name).select { |_, n| n >= 100 }] })
when "--run"
  puts(ARGV[2] == "child" ? SamplerTruth.child_run(ARGV[1]) : SamplerTruth.one_run(ARGV[1]))
else
  SamplerTruth.main
end
