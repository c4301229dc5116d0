# frozen_string_literal: true

# Real programs nobody here wrote, run in-process against exact truth: shared by
# bench/real_programs.rb and spec/real_programs_spec.rb (issues 23 and 27).
#
# A program runs in a forked child with ObjectSpace.trace_object_allocations and a recorder both
# started before it is even required. When it is done the recorder stops, a GC runs, the recorder
# writes its profile, and the truth is walked: every live object the trace saw allocated, counted
# (and memsize_of summed) by allocation file:line. Both sides are keyed the same way:
# - the profile's site of a sample is its innermost frame's file:line, as the recorder wrote it:
#   a C method's frame carries the location of the nearest Ruby frame below it that has a line
#   (CapturedStack::location in ext/datadog_heap/src/sampler/capture.rs), and a Ruby frame with
#   no line (a C extension's Init, the block of a /.../o regexp) the same;
# - the trace's site is allocation_sourcefile:allocation_sourceline, which Ruby takes from the
#   nearest Ruby-level frame (rb_vm_get_ruby_level_next_cfp in vm_trace.c): for a C method, its
#   Ruby caller's file and current line, as ours. The two rules differ only where that Ruby frame
#   has line 0, which in practice is a C extension's Init (its frame is a Ruby frame named after
#   the .so, line 0): the trace says "socket.so:0", the profile the line that required it. Here
#   such a sample is keyed "socket.so:0" too (its innermost frame's name is the .so's path), so
#   both sides follow the trace's rule; `init_frame?` says which frames.
# <internal:...> frames (Kernel#tap, #then, #clone in 3.1) are sites on both sides here; only
# Profile#top goes on to skip them, which this comparison does not use.
# Allocations by the harness itself and by lib/ (the profile reader) are left out of both sides.
require "fileutils"
require "rbconfig"
require "objspace"

