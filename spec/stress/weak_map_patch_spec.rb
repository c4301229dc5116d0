# frozen_string_literal: true

require "tmpdir"
require_relative "stress_helper"

# Application code that redefines ObjectSpace::WeakMap#[]= / #[] (to raise, here), or even
# UnboundMethod#bind_call / #bind and Method#call, must not change what the recorder does on any path: commit (explicit and postponed), young and full updates,
# iteration, profile, the diagnostics, fork. spec/recorder_spec.rb covers the commit alone.
RSpec.describe "monkeypatched ObjectSpace::WeakMap", :stress do
  it "does not affect commit, updates, iteration, profile, diagnostics or the sampler" do
    result = in_child(60) do
      ObjectSpace::WeakMap.class_eval do
        define_method(:[]=) { |*| raise "patched WeakMap#[]=" }
        define_method(:[]) { |*| raise "patched WeakMap#[]" }
        define_method(:key?) { |*| raise "patched WeakMap#key?" }
        define_method(:include?) { |*| raise "patched WeakMap#include?" }
        define_method(:each) { |*| raise "patched WeakMap#each" }
      end
      UnboundMethod.class_eval do
        define_method(:bind_call) { |*| raise "patched UnboundMethod#bind_call" }
        define_method(:bind) { |*| raise "patched UnboundMethod#bind" }
      end
      Method.class_eval { define_method(:call) { |*| raise "patched Method#call" } }
      @rec = manual_recorder
      keep = track_many(@rec, 300, sites: 3)
      record_garbage(@rec, 100)
      @rec.commit
      GC.start
      DatadogHeap::Testing.reset_last_update!(@rec)
      young = @rec.update_young_objects
      live = @rec.each_live_object.count
      id = @rec.record_id_for(keep.first)
      recorded = id && @rec.recorded?(id)
      gz = @rec.profile
      written = Dir.mktmpdir { |dir| decodes?(File.binread(@rec.write_profile(File.join(dir, "p.pb.gz")))) }
      debug = @rec.debug[0][1].size
      # The built-in sampler and its postponed commit and young-update jobs.
      sampler = DatadogHeap::Recorder.new(sampler: :countdown, sample_every: 1, max_overhead: nil)
      sampler.start
      sampled = Array.new(500) { Object.new }
      10.times { Thread.pass }
      GC.start
      DatadogHeap::Testing.reset_last_update!(sampler)
      10.times { Thread.pass }
      sampler.stop
      sampler.commit
      sampled_live = sampler.each_live_object.count { |o| o.class_name == "Object" }
      # And in a forked child.
      child = fork { exit!(@rec.each_live_object.count == keep.size ? 0 : 1) }
      Process.wait(child)
      [young, live, recorded, decodes?(gz), written, debug, sampled_live, sampled.size, $?.success?,
        sampler.stats[:last_commit_error], keep.size]
    end
    young, live, recorded, decodes, written, debug, sampled_live, sampled, child_ok, commit_error, kept = result
    expect(young).to be(true)
    expect(live).to eq(kept)
    expect([recorded, decodes, written, child_ok]).to eq([true, true, true, true])
    expect(debug).to eq(kept)
    expect(sampled_live).to be >= sampled
    expect(commit_error).to be_nil
  end
end
