# frozen_string_literal: true

# The demo (`bin/demo`, `rake demo`): the leak hunt README's quick start describes, on
# examples/leaky_app.rb (a small service whose cache never evicts), in one process.
#
# Two recorders watch the same run. The hunt's is the process-wide one with the :leak_hunt preset
# (the countdown sampler at 1 in 128, no overhead budget, a full GC and retainer paths in its
# profile): enough samples that the leak comes out on top with a ± well clear of zero on every
# run. Beside it, a recorder at the gem's defaults (the windowed sampler at 1 in 4096 under the 1%
# budget, what a production service runs) shows what the defaults would have seen of the same
# requests: a handful of samples, often a rough row.
#
# Writes DIR/heap.pb.gz (the hunt, with retainer paths) and DIR/heap-defaults.pb.gz (the defaults,
# after the same full GC), then prints what `datadog-heap report` and `datadog-heap why` print for
# the first, and one line of what the second saw of the leak.
#
#   bin/demo [REQUESTS] [--out DIR]   REQUESTS: 15000 unless given; DIR: tmp/demo in the checkout
require "datadog_heap"
require "datadog_heap/cli"
require "fileutils"
require "objspace"
require "optparse"
require "pathname"
require_relative "leaky_app"

module Demo
  ROOT = File.expand_path("..", __dir__)
  # The leak's site: what `datadog-heap report` names it by (Profile::Site#function).
  LEAK_FUNCTION = "LeakyCache#remember"

  module_function

  # [requests, out_dir] from the command line; a bad argument ends the demo with a message
  # naming it.
  def parse_args(argv)
    out = File.join(ROOT, "tmp", "demo")
    parser = OptionParser.new do |p|
      p.banner = "Usage: bin/demo [REQUESTS] [--out DIR]"
      p.on("--out DIR", "where the two profiles go (default: tmp/demo in the checkout)") { |dir| out = dir }
    end
    rest = parser.parse(argv)
    abort "demo: expected at most one argument, REQUESTS; got #{rest.inspect}" if rest.size > 1
    arg = rest.fetch(0, LeakyApp::DEFAULT_REQUESTS.to_s)
    requests = Integer(arg, 10, exception: false)
    abort "demo: REQUESTS must be a whole number >= 1, got #{arg.inspect}" unless requests&.positive?
    abort "demo: --out must not be empty" if out.empty?
    [requests, File.expand_path(out)]
  rescue OptionParser::ParseError => e
    abort "demo: #{e.message}\n#{parser.banner}"
  end

  # `path` relative to the current directory when it is under it (as a user would type it).
  def shown(path)
    relative = Pathname.new(path).relative_path_from(Pathname.new(Dir.pwd)).to_s
    relative.start_with?("..") ? path : relative
  end

  # The sites of `profile` in the order `datadog-heap report` lists them: the most live bytes
  # first, rows on fewer than 5 samples (rough) after the measured ones.
  def report_order(profile)
    rough, measured = profile.top(2**62 - 1).partition(&:rough?)
    measured + rough
  end

  # One line: what the recorder at the defaults saw of the leak.
  def defaults_line(recorder, profile, truth_objects)
    stats = recorder.stats
    sites = report_order(profile)
    rank = sites.index { |s| s.function == LEAK_FUNCTION }
    interval = stats[:sampler_effective_sample_every] || recorder.sample_every
    seen = "The defaults (#{recorder.sampler} sampler, 1 in #{interval}" \
      "#{recorder.max_overhead ? ", #{(recorder.max_overhead * 100).round}% budget" : ""}), same run: " \
      "#{stats[:sampler_samples_taken]} samples in all"
    return "#{seen}; none of the leak (#{truth_objects} objects) was sampled, and the profile lists #{sites.size} sites." unless rank

    leak = sites[rank]
    "#{seen}; the leak: #{leak.rough? ? "~" : ""}#{leak.live_objects} objects " \
      "± #{leak.objects_stddev.round} on #{leak.samples} #{leak.samples == 1 ? "sample" : "samples"}" \
      "#{leak.rough? ? " (rough)" : ""}, row #{rank + 1} of #{sites.size}."
  end

  def run(argv)
    requests, out_dir = parse_args(argv)
    puts "datadog_heap #{DatadogHeap::VERSION} (native #{DatadogHeap._native_version}) on ruby #{RUBY_VERSION}"
    $stdout.flush
    hunt = DatadogHeap.start(preset: :leak_hunt) # prints the preset's one line (stderr)
    defaults = DatadogHeap::Recorder.new
    defaults.start

    started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    # Progress: one line per step into a file or pipe; on a terminal, one line rewritten in place.
    progress_end = $stdout.tty? ? "\r" : "\n"
    LeakyApp.serve(requests) do |served|
      print "requests: #{served}#{progress_end}" if (served % 5_000).zero?
    end
    DatadogHeap.stop
    defaults.stop
    elapsed = Process.clock_gettime(Process::CLOCK_MONOTONIC) - started
    puts if $stdout.tty?

    FileUtils.mkdir_p(out_dir)
    hunt_path = File.join(out_dir, "heap.pb.gz")
    defaults_path = File.join(out_dir, "heap-defaults.pb.gz")
    DatadogHeap.write_profile(hunt_path) # the preset: a full GC first, and retainer paths
    defaults.write_profile(defaults_path, gc: true) # the same GC, so only the sampling differs

    truth_objects = LeakyApp::CACHE.size
    truth_bytes = 0
    LeakyApp::CACHE.each_value { |s| truth_bytes += ObjectSpace.memsize_of(s) }
    stats = hunt.stats
    puts format("served %d requests in %.2fs; the leak: %d Strings (%s) in LeakyApp::CACHE, never evicted",
      requests, elapsed, truth_objects, DatadogHeap::CLI::Bytes.human_bytes(truth_bytes))
    puts "the hunt (preset :leak_hunt): #{stats[:sampler_allocations_seen]} allocations seen, " \
      "#{stats[:sampler_samples_taken]} sampled (1 in #{hunt.sample_every})"
    puts "wrote #{shown(hunt_path)} (the hunt) and #{shown(defaults_path)} (the defaults)"

    [["report", shown(hunt_path), "--top", "5"], ["why", shown(hunt_path), "--top", "2"]].each do |args|
      puts
      puts "$ datadog-heap #{args.join(" ")}"
      $stdout.flush
      DatadogHeap::CLI.new.run(args)
    end
    puts
    puts defaults_line(defaults, DatadogHeap::Profile.load(defaults_path), truth_objects)
  end
end

Demo.run(ARGV) if $PROGRAM_NAME == __FILE__
