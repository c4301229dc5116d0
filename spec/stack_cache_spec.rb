# frozen_string_literal: true

# The sampler's stack cache (raw frames -> interned stack, valid until the next GC) must be
# invisible: the same stacks, names, lines, C frames and truncation markers as naming every
# sample from scratch, and no stale name after a GC moved or freed the frames it saw.
RSpec.describe "sampler stack cache" do
  CacheSiteA = Struct.new(:n)
  CacheSiteB = Struct.new(:n)
  CacheSiteC = Struct.new(:n)
  CacheMoved = Struct.new(:n)
  CacheKept = Struct.new(:n)
  CACHE_CLASSES = %w[CacheSiteA CacheSiteB CacheSiteC].freeze

  after { @rec&.stop }

  def cache_site_a(keep)
    keep << CacheSiteA.new(1)
  end

  def cache_site_b(keep)
    3.times { |i| keep << CacheSiteB.new(i) } # a block under a C frame (Integer#times)
  end

  def cache_deep(depth, keep)
    return keep.concat(Array.new(2) { CacheSiteC.new(depth) }) if depth.zero? # C frames on top

    cache_deep(depth - 1, keep)
  end

  # Allocates the same objects at the same sites every time; keeps them.
  def cache_workload(keep)
    i = 0
    while i < 20
      cache_site_a(keep)
      cache_site_b(keep)
      cache_deep(i % 7, keep)
      i += 1
    end
    keep
  end

  # [class, locations] => count over the tracked objects of the workload's classes.
  def tracked_stacks(rec)
    rec.each_live_object
       .select { |o| CACHE_CLASSES.include?(o.class_name) }
       .group_by { |o| [o.class_name, o.locations] }
       .transform_values(&:size)
  end

  def run_workload(cache:, max_frames:)
    @rec = DatadogHeap::Recorder.new(sample_every: 1, max_frames: max_frames)
    DatadogHeap::Testing._native_set_stack_cache(@rec, cache)
    keep = []
    @rec.start
    cache_workload(keep)
    @rec.stop
    full_gc
    stacks = tracked_stacks(@rec)
    stats = @rec.stats
    expect(keep.size).to eq(20 * 6)
    @rec = nil
    [stacks, stats]
  end

  [400, 12].each do |max_frames|
    it "gives exactly the stacks of the uncached path (max_frames: #{max_frames})" do
      # One call site for both runs, so their stacks can be equal down to the last frame.
      (uncached, plain_stats), (cached, cached_stats) =
        [false, true].map { |cache| run_workload(cache: cache, max_frames: max_frames) }

      expect(plain_stats[:lifetime_stack_cache_hits] + plain_stats[:lifetime_stack_cache_misses]).to eq(0)
      expect(cached_stats[:lifetime_stack_cache_hits]).to be > 0
      expect(cached.values.sum).to eq(20 * 6)
      expect(cached).to eq(uncached)
      # What the comparison covers: C frames named at their caller's line, and (at 12 frames)
      # truncation markers.
      locations = cached.keys.map(&:last)
      expect(locations.map { |l| l.first[0..1] }).to all(eq(["new", __FILE__]))
      if max_frames == 12
        expect(locations.map(&:last)).to all(satisfy { |name, _, _| name.match?(/\A\(\d+ frames truncated\)\z/) })
        expect(locations.map { |l| l.last.first }.uniq.size).to be > 1
      else
        expect(locations.flatten(1).map(&:first)).not_to include(a_string_matching(/truncated/))
        expect(locations.flatten(1).map(&:first)).to include("times", "initialize")
      end
    end
  end

  def cache_before_compact
    CacheMoved.new(:before)
  end

  def cache_after_compact
    CacheMoved.new(:after)
  end

  it "names the right method when GC.compact moves frames between two samples" do
    skip "GC.compact is not supported here" unless GC.respond_to?(:compact)

    # Commits wait until after the compactions, so the WeakMap is empty while objects move (on
    # Rubies with bug #19529 compaction corrupts a WeakMap that holds entries).
    @rec = manual_recorder(sample_every: 1)
    keep = []
    @rec.start
    2.times do
      keep << cache_before_compact
      keep << cache_after_compact
      GC.compact
      keep << cache_after_compact
      keep << cache_before_compact
      GC.compact
    end
    @rec.stop
    expect(@rec.stats[:lifetime_stack_cache_misses]).to be >= 4 # each compaction starts afresh
    @rec.commit
    full_gc
    moved = @rec.each_live_object.select { |o| o.class_name == "CacheMoved" }
    expect(moved.size).to eq(8)
    names = moved.map { |o| o.locations[1][0] }.tally
    expect(names).to eq("cache_before_compact" => 4, "cache_after_compact" => 4)
    expect(keep.size).to eq(8)
  end

  it "holds string references exactly as the uncached path does" do
    refs = [false, true].map do |cache|
      @rec = manual_recorder(sample_every: 1)
      DatadogHeap::Testing._native_set_stack_cache(@rec, cache)
      keep = []
      @rec.start
      50.times { keep << CacheKept.new(0) }
      @rec.stop
      @rec.commit
      stats = @rec.stats
      expect(stats[:lifetime_stack_cache_hits]).to(cache ? be >= 40 : eq(0))
      expect(keep.size).to eq(50)
      stats.values_at(:num_object_records, :num_heap_records, :interned_string_refs)
    end
    expect(refs[1]).to eq(refs[0])
  end

  it "starts empty after stop and start" do
    @rec = DatadogHeap::Recorder.new(sample_every: 1)
    keep = []
    2.times do
      @rec.start
      keep << CacheKept.new(0)
      @rec.stop
    end
    # The second start found nothing cached for the same site.
    expect(@rec.stats[:lifetime_stack_cache_misses]).to be >= 2
    expect(keep.size).to eq(2)
  end
end
