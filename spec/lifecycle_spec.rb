# frozen_string_literal: true

require "spec_helper"
require_relative "stress/stress_helper"

# Recorders whose Ruby object goes away while the VM still has work for them: started and never
# stopped, or holding pending recordings. Each scenario runs in a forked child, so a crash fails
# the example instead of taking rspec down.
RSpec.describe "Recorder lifecycle" do
  include StressHelpers

  # Recorders started here and never stopped keep sampling (the VM's hook list holds them, as it
  # holds an enabled TracePoint): stop them when the scenario is over.
  def stop_all_recorders
    ObjectSpace.each_object(DatadogHeap::Recorder).count { |r| r.stop }
  end

  it "survives started recorders dropped without stop, under lazy sweep" do
    result = in_child(120) do |progress|
      rounds = scaled(16)
      rounds.times do |i|
        r = i.even? ? DatadogHeap::Recorder.new(sampler: :countdown, sample_every: 1) : DatadogHeap::Recorder.new(sampler: :windowed, sample_every: 64)
        r.start
        r = nil # rubocop:disable Lint/UselessAssignment -- the point: nothing refers to it
        GC.start(immediate_sweep: false)
        keep = Array.new(scaled(20_000)) { |j| "s#{j}" }
        GC.start(immediate_sweep: false)
        progress.call("round #{i}: #{keep.size}")
      end
      # Still sampling: nothing stopped them.
      running = ObjectSpace.each_object(DatadogHeap::Recorder).count(&:running?)
      stopped = stop_all_recorders
      [rounds, running, stopped]
    end
    rounds, running, stopped = result
    expect(running).to eq(rounds)
    expect(stopped).to eq(rounds)
  end

  it "commits the pending recordings of a recorder nobody refers to" do
    result = in_child(60) do
      others = ObjectSpace.each_object(DatadogHeap::Recorder).map(&:object_id)
      listed = DatadogHeap::Testing._native_listed_sessions
      kept = Array.new(50) { Object.new }
      owner = DatadogHeap::Recorder.new
      kept.each { |o| owner.record_allocation(o, locations: [["Pending#x", "/p.rb", 1]]) }
      owner = nil # rubocop:disable Lint/UselessAssignment -- the point: nothing refers to it
      3.times { GC.start(immediate_sweep: false) }
      Array.new(scaled(50_000)) { +"x" }
      GC.start
      mine = ObjectSpace.each_object(DatadogHeap::Recorder).reject { |r| others.include?(r.object_id) }
      [kept.size, listed, mine.map { |r| r.stats.values_at(:num_object_records, :pending_recordings_count) },
        DatadogHeap::Testing._native_listed_sessions]
    end
    kept, listed_before, found, listed_after = result
    expect(kept).to eq(50)
    # If the recorder is still around, the commit job reached it and committed everything; once
    # drained, nothing keeps it listed.
    found.each { |records, pending| expect([records, pending]).to eq([50, 0]) }
    expect(listed_after).to eq(listed_before)
  end

  it "survives Recorder.new, start and drop in a loop under GC.stress" do
    result = in_child(120) do
      made = 0
      GC.stress = true
      begin
        # A GC at every allocation: one inside Recorder.new, between wrapping the object and making
        # its WeakMap, must find both marked. One recorder in ten is started and dropped running.
        # Each GC marks the whole heap the child inherited from the suite, so the count is kept
        # small (80 recorders: about 12 s alone here, 200 came near the 120 s limit in a full run).
        80.times do |i|
          r = DatadogHeap::Recorder.new(sampler: :countdown, sample_every: 4096)
          r.start if i % 10 == 0
          made += 1
        end
        # The windowed sampler's timer, started and stopped under stress too.
        4.times do |i|
          r = DatadogHeap::Recorder.new(sampler: :windowed)
          r.start if i.even?
          made += 1
        end
      ensure
        GC.stress = false
      end
      [made, stop_all_recorders]
    end
    made, stopped = result
    expect(made).to eq(84)
    expect(stopped).to eq(10)
  end

  it "keeps a running recorder alive while nothing else refers to it" do
    result = in_child(60) do
      DatadogHeap::Recorder.new(sampler: :countdown, sample_every: 1).start
      5.times { GC.start }
      recorders = ObjectSpace.each_object(DatadogHeap::Recorder).to_a
      alive = recorders.count(&:running?)
      recorders.each(&:stop)
      recorders = nil # rubocop:disable Lint/UselessAssignment
      [alive]
    end
    expect(result).to eq([1])
  end
end
