# frozen_string_literal: true

require "spec_helper"
require "json"
require "open3"

# Before Ruby 3.3 the native window timer signals the thread that holds the GVL, which the gem
# finds at load by probing the VM's private structs (ext/datadog_heap/src/shims/gvl_owner.rs).
# Each example runs in a fresh process, so the load (and the probe) is the one under test.
RSpec.describe "the native window timer before Ruby 3.3" do
  before { skip "from Ruby 3.3 on the timer needs no probe and sends no signal" if RUBY_VERSION >= "3.3" }

  FIXTURE = File.expand_path("fixtures/three_sites.rb", __dir__)

  def run_fixture(mode)
    out, err, status = Open3.capture3(RbConfig.ruby, "-I", File.expand_path("../lib", __dir__), FIXTURE, mode)
    expect(status).to be_success, err
    JSON.parse(out.lines.last, symbolize_names: true)
  end

  it "reads no more of a thread's struct than the struct, also when loaded from a thread that is not the main one" do
    # A thread that never ran a Fiber has its 1 MiB VM stack counted in its memsize: the probe
    # once took that as the struct's size and read up to 2 KiB past a ~376-byte struct.
    result = run_fixture("thread")
    found, _tid_offset, read, = result[:probe]
    expect(found).to be(true)
    expect(result[:thread_memsize]).to be > 1_000_000 # the case that misled the old bound
    expect(read).to be > 0
    expect(read).to be <= result[:main_memsize] - 40 # the struct, without the object's slot
  end

  it "ticks at the rate asked for when the gem is first loaded in a child of fork" do
    # Before 3.3 a forked thread's struct keeps the parent's kernel id; the probe looked for the
    # child's own id there, found nothing, and the child fell back to the Ruby timer (7 ticks a
    # second of the 1000 asked for next to a busy loop, against 600-800 in the parent).
    parent = run_fixture("parent")
    child = run_fixture("child")
    expect(parent[:probe].first(1) + parent[:probe].last(1)).to eq([true, false])
    expect(child[:probe].first(1) + child[:probe].last(1)).to eq([true, true]) # found, and the fork seen
    expect([parent[:window_timer], child[:window_timer]]).to eq(%w[native native])
    expect(child[:ticks_per_second]).to be >= parent[:ticks_per_second] / 2.0,
      "ticks a second: parent #{parent[:ticks_per_second]}, child #{child[:ticks_per_second]}"
    # In both, each kept site's estimate is within 4 of its own ± of the truth (the ± a report
    # prints, which counts each window's samples as one draw).
    [parent, child].each do |run|
      run[:kept].each do |site, kept|
        sd = run[:stddevs][site]
        expect(sd).not_to be_nil, "#{site}: no row (#{run.inspect})"
        expect((run[:estimates][site] - kept).abs).to be <= 4 * sd,
          "#{site} kept #{kept}: estimated #{run[:estimates][site]} ± #{sd.round}"
      end
    end
  end

  it "stops signalling, and says so once, when the program replaces the timer's signal handler" do
    # The default action of a real-time signal ends the process: before this check the next
    # timer signal after SIG_DFL killed it.
    script = <<~'RUBY'
      require "fiddle"
      rec = DatadogHeap::Recorder.new(sampler: :windowed, windows_per_second: 1000, max_overhead: nil)
      rec.start
      busy = ->(seconds) { t = Process.clock_gettime(Process::CLOCK_MONOTONIC); x = Object.new while Process.clock_gettime(Process::CLOCK_MONOTONIC) - t < seconds }
      busy.(0.3)
      sig = DatadogHeap::Testing._native_window_signal_number
      signal = Fiddle::Function.new(Fiddle::Handle::DEFAULT["signal"], [Fiddle::TYPE_INT, Fiddle::TYPE_VOIDP], Fiddle::TYPE_VOIDP)
      signal.call(sig, 0) # SIG_DFL
      asked = DatadogHeap::Testing._native_window_signals.first
      busy.(0.5)
      stats = rec.stats
      print Marshal.dump([asked, DatadogHeap::Testing._native_window_signals.first, stats[:window_timer], stats[:window_timer_note].to_s[/replaced/]])
      rec.stop
    RUBY
    out, err, status = Open3.capture3(RbConfig.ruby, "-I", File.expand_path("../lib", __dir__), "-rdatadog_heap", "-e", script)
    expect(status).to be_success, "#{status.inspect}: #{err}"
    asked_before, asked_after, timer, note = Marshal.load(out) # rubocop:disable Security/MarshalLoad
    expect(asked_before).to be > 0
    expect(asked_after).to eq(asked_before) # no signal after the handler changed
    expect([timer, note]).to eq(%w[ruby replaced])
    expect(err.lines.grep(/replaced the handler of the timer's signal/).size).to eq(1)
  end
end
