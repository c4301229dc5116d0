# frozen_string_literal: true

# Helpers shared by the recorder specs.
module RecorderHelpers
  LOCATIONS = [["Widget#build", "/app/widget.rb", 12], ["<main>", "/app/main.rb", 1]].freeze

  # A recorder whose recordings wait for an explicit commit, so specs decide when commits happen.
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
  # On failure, show the recorder's state (when the example kept it in @rec).
  config.after do |example|
    if example.exception && defined?(@rec) && @rec
      records, state = @rec.debug
      warn "recorder.debug: #{records[1].size} records, first: #{records[1].first(5).inspect}\nstate: #{state[1].inspect}"
    end
  end
end
