# frozen_string_literal: true

require "spec_helper"

# Near max_tracked_objects the recorder drops half its records and doubles the weight of the
# rest: the dropped records leave the WeakMap too, so the cap bounds the map and every walk over it.
RSpec.describe "thinning near max_tracked_objects" do
  it "removes the dropped records' WeakMap entries" do
    rec = DatadogHeap::Recorder.new(sampler: :countdown, sample_every: 1, max_tracked_objects: 1_000, max_overhead: nil)
    rec.start
    kept = []
    20.times do
      1_000.times { kept << String.new }
      rec.commit
    end
    rec.stop
    rec.commit
    stats = rec.stats
    expect(stats[:lifetime_thinnings]).to be >= 3, rec.debug.inspect
    # Every tracked object is alive (kept), so the map holds the records and nothing else.
    expect(stats[:weak_map_size]).to eq(stats[:num_object_records]), stats.slice(:weak_map_size, :num_object_records, :lifetime_thinnings).inspect
    expect(stats[:num_object_records]).to be <= 1_000
    expect(kept.size).to eq(20_000)
  end

  it "keeps tracking the objects it kept, and forgets them when they die" do
    rec = DatadogHeap::Recorder.new(sampler: :countdown, sample_every: 1, max_tracked_objects: 500, max_overhead: nil)
    rec.start
    kept = Array.new(5_000) { Object.new }
    rec.stop
    rec.commit
    GC.start # objects of the current GC generation are not reported yet
    live = rec.each_live_object.sum(&:weight)
    expect(live).to be_within(0.25 * kept.size).of(kept.size)
    kept = nil # rubocop:disable Lint/UselessAssignment
    GC.start
    expect(rec.each_live_object.count).to be < 50
  end
end
