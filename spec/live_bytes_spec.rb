# frozen_string_literal: true

require_relative "spec_helper"
require "open3"

# Live bytes in a profile against known truth: ObjectSpace.memsize_of of the very objects, summed
# at the time of the profile. Objects change size after allocation (filled, grown, appended to,
# cleared, given ivars, frozen), and young updates, which measure nothing, see them in between.
module LiveBytes
  # Like Parser::Source::Range: three ivars, frozen by its own initialize.
  class Range3
    def initialize(a, b, c)
      @a = a
      @b = b
      @c = c
      freeze
    end
  end

  # Subclasses, so that the sampled specimens have a class of their own in the profile: a plain
  # Array would also count the arrays that hold them.
  class Arr < Array; end

  class Hsh < Hash; end

  class Str < String; end

  # Ivars set after allocation, more than an embedded object holds.
  class Late
    def fill(n)
      n.times { |i| instance_variable_set(:"@v#{i}", i) }
      self
    end
  end
end

RSpec.describe "live bytes" do
  after { @rec&.stop }

  def bytes_by_class(rec)
    samples = DatadogHeap::Profile.parse(rec.profile).samples
    samples.each_with_object(Hash.new(0)) { |s, h| h[s.class_name] += s.bytes }
  end

  def memsize_sum(objects)
    objects.sum { |o| ObjectSpace.memsize_of(o) }
  end

  # The optional update the recorder runs by itself after a GC (at most every 2 s); it checks
  # liveness only and measures no size.
  def young_update(rec)
    GC.start
    DatadogHeap::Testing.reset_last_update!(rec)
    expect(rec.update_young_objects).to be(true)
  end

  # Every object recorded with weight 1: the profile's bytes must be the memsize_of sum exactly.
  # Committed every 100 (the pending queue holds 256).
  def record_all(rec, groups)
    groups.each do |name, objects|
      objects.each_slice(100) do |slice|
        slice.each { |o| expect(record(rec, o, class_name: name)).to be(true) }
        rec.commit
      end
    end
  end

  def expect_exact(rec, groups)
    got = bytes_by_class(rec)
    want = groups.to_h { |name, objects| [name, memsize_sum(objects)] }
    expect(got.slice(*want.keys)).to eq(want)
  end

  describe "every object recorded (exact truth)" do
    before { @rec = manual_recorder }

    it "measures objects already frozen when a young update first sees them" do
      n = scaled(300)
      groups = {
        "frozen object" => Array.new(n) { Object.new.freeze },
        "frozen string" => Array.new(n) { |i| ("s" * (100 + i)).freeze },
        "frozen range" => Array.new(n) { |i| LiveBytes::Range3.new(i, i + 1, "src") },
        "frozen hash" => Array.new(n) { |i| {a: i, b: i, c: i, d: i, e: i, f: i, g: i, h: i, i: i}.freeze }
      }
      record_all(@rec, groups)
      young_update(@rec)
      expect_exact(@rec, groups)
      expect(@rec.stats[:last_update_objects_frozen]).to eq(groups.values.sum(&:size))
    end

    it "follows objects that grow or shrink after the first measurement" do
      n = scaled(200)
      groups = {
        "hash filled" => Array.new(n) { {} },
        "array grown" => Array.new(n) { [] },
        "string appended" => Array.new(n) { +"" },
        "ivars set later" => Array.new(n) { LiveBytes::Late.new },
        "array cleared" => Array.new(n) { Array.new(100, 1) },
        "hash cleared" => Array.new(n) { (1..60).to_h { |i| [i, i] } }
      }
      record_all(@rec, groups)
      young_update(@rec)
      expect_exact(@rec, groups) # measured small (or large) once
      groups["hash filled"].each { |h| 50.times { |i| h[i] = i } }
      groups["array grown"].each { |a| 100.times { |i| a << i } }
      groups["string appended"].each { |s| 20.times { s << "abcdefghijklmnopqrstuvwxyz" } }
      groups["ivars set later"].each { |o| o.fill(20) }
      groups["array cleared"].each(&:clear)
      groups["hash cleared"].each(&:clear)
      young_update(@rec)
      expect_exact(@rec, groups)
    end

    it "re-measures objects grown and then frozen after a first measurement" do
      n = scaled(200)
      groups = {
        "hash filled, frozen" => Array.new(n) { {} },
        "string appended, frozen" => Array.new(n) { +"" },
        "array grown, frozen" => Array.new(n) { [] }
      }
      record_all(@rec, groups)
      young_update(@rec)
      expect_exact(@rec, groups)
      groups["hash filled, frozen"].each { |h| 50.times { |i| h[i] = i }.then { h.freeze } }
      groups["string appended, frozen"].each { |s| 20.times { s << "abcdefghijklmnopqrstuvwxyz" }.then { s.freeze } }
      groups["array grown, frozen"].each { |a| 100.times { |i| a << i }.then { a.freeze } }
      young_update(@rec) # sees them frozen, measures nothing
      expect_exact(@rec, groups)
      expect_exact(@rec, groups) # frozen and measured: kept as measured
    end

    it "measures objects allocated and frozen just before the profile" do
      n = scaled(300)
      early = {"early" => Array.new(n) { {x: 1} }}
      record_all(@rec, early)
      young_update(@rec)
      bytes_by_class(@rec) # a full update before the late ones exist
      late = {
        "late frozen" => Array.new(n) { |i| ("late" * (10 + i % 7)).freeze },
        "late range" => Array.new(n) { |i| LiveBytes::Range3.new(i, i, i) },
        "late hash" => Array.new(n) { |i| (1..(i % 20)).to_h { |k| [k, k] } }
      }
      record_all(@rec, late)
      young_update(@rec) # they survived one GC; the young update is the first to see them
      expect_exact(@rec, early.merge(late))
    end
  end

  # A C extension's Init runs in a Ruby frame of the extension's own with no line: its
  # allocations take the location of the code that required it, as C methods' do, instead of a
  # site "ext.so:0". In a child process, where the extension is not loaded yet.
  it "puts allocations of a C extension's Init at the require, not at line 0" do
    script = <<~RUBY
      require "datadog_heap"
      ext = %w[etc pty ripper nkf].find { |e| !$LOADED_FEATURES.any? { |f| f.end_with?("/\#{e}.so") } }
      rec = DatadogHeap::Recorder.new(sample_every: 1)
      rec.start
      require ext
      rec.stop
      rec.commit
      GC.start
      sites = rec.each_live_object.map { |o| o.locations.first.drop(1) }
      puts [ext, sites.size, sites.count { |_, line| line == 0 }, sites.count { |path, _| path.end_with?(".so") }].join(" ")
    RUBY
    lib = File.expand_path("../lib", __dir__)
    out, err, status = Open3.capture3(RbConfig.ruby, "-I", lib, "-e", script)
    expect(status).to be_success, err
    ext, live, at_line_0, in_so = out.split
    expect([live.to_i, at_line_0.to_i, in_so.to_i]).to match([be > 0, 0, 0]), "#{ext}: #{out}"
  end

  # The allocation sampler at sample_every 64: each class's estimate must land within 3 sigma of
  # the memsize_of sum. A sample stands for 64 allocations, so the estimate's variance is about
  # (64 - 1) * sum(size**2) over the objects.
  describe "sampled allocations", :heavy do
    SAMPLE_EVERY = 64

    def within_3_sigma(estimate, objects, what)
      sizes = objects.map { |o| ObjectSpace.memsize_of(o) }
      truth = sizes.sum
      sigma = Math.sqrt((SAMPLE_EVERY - 1) * sizes.sum { |s| s * s })
      expect((estimate - truth).abs).to be <= 3 * sigma,
        "#{what}: estimated #{estimate} bytes, memsize_of sum #{truth} (3 sigma = #{(3 * sigma).round})"
    end

    def allocate(n)
      {
        "LiveBytes::Range3" => Array.new(n) { |i| LiveBytes::Range3.new(i, i, i) },
        "LiveBytes::Late" => Array.new(n) { LiveBytes::Late.new },
        "LiveBytes::Hsh" => Array.new(n) { LiveBytes::Hsh.new },
        "LiveBytes::Arr" => Array.new(n) { LiveBytes::Arr.new },
        "LiveBytes::Str" => Array.new(n) { LiveBytes::Str.new }
      }
    end

    it "estimates each class's live bytes within 3 sigma, objects grown and frozen after allocation included" do
      @rec = DatadogHeap::Recorder.new(sample_every: SAMPLE_EVERY)
      @rec.start
      kept = allocate(40_000)
      @rec.stop
      @rec.commit
      young_update(@rec)
      bytes_by_class(@rec)
      kept["LiveBytes::Late"].each { |o| o.fill(12) }
      kept["LiveBytes::Hsh"].each_with_index { |h, i| (i % 40).times { |k| h[k] = k } }
      kept["LiveBytes::Arr"].each_with_index { |a, i| (i % 64).times { |k| a << k } }
      kept["LiveBytes::Str"].each_with_index { |s, i| s << ("x" * (i % 300)) }
      kept.each_value { |objects| objects.each_slice(2) { |o, _| o.freeze } } # half of each class
      young_update(@rec)
      got = bytes_by_class(@rec)
      kept.each { |name, objects| within_3_sigma(got[name], objects, name) }
    end
  end
end
