# frozen_string_literal: true

require "stringio"

# Helpers shared by the recorder specs.
module RecorderHelpers
  # What GC_STRESS asks GC.stress to be (see spec_helper.rb), or nil.
  GC_STRESS_SETTING = {"1" => true, "minor" => 0x01}[ENV["GC_STRESS"]]
  GC_STRESSED = !GC_STRESS_SETTING.nil?
  # Once-per-process warnings whose presence depends on the Ruby or on the machine's load, not on
  # what a spec checks: the Ruby 3.1.2 compaction warning, and the overhead budget's note (the
  # default interval raised on a busy machine). Specs of a child's stderr drop these lines.
  INCIDENTAL_WARNINGS = /bug #19529|\Adatadog_heap: asked 1 in \d+ allocations/

  # A headless-capable Chromium on PATH (Debian's chromium; bin/setup --dev installs it), or nil:
  # the HTML specs render their pages in it.
  CHROMIUM = %w[chromium chromium-browser google-chrome].map do |name|
    ENV.fetch("PATH", "").split(File::PATH_SEPARATOR).map { |dir| File.join(dir, name) }.find { |p| File.executable?(p) }
  end.compact.first

  # `stderr` without INCIDENTAL_WARNINGS' lines.
  def self.without_incidental(stderr)
    stderr.lines.grep_v(INCIDENTAL_WARNINGS).join
  end

  # Loop sizes shrink under GC_STRESS, where every allocation runs a GC.
  def scaled(n)
    GC_STRESSED ? [n / 100, 20].max : n
  end

  LOCATIONS = [["Widget#build", "/app/widget.rb", 12], ["<main>", "/app/main.rb", 1]].freeze

  # A recorder whose recordings wait for an explicit commit, so specs decide when commits happen.
  # Runs `datadog-heap ARGS` in this process: [stdout, stderr, exit code].
  def cli_in_process(*args)
    out = StringIO.new
    err = StringIO.new
    code = DatadogHeap::CLI.new(out: out, err: err).run(args)
    [out.string, err.string, code]
  end

  def manual_recorder(**opts)
    DatadogHeap::Recorder.new(**opts).tap do |rec|
      DatadogHeap::Testing._native_set_postponed_commits(rec, false)
    end
  end

  def record(rec, obj, locations: LOCATIONS, weight: 1, class_name: obj.class.name)
    rec.record_allocation(obj, weight: weight, class_name: class_name, locations: locations)
  end

  def live_objects(rec)
    rec.each_live_object.to_a
  end

  # Several GCs, so that objects only reachable from dead frames are collected.
  def full_gc
    3.times { GC.start(full_mark: true, immediate_sweep: true) }
  end

  # Allocates in a fresh frame, so nothing the caller keeps on its stack points at the objects.
  def record_garbage(rec, count, **kw)
    count.times { record(rec, Object.new, **kw) }
    nil
  end
end

RSpec.configure do |config|
  config.include RecorderHelpers
  # Examples whose point needs large counts (statistics, 200k objects, their own GC.stress) are
  # too slow under GC_STRESS=1 and add nothing there; the normal run covers them.
  if RecorderHelpers::GC_STRESSED
    config.before(:each, :heavy) { skip "needs large counts; too slow under GC_STRESS=1 (covered by the normal run)" }
    config.before(:each, :exact_gc_counts) do
      skip "asserts exact GC counts (ages, GC-generation gating); GC.stress runs a GC per allocation"
    end
  end
  # On failure, show the recorder's state (when the example kept it in @rec).
  config.after do |example|
    if example.exception && defined?(@rec) && @rec
      records, state = @rec.debug
      warn "recorder.debug: #{records[1].size} records, first: #{records[1].first(5).inspect}\nstate: #{state[1].inspect}"
    end
  end
end
