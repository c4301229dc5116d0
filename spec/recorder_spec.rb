# frozen_string_literal: true

RSpec.describe DatadogHeap::Recorder do
  before { @rec = manual_recorder }
  let(:rec) { @rec }

  describe "options" do
    it "has documented defaults and readers" do
      r = described_class.new
      expect([r.sampler, r.sample_every, r.windows_per_second, r.sample_rate, r.size_enabled, r.max_frames, r.max_tracked_objects])
        .to eq([:windowed, 4096, 100.0, 1, true, 400, 262_144])
      # sample_every's default follows the sampler.
      r = described_class.new(sampler: :countdown)
      expect([r.sampler, r.sample_every, r.windows_per_second]).to eq([:countdown, 1024, nil])
    end

    it "defaults to the windowed sampler unless sample_every is below 1024" do
      samplers = [{}, {sample_every: 1024}, {sample_every: 1023}, {sample_every: 1}, {sample_every: 64, windows_per_second: 50},
        {sample_every: 4096, sampler: :countdown}].map { |opts| described_class.new(**opts).sampler }
      expect(samplers).to eq(%i[windowed windowed countdown countdown windowed countdown])
      expect { described_class.new(sampler: :countdown, windows_per_second: 50) }
        .to raise_error(ArgumentError, /windows_per_second applies to sampler: :windowed only/)
    end

    it "rejects bad values naming the argument and the value" do
      expect { described_class.new(sample_rate: 0) }.to raise_error(ArgumentError, /sample_rate .* got 0/)
      expect { described_class.new(sample_every: -3) }.to raise_error(ArgumentError, /sample_every .* got -3/)
      expect { described_class.new(max_frames: 3001) }.to raise_error(ArgumentError, /max_frames .* got 3001/)
      expect { described_class.new(sample_rate: "2") }.to raise_error(TypeError, /sample_rate must be an Integer, got "2"/)
      expect { described_class.new(size_enabled: nil) }.to raise_error(TypeError, /size_enabled must be true or false/)
      expect { described_class.new(bogus: 1) }.to raise_error(ArgumentError, /bogus/)
    end

    it "names every unknown option, and rejects non-Integer numbers whatever their value" do
      expect { described_class.new(bogus: 1, sample_evry: 2) }
        .to raise_error(ArgumentError, /\ADatadogHeap::Recorder.new: unknown keywords :bogus, :sample_evry; known: :sample_every, /)
      [3.0, Rational(4, 1), Complex(3, 0), Float::NAN, Float::INFINITY].each do |v|
        expect { described_class.new(sample_every: v) }.to raise_error(TypeError, /\Asample_every must be an Integer, got /)
      end
      expect { described_class.new(max_tracked_objects: -2**100) }
        .to raise_error(ArgumentError, "max_tracked_objects must be between 1 and #{2**40}, got #{-2**100}")
    end

    it "setters validate and leave the recorder usable" do
      expect { rec.sample_rate = 0 }.to raise_error(ArgumentError, /sample_rate .* got 0/)
      expect { rec.size_enabled = 1 }.to raise_error(TypeError)
      rec.sample_rate = 3
      rec.size_enabled = false
      expect([rec.sample_rate, rec.size_enabled]).to eq([3, false])
      expect(record(rec, Object.new)).to be(false) # 1st of 3
    end
  end

  describe "#record_allocation" do
    it "validates every argument" do
      obj = Object.new
      expect { rec.record_allocation(1, locations: []) }.to raise_error(ArgumentError, /obj must be a heap object, got 1/)
      [:sym, nil, true, false].each do |imm|
        expect { rec.record_allocation(imm, locations: []) }.to raise_error(ArgumentError, /immediates/)
      end
      expect { rec.record_allocation(obj, weight: 0) }.to raise_error(ArgumentError, /weight must be a positive Integer, got 0/)
      expect { rec.record_allocation(obj, weight: 1.5) }.to raise_error(TypeError, /weight must be an Integer, got Float/)
      expect { rec.record_allocation(obj, weight: 2**40) }.to raise_error(ArgumentError, /weight/)
      expect { rec.record_allocation(obj, class_name: :Foo) }.to raise_error(TypeError, /class_name must be a String or nil/)
      expect { rec.record_allocation(obj, locations: "x") }.to raise_error(TypeError, /locations must be an Array/)
      expect { rec.record_allocation(obj, locations: [["a", "b"]]) }.to raise_error(TypeError, /locations\[0\] must be \[String, String, Integer\]/)
      expect { rec.record_allocation(obj, locations: [["a", "b", "1"]]) }.to raise_error(TypeError, /locations\[0\]/)
      expect { rec.record_allocation(obj, locations: [["a", "b", 2**40]]) }.to raise_error(ArgumentError, /32 bits/)
      expect(rec.stats[:pending_recordings_count]).to eq(0)
      expect(record(rec, obj)).to be(true)
    end

    it "truncates stacks deeper than max_frames with a marker frame" do
      r = manual_recorder(max_frames: 10)
      deep = Array.new(25) { |i| ["f#{i}", "/app/deep.rb", i] }
      keep = Object.new
      record(r, keep, locations: deep)
      r.commit
      full_gc
      locations = live_objects(r).first.locations
      expect(locations.size).to eq(10)
      expect(locations.first).to eq(["f0", "/app/deep.rb", 0])
      expect(locations.last).to eq(["(16 frames truncated)", "", 0])
      expect(keep).to be_a(Object)
    end

    it "accepts invalid UTF-8 in names" do
      keep = Object.new
      expect(record(rec, keep, locations: [["\xff\xfe".b, "/app/\xC3.rb", 1]])).to be(true)
      rec.commit
      full_gc
      expect(live_objects(rec).first.locations.first[0]).to be_a(String)
    end
  end

  describe "liveness" do
    it "keeps live objects and drops dead ones after a GC" do
      keep = Array.new(3) { Object.new }
      keep.each { |o| record(rec, o) }
      record_garbage(rec, 4)
      expect(rec.commit).to eq(7)
      full_gc
      expect(live_objects(rec).map(&:class_name)).to eq(keep.map { |o| o.class.name })
      expect(rec.stats).to include(num_object_records: 3, last_update_objects_alive: 3, last_update_objects_dead: 4)
    end

    it "does not yield objects that have not been through a GC", :exact_gc_counts do
      keep = Object.new
      record(rec, keep)
      rec.commit
      expect(live_objects(rec)).to be_empty
      expect(rec.stats[:last_update_objects_skipped]).to eq(1)
      GC.start
      expect(live_objects(rec).map(&:gen_age)).to eq([1])
    end

    it "orders ages with allocation order", :exact_gc_counts do
      old = Object.new
      record(rec, old, locations: [["old", "/a.rb", 1]])
      rec.commit
      GC.start
      GC.start
      young = Object.new
      record(rec, young, locations: [["young", "/a.rb", 2]])
      rec.commit
      GC.start
      ages = live_objects(rec).to_h { |o| [o.locations.first[0], o.gen_age] }
      expect(ages["old"]).to be > ages["young"]
      expect(ages["young"]).to eq(1)
      expect([old, young].size).to eq(2)
    end

    it "reports sizes as ObjectSpace.memsize_of and weight times sample_rate" do
      r = manual_recorder(sample_rate: 2)
      keep = Array.new(4) { "x" * 200 }
      keep.each { |s| record(r, s, weight: 3) }
      r.commit
      full_gc
      objs = live_objects(r)
      expect(objs.size).to eq(2) # every second recording is kept
      expect(objs.map(&:weight)).to all(eq(6))
      expect(objs.map(&:size)).to all(eq(ObjectSpace.memsize_of(keep[1])))
      expect(r.stats[:lifetime_recordings_skipped_sample_rate]).to eq(2)
    end

    it "reports size 0 when size is disabled" do
      r = manual_recorder(size_enabled: false)
      keep = "y" * 500
      record(r, keep)
      r.commit
      full_gc
      expect(live_objects(r).map(&:size)).to eq([0])
    end

    it "measures frozen objects once" do
      keep = +"grow"
      record(rec, keep)
      rec.commit
      GC.start
      keep << "x" * 1000
      keep.freeze
      first = live_objects(rec).first.size
      keep2 = keep.dup # unrelated, keeps the test honest about which object is measured
      expect(rec.stats[:last_update_objects_frozen]).to eq(1)
      expect(first).to eq(ObjectSpace.memsize_of(keep))
      expect(live_objects(rec).first.frozen?).to be(true)
      expect(live_objects(rec).first.size).to eq(first)
      expect(keep2).not_to be_frozen
    end

    it "records the class name, or nil" do
      keep = [Object.new, Object.new]
      record(rec, keep[0], class_name: "Widget")
      record(rec, keep[1], class_name: nil)
      rec.commit
      GC.start
      expect(live_objects(rec).map(&:class_name)).to contain_exactly("Widget", nil)
    end
  end

  describe "heap records" do
    it "shares one per call site and splits different sites" do
      keep = Array.new(5) { Object.new }
      keep.first(4).each { |o| record(rec, o) }
      record(rec, keep.last, locations: [["other", "/app/other.rb", 9]])
      rec.commit
      expect(rec.stats).to include(num_heap_records: 2, num_object_records: 5)
    end
  end

  describe "pending queue and commit" do
    it "empties on commit" do
      keep = Array.new(3) { Object.new }
      keep.each { |o| record(rec, o) }
      expect(rec.stats[:pending_recordings_count]).to eq(3)
      expect(rec.commit).to eq(3)
      expect(rec.stats).to include(pending_recordings_count: 0, lifetime_deferred_recordings_committed: 3)
    end

    it "fills at 4096, counts the overflow, and says in the profile that estimates are low" do
      keep = Array.new(4096 + 44) { Object.new }
      results = keep.map { |o| record(rec, o) }
      expect(results.count(true)).to eq(4096)
      expect(rec.stats).to include(pending_recordings_count: 4096, lifetime_deferred_recordings_skipped_buffer_full: 44)
      expect(rec.commit).to eq(4096)
      expect(DatadogHeap::Profile.parse(rec.profile).comments)
        .to include(a_string_starting_with("datadog_heap: estimates are low: 44 recordings were dropped unrecorded (44 with the pending queue full (4096)"))
    end

    it "commits through the postponed job without an explicit commit" do
      r = DatadogHeap::Recorder.new
      keep = Array.new(3) { Object.new }
      keep.each { |o| record(r, o) }
      # The job runs at the VM's next safe point; a method call or two gets us there.
      10.times { Thread.pass }
      expect(r.stats).to include(pending_recordings_count: 0, num_object_records: 3)
    end

    # A postponed job cannot raise where it runs; its error is the job's, not the next commit's.
    it "commits after a postponed job failed, warns about that failure once, keeps it in stats" do
      DatadogHeap::Testing._native_note_job_error(rec, "Interrupt: from a job")
      objects = Array.new(3) { Object.new }
      committed = nil
      # From the next call into the recorder (here the first record_allocation).
      expect do
        objects.each { |o| record(rec, o) }
        committed = rec.commit
      end.to output(/\Adatadog_heap: a postponed job failed: Interrupt: from a job\n\z/).to_stderr
      expect(committed).to eq(3)
      expect { rec.commit && rec.stats }.not_to output.to_stderr
      expect(rec.stats).to include(last_commit_error: "Interrupt: from a job", lifetime_job_errors: 1,
        num_object_records: objects.size)
    end

    it "keeps pending objects alive until committed" do
      record_garbage(rec, 5)
      full_gc
      expect(rec.commit).to eq(5)
      GC.start
      expect(live_objects(rec)).to eq([]) # collected after the commit, as they should be
      expect(rec.stats[:last_update_objects_dead]).to eq(5)
    end
  end

  describe "updates" do
    it "young update honours the 2 s interval and reset_last_update!", :exact_gc_counts do
      keep = Object.new
      record(rec, keep)
      rec.commit
      GC.start
      clock = -> { Process.clock_gettime(Process::CLOCK_MONOTONIC) }
      before_first = clock.call
      expect(rec.update_young_objects).to be(true)
      after_first = clock.call
      GC.start
      before_second = clock.call
      second = rec.update_young_objects
      after_second = clock.call
      # The recorder's clock read inside each update lies within these bounds. Under GC_STRESS
      # the GC in between can take longer than the interval itself: then the second one runs.
      if after_second - before_first < 2
        expect([second, rec.stats[:lifetime_updates_skipped_time]]).to eq([false, 1])
      elsif before_second - after_first >= 2
        expect([second, rec.stats[:lifetime_updates_skipped_time]]).to eq([true, 0])
      end
      GC.start
      DatadogHeap::Testing.reset_last_update!(rec)
      expect(rec.update_young_objects).to be(true)
      expect(rec.update_young_objects).to be(false)
      expect(rec.stats[:lifetime_updates_skipped_gcgen]).to eq(1)
    end

    it "full update (each_live_object) ignores the interval" do
      keep = Object.new
      record(rec, keep)
      rec.commit
      GC.start
      expect(rec.update_young_objects).to be(true)
      live_objects(rec)
      live_objects(rec)
      expect(rec.stats[:lifetime_updates_successful]).to eq(3)
    end

    it "may run inside an each_live_object block: the block sees a copy, not the live records" do
      keep = Object.new
      record(rec, keep)
      rec.commit
      GC.start
      DatadogHeap::Testing.reset_last_update!(rec)
      inside = nil
      rec.each_live_object do
        GC.start
        DatadogHeap::Testing.reset_last_update!(rec) # each_live_object's own full update just ran
        inside = rec.update_young_objects
      end
      expect(inside).to be(true)
      expect(rec.stats[:lifetime_updates_skipped_iterating]).to eq(0)
    end
  end

  describe "stats" do
    it "counts alive, dead, skipped and frozen exactly after a scripted scenario", :exact_gc_counts do
      alive = Array.new(3) { Object.new }
      frozen = Array.new(2) { Object.new.freeze }
      (alive + frozen).each { |o| record(rec, o) }
      record_garbage(rec, 4)
      rec.commit
      full_gc
      newborn = Object.new
      record(rec, newborn)
      rec.commit
      live_objects(rec)
      expect(rec.stats).to include(
        last_update_objects_alive: 5, last_update_objects_dead: 4,
        last_update_objects_skipped: 1, last_update_objects_frozen: 2,
        num_object_records: 6,
      )
      expect(rec.stats.keys.first(19)).to eq(%i[
        num_object_records num_heap_records pending_recordings_count
        last_update_objects_alive last_update_objects_dead last_update_objects_skipped last_update_objects_frozen
        lifetime_updates_successful lifetime_updates_skipped_concurrent lifetime_updates_skipped_gcgen
        lifetime_updates_skipped_time lifetime_ewma_young_objects_alive lifetime_ewma_young_objects_dead
        lifetime_ewma_young_objects_skipped lifetime_ewma_objects_alive lifetime_ewma_objects_dead
        lifetime_ewma_objects_skipped lifetime_deferred_recordings_skipped_buffer_full
        lifetime_deferred_recordings_committed
      ])
    end
  end

  describe "diagnostics" do
    it "record_id_for, recorded? and debug" do
      keep = Object.new
      record(rec, keep)
      rec.commit
      id = rec.record_id_for(keep)
      expect(id).to be_a(Integer)
      expect(rec.recorded?(id)).to be(true)
      expect(rec.recorded?(id + 100)).to be(false)
      expect(rec.record_id_for(Object.new)).to be_nil
      expect { rec.recorded?("1") }.to raise_error(TypeError, /record_id/)
      records, state = rec.debug
      expect(records[0]).to eq(:records)
      expect(records[1].first).to include("record_id=#{id}", "location=/app/widget.rb:12")
      expect(state[0]).to eq(:state)
      expect(state[1][:num_object_records]).to eq(1)
    end

    it "exhaust_record_ids! makes the next record raise and leaves the recorder readable" do
      keep = Object.new
      record(rec, keep)
      rec.commit
      DatadogHeap::Testing.exhaust_record_ids!(rec)
      expect { record(rec, Object.new) }.to raise_error(DatadogHeap::Error, /record ids exhausted/)
      expect { record(rec, Object.new) }.to raise_error(DatadogHeap::Error)
      GC.start
      expect(live_objects(rec).size).to eq(1)
      expect(rec.stats[:lifetime_recordings_failed]).to eq(2)
    end

    it "allows a nested each_live_object (the outer one ended before its first yield)" do
      keep = Object.new
      record(rec, keep)
      rec.commit
      GC.start
      inner = []
      rec.each_live_object { rec.each_live_object { |o| inner << o } }
      expect(inner.size).to eq(1)
      expect(live_objects(rec).size).to eq(1)
    end

    it "ends the iteration when the block raises or breaks" do
      keep = Object.new
      record(rec, keep)
      rec.commit
      GC.start
      expect { rec.each_live_object { raise "boom" } }.to raise_error("boom")
      rec.each_live_object { break }
      expect(live_objects(rec).size).to eq(1)
    end
  end

  describe "max_tracked_objects" do
    it "skips and counts recordings past the cap, and makes room as objects die" do
      r = manual_recorder(max_tracked_objects: 5)
      keep = Array.new(5) { Object.new }
      keep.each { |o| record(r, o) }
      expect(record(r, Object.new)).to be(false)
      expect(r.stats[:lifetime_recordings_skipped_max_tracked]).to eq(1)
      # The commit thins the records (past fifteen sixteenths of the cap: half dropped, the rest
      # weighted double) and keeps new recordings one in two: recording goes on.
      r.commit
      expect(r.stats[:lifetime_thinnings]).to be >= 1
      keep.pop(2)
      full_gc
      r.each_live_object { nil }
      outcomes = Array.new(40) { record(r, keep.first.dup).tap { r.commit } }
      expect(outcomes).to include(true)
      expect(r.stats[:lifetime_recordings_skipped_max_tracked]).to eq(1)
      expect { manual_recorder(max_tracked_objects: 0) }.to raise_error(ArgumentError, /max_tracked_objects .* got 0/)
    end
  end

  describe "memory accounting" do
    it "ObjectSpace.memsize_of(recorder) grows with what it tracks" do
      require "objspace"
      before = ObjectSpace.memsize_of(rec)
      keep = Array.new(200) { |i| Object.new.tap { |o| record(rec, o, locations: [["site#{i}", "/app/s.rb", i]]) } }
      rec.commit
      expect(ObjectSpace.memsize_of(rec)).to be > before + 200 * 50
      expect(rec.stats[:num_object_records]).to eq(keep.size)
    end
  end

  describe "WeakMap monkeypatching" do
    it "is not affected by a redefined WeakMap#[]= or #[]" do
      ObjectSpace::WeakMap.class_eval do
        alias_method :__orig_aset, :[]=
        alias_method :__orig_aref, :[]
        define_method(:[]=) { |*| raise "patched []=" }
        define_method(:[]) { |*| raise "patched []" }
      end
      keep = Object.new
      record(rec, keep)
      expect(rec.commit).to eq(1)
      GC.start
      expect(live_objects(rec).size).to eq(1)
    ensure
      ObjectSpace::WeakMap.class_eval do
        alias_method :[]=, :__orig_aset
        alias_method :[], :__orig_aref
        remove_method :__orig_aset, :__orig_aref
      end
    end
  end

  describe "fork" do
    it "child keeps the records with a clean lock and lifetime stats; parent unaffected" do
      keep = Array.new(3) { Object.new }
      keep.each { |o| record(rec, o) }
      rec.commit
      GC.start
      live_objects(rec)
      parent_stats = rec.stats
      reader, writer = IO.pipe
      pid = fork do
        reader.close
        s = rec.stats
        GC.start
        objs = live_objects(rec)
        writer.write(Marshal.dump([s, objs.size]))
        writer.close
        exit!(0)
      end
      writer.close
      child_stats, child_live = Marshal.load(reader.read)
      Process.wait(pid)
      expect($?.success?).to be(true)
      expect(child_stats).to include(num_object_records: 3, lifetime_updates_successful: 0,
        lifetime_deferred_recordings_committed: 0)
      expect(child_live).to eq(3)
      expect(rec.stats).to eq(parent_stats)
    end
  end

  describe "GC.stress" do
    it "survives with tracked and pending objects" do
      keep = Array.new(20) { Object.new }
      begin
        GC.stress = true
        keep.first(10).each { |o| record(rec, o) }
        rec.commit
        keep.last(10).each { |o| record(rec, o) }
        record_garbage(rec, 5)
        rec.commit
        live_objects(rec)
      ensure
        GC.stress = false
      end
      GC.start
      expect(live_objects(rec).size).to eq(20)
    end
  end
end
