# frozen_string_literal: true

require "io/wait"
require "spec_helper"

# The recorder's soft lock knows its holder. The VM runs signal traps and finalizers inside the
# recorder's own WeakMap calls, on the thread that holds the lock; a profile taken there used to
# wait for itself forever (a hang SIGTERM could not end: traps are masked inside a trap). Each
# scenario runs in a forked child with a deadline, so a hang fails the example instead of rspec.
RSpec.describe "the recorder's lock" do
  # Runs the block in a child; returns its Marshal-ed value, or fails when it outlives `seconds`.
  def in_child_within(seconds)
    reader, writer = IO.pipe
    pid = fork do
      reader.close
      value = begin
        [:ok, yield]
      rescue Exception => e # rubocop:disable Lint/RescueException -- reported to the parent
        [:error, "#{e.class}: #{e.message}"]
      end
      writer.write(Marshal.dump(value))
      writer.close
      exit!(0)
    end
    writer.close
    unless reader.wait_readable(seconds)
      Process.kill(:KILL, pid)
      Process.wait(pid)
      raise "the child was still running after #{seconds} s (hung)"
    end
    data = reader.read
    Process.wait(pid)
    status, value = Marshal.load(data) # rubocop:disable Security/MarshalLoad
    raise "child failed: #{value}" if status == :error

    value
  ensure
    reader&.close
  end

  def tracked_recorder(count)
    rec = manual_recorder
    keep = Array.new(count) { Object.new }
    keep.each_slice(200) do |slice| # the pending queue holds 256
      slice.each { |o| record(rec, o) }
      rec.commit
    end
    GC.start
    [rec, keep]
  end

  it "refuses a profile asked for by the lock's own holder (a trap inside an update) instead of waiting" do
    outcome = in_child_within(30) do
      rec, keep = tracked_recorder(50)
      refused = DatadogHeap::Testing._native_hold_lock(rec) do
        rec.profile
        nil
      rescue DatadogHeap::Error => e
        e.message
      end
      # Usable afterwards: the holder's lock was released with it.
      [refused, rec.each_live_object.count, keep.size]
    end
    refused, live, kept = outcome
    expect(refused).to match(/already inside the recorder's own update or commit.*signal trap/)
    expect(live).to eq(kept)
  end

  it "lets a USR2 trap take profiles while the main thread commits and profiles, without hanging", :heavy do
    outcome = in_child_within(60) do
      rec, keep = tracked_recorder(2_000)
      taken = refused = 0
      trap("USR2") do
        rec.profile
        taken += 1
      rescue DatadogHeap::Error => e
        raise unless e.message.include?("signal trap")

        refused += 1
      end
      # Another process sends the signals: a thread here would wait for the GVL between them.
      signaller = Process.spawn(RbConfig.ruby, "-e", "300.times { Process.kill(:USR2, #{Process.pid}); sleep 0.003 }")
      rounds = 0
      # Commits write the WeakMap once per recording with the lock held, and the VM runs the
      # trap after any of those calls: the trap's profile then asks for a lock this thread holds.
      until Process.wait(signaller, Process::WNOHANG)
        batch = Array.new(200) { Object.new }
        batch.each { |o| record(rec, o) }
        rec.commit
        keep.concat(batch)
        rec.profile if (rounds += 1) % 10 == 0
      end
      GC.start # only objects that survived a GC are reported
      [taken, refused, rounds, rec.each_live_object.count == keep.size]
    end
    taken, refused, rounds, all_live = outcome
    expect(taken + refused).to be > 0
    expect(rounds).to be > 0
    expect(all_live).to be(true)
  end

  it "bounds a wait for another thread's hold of the lock" do
    outcome = in_child_within(30) do
      rec, _keep = tracked_recorder(10)
      DatadogHeap::Testing._native_set_lock_wait_limit(0.2)
      holding = Queue.new
      holder = Thread.new do
        DatadogHeap::Testing._native_hold_lock(rec) do
          holding << true
          sleep 3
        end
      end
      holding.pop
      started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      message = begin
        rec.profile
        nil
      rescue DatadogHeap::Error => e
        e.message
      end
      waited = Process.clock_gettime(Process::CLOCK_MONOTONIC) - started
      holder.join
      [message, waited, rec.profile.bytesize > 0]
    end
    message, waited, usable = outcome
    expect(message).to match(/gave up after waiting \d+ ms for another thread/)
    expect(waited).to be_between(0.2, 2.9)
    expect(usable).to be(true)
  end

  it "is left alone by after_fork without a fork (another thread may hold it)" do
    rec = manual_recorder
    rec.each_live_object { nil } # one update, so lifetime counters are not all zero
    keep = Array.new(3) { Object.new }
    keep.each { |o| record(rec, o) }
    updates = rec.stats[:lifetime_updates_successful]
    committed = DatadogHeap::Testing._native_hold_lock(rec) do
      rec.after_fork
      rec.commit # still locked by this "other" operation: skipped, nothing committed
    end
    expect(committed).to eq(0)
    expect(rec.stats).to include(lifetime_commits_skipped_locked: 1, pending_recordings_count: 3,
      lifetime_updates_successful: updates)
    expect(rec.commit).to eq(3)
  end
end
