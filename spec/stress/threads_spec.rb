# frozen_string_literal: true

require_relative "stress_helper"

RSpec.describe "many threads", :stress do
  # What every recording attempt turned into. Each `record_allocation` that got past argument
  # checks (hook or Ruby API) is one attempt, and ends as exactly one of: skipped (sample rate,
  # lock, buffer full, max tracked, storage busy), failed, or pending; a pending one leaves the
  # queue only by being committed; a committed one leaves the records only when found dead.
  def accounting(stats)
    skipped = %i[
      lifetime_recordings_skipped_sample_rate lifetime_recordings_skipped_locked
      lifetime_deferred_recordings_skipped_buffer_full lifetime_recordings_skipped_max_tracked
      lifetime_recordings_failed
    ].sum { |k| stats.fetch(k) }
    # A pending recording is committed, still pending, or dropped at its commit as the VM's own.
    became_pending = stats.fetch(:lifetime_deferred_recordings_committed) + stats.fetch(:pending_recordings_count) +
      stats.fetch(:lifetime_recordings_dropped_hidden)
    sampler = %i[sampler_skipped_reentrant sampler_skipped_internal sampler_samples_recorded
      sampler_skipped_by_recorder sampler_hook_errors].sum { |k| stats.fetch(k) }
    {
      attempted: stats.fetch(:lifetime_recordings_attempted),
      skipped_or_pending: skipped + became_pending,
      sampler_taken: stats.fetch(:sampler_samples_taken),
      sampler_outcomes: sampler,
      committed: stats.fetch(:lifetime_deferred_recordings_committed),
      records: stats.fetch(:num_object_records),
    }
  end

  it "16 allocating threads, a profiling thread and an updating thread: no crash, no deadlock, stats add up" do
    seconds = Float(ENV.fetch("STRESS_THREADS_SECONDS", "6"))
    result = in_child(seconds + 60) do |progress|
      @rec = DatadogHeap::Recorder.new(sampler: :countdown, sample_every: 16, max_overhead: nil, max_frames: 64)
      manual_calls = Queue.new
      running = true
      @rec.start
      workers = Array.new(16) do |t|
        Thread.new do
          kept = []
          n = 0
          manual = 0
          while running
            kept << (t.even? ? "t#{t}-#{n}" : [t, n])
            kept.shift(500) if kept.size > 5_000
            if (n % 97).zero?
              obj = Object.new
              kept << obj
              # The Ruby API, from many threads, interleaved with the hook.
              @rec.record_allocation(obj, class_name: "Manual", locations: [["manual#{t}", "/w.rb", t]])
              manual += 1
            end
            n += 1
            Thread.pass if (n % 1_000).zero?
          end
          manual_calls << manual
          kept
        end
      end
      profiles = Thread.new do
        count = 0
        bad = 0
        while running
          begin
            bad += 1 unless decodes?(@rec.profile)
            count += 1
          rescue DatadogHeap::Error => e
            raise unless e.message.include?("already in progress")
          end
        end
        [count, bad]
      end
      updates = Thread.new do
        done = 0
        while running
          DatadogHeap::Testing.reset_last_update!(@rec)
          done += 1 if @rec.update_young_objects
          GC.start(full_mark: false) if (done % 3).zero?
          sleep 0.01
        end
        done
      end
      iterations = Thread.new do
        busy = 0
        while running
          begin
            @rec.each_live_object { |o| o.locations.size }
          rescue DatadogHeap::Error => e
            raise unless e.message.include?("already in progress")

            busy += 1
          end
          sleep 0.05
        end
        busy
      end
      started = monotonic
      progress.call("threads started")
      sleep 0.5 while monotonic - started < seconds
      running = false
      progress.call("stopping")
      kept = workers.map(&:value)
      profile_count, bad_profiles = profiles.value
      update_count = updates.value
      iterations.value
      progress.call("joined")
      @rec.stop
      @rec.commit
      manual = Array.new(16) { manual_calls.pop }.sum
      stats_running = @rec.stats
      full_gc
      live = @rec.each_live_object.count
      stats_after = @rec.stats
      [kept.map(&:size), profile_count, bad_profiles, update_count, manual, stats_running, live, stats_after]
    end
    kept, profile_count, bad_profiles, update_count, manual, stats, live, stats_after = result
    acc = accounting(stats)
    report("threads", acc.merge(profiles: profile_count, updates: update_count, manual: manual, live: live,
      skipped_locked: stats[:lifetime_recordings_skipped_locked],
      buffer_full: stats[:lifetime_deferred_recordings_skipped_buffer_full], commits_skipped_locked: stats[:lifetime_commits_skipped_locked],
      reentrant: stats[:sampler_skipped_reentrant], internal: stats[:sampler_skipped_internal]))
    expect(kept.size).to eq(16)
    expect(kept).to all(be > 1_000)
    expect(profile_count).to be >= 3
    expect(bad_profiles).to eq(0)
    expect(update_count).to be >= 1
    expect(stats[:sampler_hook_errors]).to eq(0)
    expect(stats[:disabled_reason]).to be_nil
    expect(stats[:last_commit_error]).to be_nil
    expect(stats[:pending_recordings_count]).to eq(0)
    # Every attempt has exactly one outcome; every sample the hook took too.
    expect(acc[:attempted]).to eq(acc[:skipped_or_pending])
    expect(acc[:sampler_taken]).to eq(acc[:sampler_outcomes])
    expect(acc[:attempted]).to eq(stats[:sampler_samples_recorded] + stats[:sampler_skipped_by_recorder] + manual)
    expect(acc[:records]).to be <= acc[:committed]
    expect(acc[:committed]).to be > 1_000
    # After the last full update every record is alive and old enough to be yielded.
    expect(live).to eq(stats_after[:num_object_records])
    expect(live).to be > 1_000 # the workers' arrays are still held
    expect(stats_after[:last_update_objects_dead] + live).to be <= acc[:records]
  end
end
