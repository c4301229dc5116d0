# frozen_string_literal: true

require "tmpdir"
require_relative "stress_helper"

RSpec.describe "fork", :stress do
  # Waits for `pid` until `deadline`; kills it past that. Returns :ok, :failed or :hung.
  def reap(pid, deadline)
    loop do
      _, status = Process.wait2(pid, Process::WNOHANG)
      return status.success? ? :ok : :failed if status

      if monotonic > deadline
        Process.kill(:KILL, pid)
        Process.wait(pid)
        return :hung
      end
      sleep 0.01
    end
  end

  it "a child forked while another thread builds a profile can record, iterate and profile" do
    seconds = Float(ENV.fetch("STRESS_FORK_SECONDS", "20"))
    result = in_child(seconds + 90) do |progress|
      @rec = manual_recorder
      # Many distinct names: the encoder spends a while copying them out of the string storage,
      # which is the moment a fork must not inherit a lock held by a thread the child lacks.
      keep = track_many(@rec, 60_000, sites: 60_000, prefix: "distinct_site_name_")
      GC.start
      t0 = monotonic
      @rec.each_live_object { break }
      prepare = monotonic - t0
      t0 = monotonic
      @rec.profile
      encode = [monotonic - t0 - prepare, 0.001].max
      progress.call("prepare #{prepare.round(3)}s, encode #{encode.round(3)}s")
      outcomes = Hash.new(0)
      rounds = for_seconds(seconds) do |round|
        started = Queue.new
        profiler = Thread.new do
          started << true
          @rec.profile
        end
        started.pop
        # Aim at the encoding phase (GVL released), sometimes at the update before it.
        sleep(round.even? ? prepare + rand * encode : rand * (prepare + encode))
        pid = fork do
          obj = Object.new
          @rec.record_allocation(obj, locations: [["child", "/c.rb", 1]])
          @rec.commit
          @rec.each_live_object { break }
          exit!(@rec.stats[:num_object_records] >= keep.size ? 0 : 2)
        end
        outcomes[reap(pid, monotonic + 15)] += 1
        profiler.join
        progress.call("round #{round}: #{outcomes.inspect}")
      end
      [rounds, outcomes, keep.size]
    end
    rounds, outcomes, = result
    report("fork during profile", rounds: rounds, outcomes: outcomes)
    expect(outcomes).to eq(ok: rounds)
  end

  it "forks inside each_live_object: the child can iterate and profile, the parent's iteration completes" do
    result = in_child(60) do
      @rec = manual_recorder
      keep = track_many(@rec, 500, sites: 5)
      GC.start
      seen = 0
      child_outcomes = []
      @rec.each_live_object do
        seen += 1
        next unless seen == 10 || seen == 20

        reader, writer = IO.pipe
        pid = fork
        if pid.nil?
          reader.close
          r = [@rec.each_live_object.count, decodes?(@rec.profile)]
          extra = Object.new
          r << @rec.record_allocation(extra, locations: [["child", "/c.rb", 1]]) << @rec.commit
          writer.write(Marshal.dump(r))
          writer.close
          exit!(0) if seen == 10
          # The second child carries on with the outer iteration, then checks the recorder.
          @in_forked_child = true
          next
        end
        writer.close
        child_outcomes << [Marshal.load(reader.read), reap(pid, monotonic + 20)] # rubocop:disable Security/MarshalLoad
        reader.close
      end
      if @in_forked_child
        ok = @rec.each_live_object.count == keep.size && decodes?(@rec.profile)
        exit!(ok ? 0 : 3)
      end
      [seen, child_outcomes, @rec.each_live_object.count, decodes?(@rec.profile), keep.size]
    end
    seen, child_outcomes, after, decodes, kept = result
    expect(seen).to eq(kept)
    expect(child_outcomes).to eq([[[kept, true, true, 1], :ok], [[kept, true, true, 1], :ok]])
    expect([after, decodes]).to eq([kept, true])
  end

  it "survives a storm of 20 children, each sampling and writing a profile that decodes" do
    result = in_child(90) do |progress|
      @rec = DatadogHeap::Recorder.new(sampler: :countdown, sample_every: 8, max_overhead: nil)
      keep = Array.new(2_000) { |i| "parent#{i}" }
      @rec.start
      Dir.mktmpdir do |dir|
        pids = Array.new(20) do |i|
          keep.concat(Array.new(200) { Object.new }) # the parent keeps sampling between forks
          fork do
            mine = Array.new(2_000) { |j| "child#{i}-#{j}" }
            GC.start
            @rec.write_profile(File.join(dir, "child#{i}.pb.gz"))
            exit!(mine.size == 2_000 ? 0 : 1)
          end
        end
        progress.call("forked 20")
        deadline = monotonic + 60
        outcomes = pids.map { |pid| reap(pid, deadline) }
        files = Dir.children(dir).sort
        decoded = files.count { |f| decodes?(File.binread(File.join(dir, f))) }
        @rec.stop
        [outcomes.tally, files.size, decoded, @rec.stats[:sampler_hook_errors], keep.size]
      end
    end
    outcomes, files, decoded, hook_errors, = result
    expect(outcomes).to eq(ok: 20)
    expect([files, decoded, hook_errors]).to eq([20, 20, 0])
  end

  it "a daemon-like double fork keeps a working recorder in the grandchild" do
    result = in_child(60) do
      @rec = DatadogHeap::Recorder.new(sampler: :countdown, sample_every: 4, max_overhead: nil)
      @rec.start
      Dir.mktmpdir do |dir|
        path = File.join(dir, "daemon.pb.gz")
        pid = fork do
          Process.setsid
          fork do
            keep = Array.new(5_000) { |i| "daemon#{i}" }
            GC.start
            @rec.write_profile(path)
            exit!(keep.size == 5_000 ? 0 : 1)
          end
          exit!(0) # the intermediate process leaves at once, as daemonizers do
        end
        middle = reap(pid, monotonic + 10)
        deadline = monotonic + 30
        sleep 0.05 until File.exist?(path) || monotonic > deadline
        [middle, File.exist?(path) && decodes?(File.binread(path)), File.exist?(path) && Zlib.gunzip(File.binread(path)).include?("String")]
      end
    end
    expect(result).to eq([:ok, true, true])
  end

  it "Process.daemon resets the recorder as fork does (lock, iteration, lifetime stats)" do
    result = in_child(60) do
      @rec = manual_recorder
      keep = track_many(@rec, 100, sites: 2)
      GC.start
      @rec.each_live_object { nil }
      Dir.mktmpdir do |dir|
        path = File.join(dir, "daemon.out")
        before = @rec.stats[:lifetime_updates_successful]
        pid = fork do
          @rec.each_live_object { nil } # this process's own lifetime stats: one update
          Process.daemon(true, true)
          stats = @rec.stats
          File.write("#{path}.tmp", Marshal.dump([stats[:lifetime_updates_successful], @rec.each_live_object.count, decodes?(@rec.profile)]))
          File.rename("#{path}.tmp", path)
          exit!(0)
        end
        reap(pid, monotonic + 10)
        deadline = monotonic + 30
        sleep 0.05 until File.exist?(path) || monotonic > deadline
        [before, File.exist?(path) && Marshal.load(File.binread(path)), keep.size] # rubocop:disable Security/MarshalLoad
      end
    end
    before, (daemon_updates, live, decodes), kept = result
    expect(before).to be >= 1
    expect([live, decodes]).to eq([kept, true])
    # As in a forked child (after_fork ran): the lifetime counters start over.
    expect(daemon_updates).to eq(0)
  end
end
