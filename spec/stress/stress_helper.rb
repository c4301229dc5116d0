# frozen_string_literal: true

require "io/wait"
require "tempfile"
require "timeout"
require "zlib"

# Helpers for the stress specs (tagged :stress; `rake spec:stress` runs them, `rake spec` leaves
# them out). Every scenario runs in a forked child with a deadline: a crash or a deadlock in the
# child (which a Timeout in the same process cannot interrupt when it sits in native code) fails
# the example with the last progress the child reported, and never takes rspec down with it.
module StressHelpers
  class ChildFailed < StandardError; end

  # Multiplies every child's deadline: STRESS_DEADLINE_SCALE=10 under qemu-user emulation (about
  # ten times slower than native; bin/arm64-check sets it), 1 otherwise.
  DEADLINE_SCALE = Float(ENV.fetch("STRESS_DEADLINE_SCALE", "1"))

  # For a before(:context) that boots the example service (examples/service/cluster.rb): skips
  # where the tools are missing in a Ruby chroot (.ci/run's have no puma), fails on the host,
  # where bin/setup --dev installs them.
  def require_service_tools
    missing = ServiceCluster.missing_tools
    return if missing.empty?

    skip "#{missing.join(", ")} not installed in this chroot" if ENV["RUBY_CHROOT"]
    raise "#{missing.join(", ")} not installed: run bin/setup --dev"
  end

  # Runs the block in a forked child and returns its (Marshal-able) value. The block gets a
  # `progress` callable: each call's text is kept, and the last ones are shown if the child
  # crashes or is still running after `seconds` (then it is killed). An exception in the child is
  # re-raised here with its class, message, backtrace and the child's `@rec.debug`.
  def in_child(seconds, &block)
    seconds *= DEADLINE_SCALE
    reader, writer = IO.pipe
    pid = fork do
      Process.setpgid(0, 0) # so a deadline kills the child's own children too
      reader.close
      writer.sync = true
      send_msg = ->(*msg) { writer.write([Marshal.dump(msg)].pack("m0") + "\n") }
      progress = ->(text) { send_msg.call(:progress, text.to_s) }
      begin
        value = instance_exec(progress, &block)
        send_msg.call(:result, value)
        writer.close
        exit!(0)
      rescue Exception => e # rubocop:disable Lint/RescueException -- the child reports everything
        send_msg.call(:error, e.class.name, e.message, e.backtrace&.first(15), debug_text)
        writer.close
        exit!(1)
      end
    end
    writer.close
    collect_child(pid, reader, seconds)
  ensure
    reader&.close unless reader&.closed?
  end

  # The state of the recorder the scenario keeps in @rec, for failure messages.
  def debug_text(rec = @rec)
    return "(no recorder)" unless rec

    records, state = rec.debug
    "recorder.debug: #{records[1].size} records, first: #{records[1].first(5).inspect}\nstate: #{state[1].inspect}"
  rescue Exception => e # rubocop:disable Lint/RescueException
    "(recorder.debug raised #{e.class}: #{e.message})"
  end

  # Prints what a scenario measured when STRESS_VERBOSE=1 (the numbers the issue note quotes).
  def report(label, values)
    warn "[stress] #{label}: #{values.inspect}" if ENV["STRESS_VERBOSE"] == "1"
  end

  def monotonic
    Process.clock_gettime(Process::CLOCK_MONOTONIC)
  end

  # Loops the block until `seconds` have passed (at least once); returns the iteration count.
  def for_seconds(seconds)
    deadline = monotonic + seconds
    n = 0
    loop do
      yield n
      n += 1
      break if monotonic >= deadline
    end
    n
  end

  # A gzip pprof we wrote decodes: gunzip works and it names the sample type.
  # DatadogHeap::Profile.load (the CLI helper's reader) is used as well when it exists.
  def decodes?(gz)
    raw = Zlib.gunzip(gz)
    return false unless raw.include?("heap-live-samples")

    if defined?(DatadogHeap::Profile) && DatadogHeap::Profile.respond_to?(:load)
      Tempfile.create(["heap", ".pb.gz"]) do |f|
        f.binmode
        f.write(gz)
        f.close
        DatadogHeap::Profile.load(f.path)
      end
    end
    true
  end

  # `rss_kb` of this process, from /proc (nil where there is no /proc).
  def rss_kb(pid = Process.pid)
    File.read("/proc/#{pid}/status")[/^VmRSS:\s+(\d+)/, 1]&.to_i
  rescue Errno::ENOENT
    nil
  end

  # Records `count` objects that stay alive, each at one of `sites` call sites; returns them.
  def track_many(rec, count, sites: 50, prefix: "site")
    Array.new(count) do |i|
      obj = (i % 3).zero? ? "s#{i}" : Object.new
      rec.record_allocation(obj, weight: 1, class_name: obj.class.name,
        locations: [["#{prefix}#{i % sites}", "/app/#{prefix}.rb", i % sites], ["<main>", "/app/main.rb", 1]])
      rec.commit if (i % 200) == 199
      obj
    end.tap { rec.commit }
  end

  private

  def collect_child(pid, reader, seconds)
    deadline = monotonic + seconds
    buffer = +""
    log = []
    result = error = nil
    loop do
      remaining = deadline - monotonic
      kill_child(pid, seconds, log) if remaining <= 0
      next unless reader.wait_readable(remaining)

      chunk = reader.read_nonblock(65_536, exception: false)
      break if chunk.nil?
      next unless chunk.is_a?(String)

      buffer << chunk
      while (line = buffer.slice!(/\A[^\n]*\n/))
        kind, *rest = Marshal.load(line.chomp.unpack1("m0")) # rubocop:disable Security/MarshalLoad
        case kind
        when :progress then log << rest.first
        when :result then result = [rest.first]
        when :error then error = rest
        end
      end
    end
    status = nil
    until (status = Process.wait2(pid, Process::WNOHANG)&.last)
      kill_child(pid, seconds, log) if monotonic > deadline
      sleep 0.01
    end
    if error
      klass, message, backtrace, debug = error
      raise ChildFailed, "child raised #{klass}: #{message}\n  #{Array(backtrace).join("\n  ")}\n#{debug}\n" \
        "Last progress: #{log.last(8).inspect}"
    end
    unless status.success? && result
      raise ChildFailed, "child died (#{status.inspect}) without a result. Last progress: #{log.last(8).inspect}"
    end

    result.first
  end

  # Kills the child's whole process group (its own children too) and fails.
  def kill_child(pid, seconds, log)
    begin
      Process.kill(:KILL, -pid)
    rescue Errno::ESRCH, Errno::EPERM
      Process.kill(:KILL, pid)
    end
    Process.wait(pid)
    raise ChildFailed, "child still running after #{seconds}s (deadlock?), killed. Last progress: #{log.last(8).inspect}"
  end
end

RSpec.configure do |config|
  config.include StressHelpers, stress: true
end
