# frozen_string_literal: true

require "spec_helper"
require_relative "stress/stress_helper"

# Recorders whose Ruby object goes away while the VM still has work for them: started and never
# stopped, or holding pending recordings. Each scenario runs in a forked child, so a crash fails
# the example instead of taking rspec down.
RSpec.describe "Recorder lifecycle" do
  include StressHelpers

  # Recorders started here and never stopped sample until the GC collects them (the runtime does
  # not hold them): stop the ones still around when the scenario is over.
  def stop_all_recorders
    ObjectSpace.each_object(DatadogHeap::Recorder).count { |r| r.stop }
  end

  # Overwrites the machine stack below the caller, so that stale words there (which the GC scans
  # conservatively) stop pointing at objects the program dropped.
  def clobber_stack(depth)
    depth.zero? ? Array.new(16) : clobber_stack(depth - 1)
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
      # Some may still be around (collected or not yet): each one left is stopped cleanly.
      running = ObjectSpace.each_object(DatadogHeap::Recorder).count(&:running?)
      stopped = stop_all_recorders
      [rounds, running, stopped]
    end
    rounds, running, stopped = result
    expect(running).to be <= rounds
    expect(stopped).to eq(running)
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
    # The started ones the GC has not collected yet (GC.stress collects most at once).
    expect(stopped).to be <= 10
  end

  it "stops sampling for a started recorder the program no longer references" do
    result = in_child(60) do
      testing = DatadogHeap::Testing
      listed_before = testing._native_listed_sessions
      hook_before = testing._native_hooks[0]
      start_forgotten = -> { DatadogHeap::Recorder.new(sampler: :countdown, sample_every: 1).start && nil }
      start_forgotten.call
      listed_started = testing._native_listed_sessions
      tries = 0
      until testing._native_listed_sessions == listed_before || tries == 30
        clobber_stack(100)
        GC.start
        # The hook finds the collected recorder's session and asks for the job that unlists it.
        Array.new(100) { Object.new }
        tries += 1
      end
      [listed_before, listed_started, testing._native_listed_sessions, hook_before, testing._native_hooks[0]]
    end
    listed_before, listed_started, listed_after, hook_before, hook_after = result
    expect(listed_started).to eq(listed_before + 1)
    expect(listed_after).to eq(listed_before)
    expect(hook_after).to eq(hook_before) # no hook left installed for the collected recorder
  end
end