module RealPrograms
  STDLIB = RbConfig::CONFIG["rubylibdir"]
  ROOT = File.expand_path("../..", __dir__)
  EXCLUDED = [File.expand_path(__FILE__), File.join(ROOT, "bench"), File.join(ROOT, "spec"), File.join(ROOT, "lib")].freeze

  module_function

  # A jekyll site: layouts, an index listing every post, `posts` posts with front matter, Markdown
  # (headings, lists, code, links, a table) and Liquid.
  def write_site(dir, posts)
    FileUtils.mkdir_p(%w[_layouts _posts _includes].map { |d| File.join(dir, d) })
    File.write(File.join(dir, "_config.yml"), "title: Bench\nmarkdown: kramdown\npermalink: /:year/:month/:title/\n")
    File.write(File.join(dir, "_includes", "footer.html"), "<footer>{{ site.title }} {{ page.date | date: \"%Y\" }}</footer>\n")
    File.write(File.join(dir, "_layouts", "default.html"), <<~HTML)
      <html><head><title>{{ page.title }} - {{ site.title }}</title></head>
      <body>{{ content }}{% include footer.html %}</body></html>
    HTML
    File.write(File.join(dir, "_layouts", "post.html"), <<~HTML)
      ---
      layout: default
      ---
      <article><h1>{{ page.title }}</h1><p>{{ page.date | date_to_string }} {% for t in page.tags %}<a href="/tags/{{ t }}">{{ t }}</a> {% endfor %}</p>
      {{ content }}</article>
      {% if page.previous %}<a href="{{ page.previous.url }}">{{ page.previous.title }}</a>{% endif %}
    HTML
    File.write(File.join(dir, "index.html"), <<~HTML)
      ---
      layout: default
      ---
      <ul>{% for post in site.posts %}<li><a href="{{ post.url }}">{{ post.title }}</a> {{ post.excerpt | strip_html | truncatewords: 20 }}</li>{% endfor %}</ul>
    HTML
    posts.times do |i|
      date = Time.utc(2020, 1, 1) + i * 86_400
      body = (1..6).map do |p|
        <<~MD
          ## Section #{p} of post #{i}

          Lorem ipsum dolor sit amet, *consectetur* adipiscing elit, sed do **eiusmod** tempor #{i * p}
          incididunt ut labore et dolore magna aliqua. See [the index](/) and `code_#{p}`.

          - item one #{p}
          - item two with {{ page.title | upcase }}

          ```ruby
          def method_#{p}(x) = x * #{p}
          ```

          | a | b |
          |---|---|
          | #{i} | #{p} |
        MD
      end.join("\n")
      File.write(File.join(dir, "_posts", "#{date.strftime("%Y-%m-%d")}-post-#{i}.md"), <<~MD)
        ---
        layout: post
        title: "Post number #{i}"
        tags: [t#{i % 7}, t#{i % 11}]
        ---
        #{body}
      MD
    end
  end

  def installed?(name)
    Gem::Specification.find_all_by_name(name).any? || $LOAD_PATH.any? { |d| File.exist?(File.join(d, "#{name}.rb")) }
  end

  # name => {describe:, setup: ->(dir), run: ->(dir)}: a jekyll build of `posts` posts, and
  # rubocop over the stdlib folders `rubocop_dirs` (names under rubylibdir).
  def programs(posts:, rubocop_dirs:)
    dirs = rubocop_dirs.map { |d| File.join(STDLIB, d) }
    {
      "jekyll" => {
        describe: "jekyll build, #{posts} posts",
        setup: ->(dir) { write_site(File.join(dir, "site"), posts) },
        run: lambda do |dir|
          require "jekyll"
          # A cold build every time: a build reads the disk cache (.jekyll-cache) the one before
          # wrote, and keeps 40% fewer live objects at the end.
          FileUtils.rm_rf(File.join(dir, "site", ".jekyll-cache"))
          config = Jekyll.configuration("source" => File.join(dir, "site"), "destination" => File.join(dir, "_site"), "quiet" => true)
          Jekyll::Site.new(config).tap(&:process)
        end
      },
      "rubocop" => {
        describe: "rubocop over #{rubocop_dirs.map { |d| "#{d}/" }.join(", ")}",
        setup: ->(_dir) {},
        run: lambda do |dir|
          require "rubocop"
          args = ["--cache", "false", "--format", "progress", "--out", File.join(dir, "rubocop.out"), *dirs]
          Dir.chdir(dir) { RuboCop::CLI.new.run(args) }
        end
      }
    }
  end

  # The recorder's stats a comparison reports: what it sampled, and every way a sample can be lost.
  STATS = %i[sampler_samples_taken sampler_samples_recorded sampler_skipped_internal sampler_skipped_reentrant
    sampler_skipped_by_recorder sampler_effective_sample_every lifetime_thinnings thinning
    lifetime_recordings_skipped_max_tracked lifetime_recordings_skipped_thinned lifetime_deferred_recordings_skipped_buffer_full
    lifetime_recordings_skipped_locked lifetime_recordings_failed lifetime_skipped_objects_dropped num_object_records].freeze

  EXCLUDED_PATHS = Hash.new { |h, path| h[path] = EXCLUDED.any? { |e| File.expand_path(path).start_with?(e) } }

  def excluded?(path)
    path.nil? || EXCLUDED_PATHS[path]
  end

  # In the child: runs `program` under the trace and a recorder at exactly `sample_every`
  # (max_overhead: nil, so the overhead budget never raises the interval; with
  # REAL_PROGRAMS_AS_USER=1 the recorder is made as a user would, `Recorder.new(sample_every: n)`,
  # which must come to the same); returns
  # {est:, truth:, stats:, seconds:}. est: "file:line" => [objects, bytes] from the profile's
  # samples; truth: "file:line" => [objects, bytes, sum of squared bytes].
  def measure(program, sample_every, dir)
    ObjectSpace.trace_object_allocations_start
    # Read by Recorder.new, so set before it.
    if (mean = ENV["REAL_PROGRAMS_WINDOW_MEAN"])
      DatadogHeap::Testing._native_set_window_sample_every(Integer(mean, 10))
    end
    rec = if sample_every == :defaults
      DatadogHeap::Recorder.new
    elsif ENV["REAL_PROGRAMS_AS_USER"] == "1"
      windows = ENV["REAL_PROGRAMS_WINDOWS"]&.then { |w| {windows_per_second: Float(w)} } || {}
      DatadogHeap::Recorder.new(sample_every: sample_every, **windows)
    else
      DatadogHeap::Recorder.new(sampler: :countdown, sample_every: sample_every, max_overhead: nil)
    end
    rec.start
    started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    $real_programs_kept = program[:run].call(dir)
    seconds = Process.clock_gettime(Process::CLOCK_MONOTONIC) - started
    rec.stop
    GC.start
    profile = DatadogHeap::Profile.parse(rec.profile)
    stats = rec.stats

    est = Hash.new { |h, k| h[k] = [0, 0] }
    profile.samples.each do |sample|
      name, path, line = sample.locations.first
      next if excluded?(path)

      e = est[init_frame?(name) ? "#{name}:0" : "#{path}:#{line}"]
      e[0] += sample.objects
      e[1] += sample.bytes || 0
    end

    truth = Hash.new { |h, k| h[k] = [0, 0, 0] }
    ObjectSpace.each_object do |o|
      file = ObjectSpace.allocation_sourcefile(o)
      next if excluded?(file)

      size = ObjectSpace.memsize_of(o)
      t = truth["#{file}:#{ObjectSpace.allocation_sourceline(o)}"]
      t[0] += 1
      t[1] += size
      t[2] += size * size
    end
    ObjectSpace.trace_object_allocations_stop
    # At the defaults the interval is the budget's: the one in force at the end stands for it.
    sample_every = stats[:sampler_effective_sample_every] if sample_every == :defaults
    {seconds: seconds, est: est.to_a.to_h, truth: truth.to_a.to_h, sample_every: sample_every,
     stats: stats.slice(*STATS)}
  end

  # Runs `block` in a forked child and returns what it returned (Marshal through a pipe).
  def in_child(&block)
    reader, writer = IO.pipe
    pid = fork do
      reader.close
      writer.binmode.write(Marshal.dump(block.call))
      writer.close
      exit!(0)
    end
    writer.close
    data = reader.binmode.read
    Process.wait(pid)
    raise "child failed (#{$?.inspect})" if data.empty?

    Marshal.load(data)
  end

  DLEXT = ".#{RbConfig::CONFIG.fetch("DLEXT")}"

  # Whether a profile frame is the frame a C extension's Init runs in (named after the extension's
  # path; see above).
  def init_frame?(name)
    name.start_with?("/") && name.end_with?(DLEXT)
  end

  def top(hash, n, index = 0)
    hash.sort_by { |loc, v| [-v[index], loc] }.first(n).map(&:first)
  end
end

# The sampling model the tolerances come from, and the comparison of one run.
#
# The countdown samples each allocation with probability 1/m (m = sample_every: geometric
# intervals, a coin tossed at every allocation) and weighs every sample m. So a site with n live
# objects gets K ~ Poisson(n/m) samples (n/m is its expected sample count, and the binomial it
# truly is differs little) and is estimated at m K: mean n, variance about (m - 1) n, relative
# sigma about sqrt(1/(n/m)). Until 2026-12-06 a sample weighed the interval that ended at it, an
# exponential of mean m, which doubled that variance; this model then summed K exponentials.
module RealPrograms
  module_function

  def sigma(n, m)
    Math.sqrt((m - 1).to_f * n)
  end

  # log of the Poisson(lam) probability of k.
  def log_poisson(k, lam)
    return (k.zero? ? 0.0 : -Float::INFINITY) if lam <= 0

    -lam + k * Math.log(lam) - Math.lgamma(k + 1).first
  end

  # [P(S <= x), P(S >= x)] for S = m K, K ~ Poisson(n/m): how far in either tail an estimate x of
  # a site with n live objects is. Exact for the model (no normal approximation: a site with a few
  # expected samples has a long upper tail).
  def tails(x, n, m)
    lam = n.to_f / m
    return [1.0, 1.0] if lam <= 0 && x <= 0
    return [1.0, 0.0] if lam <= 0

    below = (x.to_f / m).floor # P(S <= x) = P(K <= below)
    above = (x.to_f / m).ceil # P(S >= x) = P(K >= above)
    cdf = ->(k) { k.negative? ? 0.0 : (0..k).sum { |i| Math.exp(log_poisson(i, lam)) }.clamp(0.0, 1.0) }
    [cdf.call(below), (1.0 - cdf.call(above - 1)).clamp(0.0, 1.0)]
  end

  # The top-10 overlap the model expects: `draws` simulated profiles of the true sites (each
  # site's estimate drawn as above), and how many of the true top `n` each one's top `n` holds.
  # Sorted, smallest first.
  def simulated_overlaps(truth, m, n: 10, draws: 2000, seed: 23)
    rng = Random.new(seed)
    sites = truth.keys.sort
    counts = sites.map { |k| truth[k][0] }
    owner = counts.each_with_index.flat_map { |c, i| [i] * c } # one entry per live object
    true_top = top(truth, n).map { |k| sites.bsearch_index { |s| s >= k } }
    lam = owner.size.to_f / m
    Array.new(draws) do
      est = Hash.new(0.0)
      poisson(rng, lam).times { est[owner[rng.rand(owner.size)]] += m }
      ours = est.max_by(n) { |i, e| [e, -i] }.map(&:first)
      (ours & true_top).size
    end.sort
  end

  # A Poisson(lam) draw: the normal approximation for large lam, Knuth's product otherwise.
  def poisson(rng, lam)
    if lam > 60
      z = Math.sqrt(-2 * Math.log(1.0 - rng.rand)) * Math.cos(2 * Math::PI * rng.rand)
      return [(lam + Math.sqrt(lam) * z).round, 0].max
    end
    limit = Math.exp(-lam)
    k = 0
    p = rng.rand
    while p > limit
      k += 1
      p *= rng.rand
    end
    k
  end

  # The comparison of one run: per true top-10 site (by live objects) its truth, estimate,
  # expected samples, relative error, z and tail probabilities; the top-10 overlap and what the
  # model expects of it; totals. `result` is what `measure` returned.
  def compare(result, n: 10, draws: 2000)
    m = result[:sample_every]
    est, truth = result[:est], result[:truth]
    sites = top(truth, n).map do |loc|
      t = truth[loc][0]
      e = est.fetch(loc, [0])[0]
      low, high = tails(e, t, m)
      {location: loc, truth: t, estimate: e, expected_samples: t.to_f / m, error: (e - t).to_f / t,
       relative_sigma: sigma(t, m) / t, z: (e - t) / sigma(t, m), p_low: low, p_high: high}
    end
    overlaps = simulated_overlaps(truth, m, n: n, draws: draws)
    sum = ->(h, locs = h.keys) { locs.sum { |k| h.fetch(k, [0])[0] } }
    top_locs = sites.map { |s| s[:location] }
    totals = {all: [sum.call(est), sum.call(truth)], top: [sum.call(est, top_locs), sum.call(truth, top_locs)]}
    {sample_every: m, sites: sites, found: (top(est, n) & top_locs).size, overlaps: overlaps,
     overlap_median: overlaps[overlaps.size / 2], overlap_min: overlaps.first, totals: totals,
     totals_tails: totals.transform_values { |(e, t)| tails(e, t, m) },
     line0: truth.select { |loc, _| loc.end_with?(":0") }.sum { |_, v| v[0] }}
  end

  def short(location)
    location.sub(%r{\A.*/(gems|vendor_ruby|ruby)/}, "").sub(%r{\A<internal:.*/}, "<internal:")
  end
end
