# frozen_string_literal: true

require_relative "stress_helper"

# GC.compact moves objects; the WeakMap that tracks them must follow, and pending objects (which
# the recorder marks) must not be moved behind its back. Rubies with bug #19529 corrupt WeakMaps
# on compaction whatever we do, so these are skipped there.
RSpec.describe "GC compaction", :stress do
  before do
    skip "Ruby #{RUBY_VERSION} has bug #19529: GC.compact corrupts ObjectSpace::WeakMap" if DatadogHeap::WEAK_MAP_COMPACTION_BUG
    skip "GC.compact is not supported here" unless GC.respond_to?(:compact) && GC.respond_to?(:verify_compaction_references)
  end

  # verify_compaction_references moves every object it can (toward: :empty), after growing the
  # heap so there is room: `expand_heap:` on Ruby >= 3.2, `double_heap:` before.
  def verify_compaction
    keys = GC.method(:verify_compaction_references).parameters.map(&:last)
    if keys.include?(:expand_heap)
      GC.verify_compaction_references(toward: :empty, expand_heap: true)
    else
      GC.verify_compaction_references(toward: :empty, double_heap: true)
    end
  end

  def live_by_site(rec)
    rec.each_live_object.each_with_object(Hash.new(0)) { |o, h| h[o.locations.first[0]] += o.weight }
  end

  it "keeps liveness, ids and the profile right across verify_compaction_references and GC.compact" do
    result = in_child(90) do |progress|
      @rec = manual_recorder
      tracked = track_many(@rec, 3_000, sites: 3, prefix: "tracked")
      record_garbage(@rec, 200, locations: [["garbage", "/g.rb", 1]])
      @rec.commit
      # Pending when the heap moves: marked (and pinned) by the recorder until the commit.
      pending = Array.new(200) { +"pending" }
      pending.each { |o| record(@rec, o, locations: [["pending", "/p.rb", 1]]) }
      progress.call("recorded")
      ids_before = tracked.first(100).map { |o| @rec.record_id_for(o) }

      verify_compaction
      progress.call("verify_compaction_references")
      expect(@rec.commit).to eq(200)
      GC.compact
      progress.call("GC.compact")
      full_gc

      ids_after = tracked.first(100).map { |o| @rec.record_id_for(o) }
      sites = live_by_site(@rec)
      gz = @rec.profile
      progress.call("profiled")
      # Half the tracked objects die; a second compaction, then the counts must follow.
      tracked.slice!(0, 1_500)
      full_gc
      GC.compact
      sites_after = live_by_site(@rec)
      [ids_before, ids_after, sites, sites_after, decodes?(gz), tracked.size + pending.size]
    end
    ids_before, ids_after, sites, sites_after, decodes, _kept = result
    expect(ids_before).to all(be_a(Integer))
    expect(ids_after).to eq(ids_before)
    expect(sites).to eq("tracked0" => 1_000, "tracked1" => 1_000, "tracked2" => 1_000, "pending" => 200)
    expect(sites_after).to eq("tracked0" => 500, "tracked1" => 500, "tracked2" => 500, "pending" => 200)
    expect(decodes).to be(true)
  end

  it "samples with the built-in sampler through repeated compactions" do
    result = in_child(90) do |progress|
      @rec = DatadogHeap::Recorder.new(sampler: :countdown, sample_every: 7, max_overhead: nil)
      DatadogHeap::Testing._native_set_seed(@rec, 7)
      keep = []
      @rec.start
      20.times do |round|
        2_000.times { |i| keep << "k#{i}" }
        200.times { Object.new }
        round.even? ? GC.compact : verify_compaction
        progress.call("round #{round}")
      end
      @rec.stop
      @rec.commit
      full_gc
      GC.compact
      strings = @rec.each_live_object.sum { |o| o.class_name == "String" ? o.weight : 0 }
      [strings, keep.size, @rec.stats[:sampler_hook_errors], @rec.stats[:disabled_reason]]
    end
    strings, kept, hook_errors, disabled = result
    # Each kept string stands for 7 on average; 40k kept: the estimate lands well within 25%.
    expect(strings).to be_within(0.25 * kept).of(kept)
    expect([hook_errors, disabled]).to eq([0, nil])
  end
  it "moves a running recorder held only by an Array, which still commits and profiles" do
    result = in_child(90) do |progress|
      # Held by a heap object, not the stack, so compaction may move it (the runtime does not
      # hold recorders: one nothing refers to is collected).
      holder = [DatadogHeap::Recorder.new(sampler: :countdown, sample_every: 5, max_overhead: nil).tap(&:start)]
      keep = []
      6.times do |round|
        1_000.times { |i| keep << "c#{i}" }
        round.even? ? GC.compact : verify_compaction
        progress.call("round #{round}")
      end
      rec = holder.first
      rec.stop
      rec.commit
      full_gc
      strings = rec.each_live_object.sum { |o| o.class_name == "String" ? o.weight : 0 }
      [strings, keep.size, decodes?(rec.profile), rec.stats.values_at(:sampler_hook_errors, :disabled_reason, :last_commit_error)]
    end
    strings, kept, decodes, errors = result
    expect(strings).to be_within(0.3 * kept).of(kept)
    expect(decodes).to be(true)
    expect(errors).to eq([0, nil, nil])
  end
end
