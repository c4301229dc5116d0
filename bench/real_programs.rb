# frozen_string_literal: true

# Live objects and live bytes of real programs nobody here wrote, against exact truth (issue 27).
#
# Each program runs in-process in a forked child, with ObjectSpace.trace_object_allocations and a
# recorder both started before the program is even required. When it is done: the recorder stops,
# a GC runs, the recorder writes its profile (a full update: sizes as memsize_of says now), then the
# truth is walked: every live object the trace saw allocated, memsize_of each, summed by allocation
# file:line. Printed: estimated / true live objects and bytes, and how many of the 10 true
# heaviest sites (by bytes, by objects) are in the profile's 10 heaviest. The profile's sites are
# its samples' innermost frames, file:line, which is where the trace attributes allocations too.
# Allocations by this file and by lib/ (the profile reader) are left out of both sides.
#
# Programs (Debian packages; a missing one is skipped with a message):
# - jekyll: `jekyll build` of a generated 300-post site (apt-get install jekyll);
# - rubocop: rubocop over three stdlib folders, net/, uri/ and csv/ (apt-get install rubocop).
# BENCH_SMOKE=1: 15 posts, one small folder, sample_every 64 only.
#
# Run: rake bench:real_programs (or ruby -Ilib bench/real_programs.rb; BENCH_SMOKE=1 for a quick run)
require_relative "support"
require "fileutils"
require "tmpdir"

SAMPLE_EVERYS = Bench.pick([64, 1024], [64])
POSTS = Bench.pick(300, 15)
STDLIB = RbConfig::CONFIG["rubylibdir"]
RUBOCOP_DIRS = Bench.pick(%w[net uri csv], %w[optparse]).map { |d| File.join(STDLIB, d) }
EXCLUDED = [File.expand_path(__FILE__), File.expand_path("support.rb", __dir__), File.expand_path("../lib", __dir__)].freeze

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

PROGRAMS = {
  "jekyll" => {
    available: -> { Gem::Specification.find_all_by_name("jekyll").any? || $LOAD_PATH.any? { |d| File.exist?(File.join(d, "jekyll.rb")) } },
    describe: "jekyll build of a #{POSTS}-post site",
    setup: ->(dir) { write_site(File.join(dir, "site"), POSTS) },
    run: lambda do |dir|
      require "jekyll"
      site = File.join(dir, "site")
      config = Jekyll.configuration("source" => site, "destination" => File.join(dir, "_site"), "quiet" => true)
      Jekyll::Site.new(config).tap(&:process)
    end
  },
  "rubocop" => {
    available: -> { Gem::Specification.find_all_by_name("rubocop").any? || $LOAD_PATH.any? { |d| File.exist?(File.join(d, "rubocop.rb")) } },
    describe: "rubocop over #{RUBOCOP_DIRS.map { |d| File.basename(d) + "/" }.join(", ")}",
    setup: ->(_dir) {},
    run: lambda do |dir|
      require "rubocop"
      args = ["--cache", "false", "--format", "progress", "--out", File.join(dir, "rubocop.out"), *RUBOCOP_DIRS]
      Dir.chdir(dir) { RuboCop::CLI.new.run(args) }
    end
  }
}.freeze

EXCLUDED_PATHS = Hash.new { |h, path| h[path] = EXCLUDED.any? { |e| File.expand_path(path).start_with?(e) } }

def excluded?(path)
  path.nil? || EXCLUDED_PATHS[path]
end

# In the child: runs the program under the trace and the recorder; returns the comparison.
def measure(program, sample_every, dir)
  ObjectSpace.trace_object_allocations_start
  rec = DatadogHeap::Recorder.new(sample_every: sample_every)
  rec.start
  seconds = Bench.time { $kept = program[:run].call(dir) }
  rec.stop
  GC.start
  profile_seconds = Bench.time { $profile = DatadogHeap::Profile.parse(rec.profile) }

  # By the innermost frame as recorded (a C method's frame has its caller's location), which is
  # where the trace puts an allocation too (Profile#top would also skip <internal:...> frames).
  est = Hash.new { |h, k| h[k] = [0, 0] } # location => [objects, bytes]
  $profile.samples.each do |sample|
    _, path, line = sample.locations.first
    next if excluded?(path)

    est["#{path}:#{line}"][0] += sample.objects
    est["#{path}:#{line}"][1] += sample.bytes
  end

  truth = Hash.new { |h, k| h[k] = [0, 0, 0] } # location => [objects, bytes, sum of squared bytes]
  ObjectSpace.each_object do |o|
    file = ObjectSpace.allocation_sourcefile(o)
    next if excluded?(file)

    size = ObjectSpace.memsize_of(o)
    t = truth["#{file}:#{ObjectSpace.allocation_sourceline(o)}"]
    t[0] += 1
    t[1] += size
    t[2] += size * size
  end
  {seconds: seconds, profile_seconds: profile_seconds, est: est.to_a.to_h, truth: truth.to_a.to_h}
end

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

def top10(hash, index)
  hash.sort_by { |_, v| -v[index] }.first(10).map(&:first)
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
    "top-10: how many of the 10 heaviest true sites are in the profile's 10 heaviest (by bytes, by objects)"])

rows = []
worst = []
PROGRAMS.each do |name, program|
  unless program[:available].call
    puts "#{name}: skipped, not installed (apt-get install #{name})"
    next
  end
  Dir.mktmpdir("datadog_heap_real") do |dir|
    program[:setup].call(dir)
    SAMPLE_EVERYS.each do |sample_every|
      r = in_child { measure(program, sample_every, dir) }
      est, truth = r[:est], r[:truth]
      sum = ->(h, i) { h.values.sum { |v| v[i] } }
      objects_est, objects_true, bytes_est, bytes_true = sum.call(est, 0), sum.call(truth, 0), sum.call(est, 1), sum.call(truth, 1)
      # Sampling error of the totals: a sample stands for N allocations, so the variance is about
      # (N - 1) times the objects' count (for objects) or their sum of squared sizes (for bytes).
      z = ->(e, t, squares) { format("%+.1f", (e - t) / Math.sqrt((sample_every - 1) * squares)) }
      rows << [program[:describe], sample_every,
        "#{objects_est} / #{objects_true} (#{signed_percent(objects_est, objects_true)}, z #{z.call(objects_est, objects_true, objects_true)})",
        "#{mega(bytes_est)} / #{mega(bytes_true)} (#{signed_percent(bytes_est, bytes_true)}, z #{z.call(bytes_est, bytes_true, sum.call(truth, 2))})",
        "#{(top10(truth, 1) & top10(est, 1)).size} of 10", "#{(top10(truth, 0) & top10(est, 0)).size} of 10",
        format("%.1f s", r[:seconds])]
      top10(truth, 1).each do |loc|
        t = truth[loc]
        e = est.fetch(loc, [0, 0])
        sigma = Math.sqrt((sample_every - 1) * t[2])
        worst << [name, sample_every, loc.sub(%r{\A.*/(gems|vendor_ruby|ruby)/}, ""), "#{e[1]} / #{t[1]}",
          signed_percent(e[1], t[1]), sigma.zero? ? "n/a" : format("%+.1f", (e[1] - t[1]) / sigma)]
      end
    end
  end
end

unless rows.empty?
  Bench.table(["program", "sample_every", "live objects est / true", "live bytes est / true",
    "top-10 by bytes", "top-10 by objects", "run time"], rows)
  puts
  puts "The 10 heaviest true sites by bytes (z: (est - true) / sigma, sigma = sqrt((N - 1) * sum of size^2)):"
  Bench.table(%w[program N site bytes_est/true error z], worst)
end
