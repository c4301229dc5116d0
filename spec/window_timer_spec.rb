# frozen_string_literal: true

require "spec_helper"
require "open3"

# The Ruby timer thread of windowed sampling, where the native one is not used (the module exists
# on every Ruby, so this runs everywhere with the native tick stood in for). A tick runs Ruby code
# (young updates), where other threads may stop the timer and start another.
RSpec.describe DatadogHeap::WindowTimer do
  def timer_threads
    Thread.list.select { |t| t.name == "datadog_heap window timer" && t.alive? }
  end

  after { described_class.stop }

  def within(seconds)
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + seconds
    sleep 0.01 until yield || Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
    yield
  end

  it "ends a thread stopped during its tick, without writing the tick's rate back or a second thread" do
    ticks = Queue.new
    stopped = Queue.new
    stopper = nil
    allow(DatadogHeap).to receive(:_native_window_tick) do
      ticks << true
      if ticks.size == 1
        # Another thread stops the timer (and starts it again) while this tick runs.
        stopper = Thread.new do
          described_class.stop
          stopped << true
          described_class.start(500.0)
        end
        sleep 0.05
      end
      500.0
    end
    described_class.start(500.0)
    expect(within(5) { !stopped.empty? }).to be(true), "stop waited past the tick for another period or forever"
    expect(stopper.join(5)).to eq(stopper)
    expect(within(2) { timer_threads.size <= 1 }).to be(true)
    expect(timer_threads.size).to eq(1) # the restarted one only
    described_class.stop
    expect(timer_threads).to be_empty
    expect(described_class.instance_variable_get(:@rate)).to be_nil
  end
end

RSpec.describe "DatadogHeap.native_window_timer_safe?" do
  it "refuses the native timer on 3.3.0 with M:N threads only (Ruby bug #20016)" do
    expect(DatadogHeap.native_window_timer_safe?("3.3.0", {"RUBY_MN_THREADS" => "1"})).to be(false)
    expect(DatadogHeap.native_window_timer_safe?("3.3.0", {})).to be(true)
    expect(DatadogHeap.native_window_timer_safe?("3.3.1", {"RUBY_MN_THREADS" => "1"})).to be(true)
    expect(DatadogHeap.native_window_timer_safe?("3.4.1", {"RUBY_MN_THREADS" => "1"})).to be(true)
  end

  describe "signal_conflict (gems that the timer's signals break before Ruby 3.3)" do
    spec = Struct.new(:version)
    no_mysql = -> {}

    it "names rugged, an old libmysqlclient and an old passenger, and nothing from Ruby 3.3 on" do
      conflict = ->(**kw) { DatadogHeap.signal_conflict(version: "3.1.2", specs: {}, rugged: nil, mysql_info: no_mysql, passenger: nil, **kw) }
      expect(conflict.call).to be_nil
      expect(conflict.call(specs: {"rugged" => spec.new("1.7.1")})).to match(/rugged gem is loaded/)
      expect(conflict.call(mysql_info: -> { {version: "5.7.30", header_version: "5.7.30"} }))
        .to match(/mysql2 gem is loaded with libmysqlclient 5\.7\.30 .*#83109/)
      expect(conflict.call(specs: {"mysql2" => spec.new("0.5.5")})).to match(/libmysqlclient of a version not known yet/)
      expect(conflict.call(specs: {"mysql2" => spec.new("0.5.5")}, mysql_info: -> { {version: "8.0.35", header_version: "8.0.35"} })).to be_nil
      # MariaDB's connector reports its own 3.x version with 10.x+ headers.
      expect(conflict.call(mysql_info: -> { {version: "3.3.8", header_version: "11.2.2"} })).to be_nil
      expect(conflict.call(passenger: "6.0.18")).to match(/passenger 6\.0\.18 is loaded/)
      expect(conflict.call(specs: {"passenger" => spec.new(Gem::Version.new("6.0.17"))})).to match(/passenger 6\.0\.17/)
      expect(conflict.call(passenger: "6.0.19")).to be_nil
      expect(DatadogHeap.signal_conflict(version: "3.3.0", specs: {"rugged" => spec.new("1.7.1")}, rugged: nil, mysql_info: no_mysql,
        passenger: "5.0.0")).to be_nil
    end

    it "makes the default sampler the countdown, and a windowed start use the Ruby thread timer, with a warning each, " \
      "unless DATADOG_HEAP_WINDOW_TIMER is set" do
      skip "the timer sends no signals from Ruby 3.3 on" if RUBY_VERSION >= "3.3"
      script = <<~'RUBY'
        Gem.loaded_specs["rugged"] = Gem::Specification.new { |s| s.name = "rugged"; s.version = "1.7.1" }
        DatadogHeap::Recorder.new(sampler: :countdown).tap(&:start).stop # a countdown start checks nothing
        default = DatadogHeap::Recorder.new
        note = default.stats[:sampler_note]
        rec = DatadogHeap::Recorder.new(sampler: :windowed)
        rec.start
        print Marshal.dump([default.sampler, note.to_s[/countdown/], DatadogHeap._native_native_window_timer])
        rec.stop
      RUBY
      run = lambda do |env|
        out, err, status = Open3.capture3(env, RbConfig.ruby, "-I", File.expand_path("../lib", __dir__), "-rdatadog_heap", "-e", script)
        expect(status).to be_success, err
        [Marshal.load(out), err.lines.grep(/datadog_heap: the rugged/)] # rubocop:disable Security/MarshalLoad
      end
      (sampler, note, native), warnings = run.call({})
      expect([sampler, note, native]).to eq([:countdown, "countdown", false])
      expect(warnings).to contain_exactly(
        a_string_matching(/rugged gem is loaded .*, so the default sampler is the countdown here/),
        a_string_matching(/rugged gem is loaded .* timer is a Ruby thread here and sends no signals/)
      )
      (sampler, note, native), warnings = run.call({"DATADOG_HEAP_WINDOW_TIMER" => "native"})
      expect([sampler, note, native, warnings]).to eq([:windowed, nil, true, []])
    end
  end

  # The Ruby timer thread ticks about 10 times a second next to a busy thread: most windows are
  # found late and moved, and the profile says so rather than passing its estimates off as sure.
  it "says in the profile when late ticks moved many windows" do
    script = <<~'RUBY'
      rec = DatadogHeap::Recorder.new(sampler: :windowed, sample_every: 1024, max_overhead: nil)
      rec.start
      keep = []
      t = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      keep << Object.new while Process.clock_gettime(Process::CLOCK_MONOTONIC) - t < 1.0
      rec.stop
      stats = rec.stats.values_at(:sampler_window_late_allocations, :sampler_window_allocations, :sampler_windows_opened)
      print Marshal.dump([stats, DatadogHeap::Profile.parse(rec.profile).comments.grep(/woke late/)])
    RUBY
    out, err, status = Open3.capture3({"DATADOG_HEAP_WINDOW_TIMER" => "ruby"}, RbConfig.ruby, "-I", File.expand_path("../lib", __dir__),
      "-rdatadog_heap", "-e", script)
    expect(status).to be_success, err
    (late, watched, opened), notes = Marshal.load(out) # rubocop:disable Security/MarshalLoad
    expect(opened).to be >= 4
    expect(late).to be >= 2 * watched
    expect(notes.size).to eq(1)
    expect(notes.first).to match(/moved by #{late} allocations in all, against #{watched} watched/)
  end

  it "runs the timer as a Ruby thread when asked to, and it still ticks" do
    result = IO.popen([RbConfig.ruby, "-I", File.expand_path("../lib", __dir__), "-rdatadog_heap", "-e", <<~RUBY], &:read)
      DatadogHeap._native_use_ruby_timer(true)
      rec = DatadogHeap::Recorder.new(sampler: :windowed, windows_per_second: 200)
      rec.start
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 5
      keep = []
      until rec.stats[:sampler_window_ticks] >= 5 || Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
        keep << Object.new
        sleep 0.001 if keep.size % 1000 == 0
      end
      threads = Thread.list.count { |t| t.name == "datadog_heap window timer" }
      rec.stop
      print Marshal.dump([DatadogHeap._native_native_window_timer, threads, rec.stats[:sampler_window_ticks] >= 5])
    RUBY
    native, threads, opened = Marshal.load(result) # rubocop:disable Security/MarshalLoad
    expect([native, threads, opened]).to eq([false, 1, true])
  end

  # Kernel#rand draws from the process's generator, shared by every thread: a timer thread that
  # drew its jitter from it would change what `srand(seed)` promises the program.
  it "leaves the program's random numbers alone while the Ruby timer runs" do
    script = <<~'RUBY'
      rec = DatadogHeap::Recorder.new(sampler: :windowed, windows_per_second: 500, max_overhead: nil)
      rec.start
      srand(1234)
      keep = []
      drawn = Array.new(10) do
        opened = rec.stats[:sampler_window_ticks]
        deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 5
        until rec.stats[:sampler_window_ticks] >= opened + 2 || Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
          keep << Object.new
          sleep 0.001 if keep.size % 1000 == 0
        end
        rand
      end
      opened = rec.stats[:sampler_window_ticks]
      rec.stop
      print Marshal.dump([DatadogHeap._native_native_window_timer, opened, drawn])
    RUBY
    out, err, status = Open3.capture3({"DATADOG_HEAP_WINDOW_TIMER" => "ruby"}, RbConfig.ruby, "-I", File.expand_path("../lib", __dir__),
      "-rdatadog_heap", "-e", script)
    expect(status).to be_success, err
    native, opened, drawn = Marshal.load(out) # rubocop:disable Security/MarshalLoad
    expect(native).to be(false)
    expect(opened).to be >= 20 # the timer ticked between every two draws
    seeded = Random.new(1234)
    expect(drawn).to eq(Array.new(10) { seeded.rand })
  end

  # Before 3.3 the native timer thread cannot ask for the job itself: it signals the Ruby thread
  # last seen running (see windows.rs). A Ruby thread doing the sleeping gets the GVL back from a
  # CPU-bound thread only every 100 ms (about 10 ticks a second); the signal reaches the thread
  # that holds it. Counts in a fork too, where the threads seen were the parent's.
  it "ticks at the asked rate next to a CPU-bound thread, also in a forked child", :heavy do
    script = <<~RUBY
      def windows_next_to_a_busy_thread
        rec = DatadogHeap::Recorder.new(sampler: :windowed, windows_per_second: 200, max_overhead: nil)
        rec.start
        stop = false
        busy = Thread.new { x = nil; x = "x" * 8 until stop }
        sleep 2
        stop = true
        busy.join
        result = [rec.stats[:sampler_window_ticks], Thread.list.count { |t| t.name == "datadog_heap window timer" }]
        rec.stop
        result
      end
      parent = windows_next_to_a_busy_thread
      reader, writer = IO.pipe
      pid = fork { writer.write(Marshal.dump(windows_next_to_a_busy_thread)); writer.close }
      writer.close
      child = Marshal.load(reader.read) # rubocop:disable Security/MarshalLoad
      Process.wait(pid)
      print Marshal.dump([DatadogHeap._native_native_window_timer, parent, child])
    RUBY
    run = ->(env) { IO.popen(env, [RbConfig.ruby, "-I", File.expand_path("../lib", __dir__), "-rdatadog_heap", "-e", script], &:read) }
    native, parent, child = Marshal.load(run.call({})) # rubocop:disable Security/MarshalLoad
    expect(native).to be(true)
    # 400 asked in 2 s; the Ruby thread's ceiling is about 20. Before 3.3 the Ruby thread ticks
    # beside the native timer, for the times no thread holds the GVL (windows.rs, set_rate).
    beside = RUBY_VERSION < "3.3" ? 1 : 0
    expect(parent).to match([be >= 100, beside])
    expect(child).to match([be >= 100, beside])
    native, parent, = Marshal.load(run.call({"DATADOG_HEAP_WINDOW_TIMER" => "ruby"})) # rubocop:disable Security/MarshalLoad
    expect(native).to be(false)
    expect(parent).to match([be < 100, 1])
  end

  # A busy program's tick asks for the next one halfway to its next window's arming point, up to
  # the longest usual delay (1.5 periods) away, rather than at the timer's pace (windows.rs,
  # tick): each tick is a wake-up of the timer thread and, before 3.3, a signal that the program
  # pays for. With windows this far apart (1 in 2**20) that is 1 / 15 ms: about 133 ticks in 2 s
  # (129-134), where the usual pace and the hurries made 218 (218 twice).
  it "ticks a busy program whose next window is far less often than asked, waking no more than twice a tick" do
    script = <<~'RUBY'
      rec = DatadogHeap::Recorder.new(sampler: :windowed, sample_every: 2**20, windows_per_second: 100, max_overhead: nil)
      rec.start
      now = -> { Process.clock_gettime(Process::CLOCK_MONOTONIC) }
      wakes = DatadogHeap::Testing._native_window_timer_wakes
      started = now.()
      keep = []
      until now.() - started > 2
        keep << [keep.size, "x", {a: 1}]
        keep.clear if keep.size > 10_000
      end
      ticks = rec.stats[:sampler_window_ticks]
      wakes = DatadogHeap::Testing._native_window_timer_wakes - wakes
      rec.stop
      print Marshal.dump([DatadogHeap._native_native_window_timer, ticks, wakes])
    RUBY
    out, err, status = Open3.capture3(RbConfig.ruby, "-I", File.expand_path("../lib", __dir__), "-rdatadog_heap", "-e", script)
    expect(status).to be_success, err
    native, ticks, wakes = Marshal.load(out) # rubocop:disable Security/MarshalLoad
    skip "the native timer is not used on this machine" unless native
    expect(ticks).to be_between(10, 180), "#{ticks} ticks in 2 s at 100 a second asked"
    expect(wakes).to be <= 2 * ticks + 5, "the timer woke #{wakes} times for #{ticks} ticks"
  end

  # A tick judges whether the program is quiet over the stretch since the last tick that judged,
  # at least 0.5 ms long. When each tick judged only its own stretch, a program that stopped
  # allocating just short of a window's start got hurried ticks 0.2 ms apart, none long enough
  # to judge, so it stayed "busy" and ticked at 5,000 a second: 13 to 17 of 300 quiet stretches of
  # 20 ms had over 10 ticks (up to 65); none since (at most 6).
  it "goes back to the usual pace when the program stops allocating, near a window's start or not" do
    script = <<~'RUBY'
      rec = DatadogHeap::Recorder.new(sampler: :windowed, sample_every: 128, windows_per_second: 100, max_overhead: nil)
      rec.start
      now = -> { Process.clock_gettime(Process::CLOCK_MONOTONIC) }
      keep = []
      ticks = 150.times.map do
        before = rec.stats[:sampler_window_ticks]
        t = now.()
        nil while now.() - t < 0.02
        after = rec.stats[:sampler_window_ticks]
        2_000.times { keep << Object.new }
        keep.clear if keep.size > 100_000
        after - before
      end
      rec.stop
      print Marshal.dump([DatadogHeap._native_native_window_timer, ticks])
    RUBY
    out, err, status = Open3.capture3(RbConfig.ruby, "-I", File.expand_path("../lib", __dir__), "-rdatadog_heap", "-e", script)
    expect(status).to be_success, err
    native, ticks = Marshal.load(out) # rubocop:disable Security/MarshalLoad
    skip "the native timer is not used on this machine" unless native
    expect(ticks.count { |n| n > 10 }).to eq(0), "ticks in each 20 ms quiet stretch: #{ticks.tally.sort.to_h}"
  end

  # The handler is the windowed sampler's business: a process that only ever runs the countdown
  # sampler (the default), forks, and exits gets none.
  it "installs its signal handler only when a windowed sampler starts (Ruby < 3.3)" do
    skip "Ruby >= 3.3 triggers the job without a signal" if Gem::Version.new(RUBY_VERSION) >= Gem::Version.new("3.3")

    result = IO.popen([RbConfig.ruby, "-I", File.expand_path("../lib", __dir__), "-rdatadog_heap", "-e", <<~'RUBY'], &:read)
      def rt_caught
        mask = File.read("/proc/self/status")[/^SigCgt:\s*(\h+)/, 1].to_i(16)
        (34..64).select { |sig| mask[sig - 1] == 1 }
      end
      before = rt_caught
      rec = DatadogHeap::Recorder.new(sample_every: 64)
      rec.start
      keep = Array.new(10_000) { Object.new }
      reader, writer = IO.pipe
      Process.wait(fork { writer.write(Marshal.dump(rt_caught)); writer.close; exit!(0) })
      writer.close
      in_child = Marshal.load(reader.read)
      rec.stop
      countdown = rt_caught | in_child
      windowed = DatadogHeap::Recorder.new(sampler: :windowed)
      windowed.start
      after = rt_caught
      windowed.stop
      print Marshal.dump([before, countdown, after, keep.size])
    RUBY
    before, countdown, after, = Marshal.load(result) # rubocop:disable Security/MarshalLoad
    expect(countdown).to eq(before)
    expect(after - before).to contain_exactly(be_between(38, 64))
  end
end

# exec while a windowed recorder runs (the guard of lib/datadog_heap.rb before Ruby 3.3).
RSpec.describe "exec" do
  # A program that runs a windowed recorder at 20,000 windows a second beside a busy thread,
  # then execs /bin/true, 20 times in fresh processes: how many of the new programs died of a
  # signal. Before Ruby 3.3 a timer signal sent to the thread about to exec can be pending when
  # the new program starts with default handlers, and a real-time signal's default ends it.
  def signal_deaths(env = {})
    script = <<~RUBY
      rec = DatadogHeap::Recorder.new(windows_per_second: 20_000)
      rec.start
      Thread.new { o = nil; loop { o = Object.new } }
      sleep 0.02
      exec("/bin/true")
    RUBY
    lib = File.expand_path("../lib", __dir__)
    statuses = Array.new(20) do
      _, _, status = Open3.capture3(env, RbConfig.ruby, "-I", lib, "-rdatadog_heap", "-e", script)
      status
    end
    expect(statuses.reject(&:signaled?)).to all(be_success)
    statuses.count(&:signaled?)
  end

  it "never lets a timer signal end the program exec started" do
    expect(signal_deaths).to eq(0)
  end

  it "is what keeps it alive before Ruby 3.3 (DATADOG_HEAP_EXEC_GUARD=0 leaves exec alone)" do
    skip "the timer sends no signals from Ruby 3.3 on" if Gem::Version.new(RUBY_VERSION) >= Gem::Version.new("3.3")
    # 37 of 40 died this way when it was measured.
    expect(signal_deaths("DATADOG_HEAP_EXEC_GUARD" => "0")).to be > 0
  end

  # A failed exec returns (raises): the timer, stopped for it, runs again, and each form of
  # exec keeps its visibility and its arguments (environment, options), and this process's.
  it "stops the timer while exec runs and starts it again when exec fails" do
    skip "exec is left alone from Ruby 3.3 on (no signals)" if Gem::Version.new(RUBY_VERSION) >= Gem::Version.new("3.3")
    rec = DatadogHeap::Recorder.new(windows_per_second: 50)
    rec.start
    cwd = Dir.pwd
    seen = []
    program = Object.new
    # exec converts its arguments after the guard stopped the timer.
    program.define_singleton_method(:to_str) do
      seen << DatadogHeap::Testing._native_hooks[2]
      "/nonexistent/datadog_heap-exec-spec"
    end
    expect { exec(program) }.to raise_error(Errno::ENOENT)
    expect { Kernel.exec({"X" => "1"}, program, "arg") }.to raise_error(Errno::ENOENT)
    # An option that changes nothing: a failed exec keeps what options like chdir: did.
    expect { Process.exec(program, close_others: false) }.to raise_error(Errno::ENOENT)
    expect(seen).to eq([nil, nil, nil])
    expect(DatadogHeap::Testing._native_hooks[2]).to eq(50.0)
    expect([Dir.pwd, ENV["X"]]).to eq([cwd, nil])
    expect { Object.new.exec("true") }.to raise_error(NoMethodError, /private method/)
  ensure
    rec&.stop
  end
end

# Before Ruby 3.3 the native timer reaches the VM by a signal to the thread that holds the GVL;
# a tick that finds no such thread (all wait on IO, locks, sleeps) goes to the Ruby timer thread,
# which waits for it without the GVL. It must take those ticks, and only those: in a busy
# program it ticking on its own pace beside the signals cost a hundred GVL hand-overs a second.
RSpec.describe "the Ruby timer thread beside the native timer (before Ruby 3.3)" do
  before { skip "from Ruby 3.3 the native timer needs no Ruby thread" if Gem::Version.new(RUBY_VERSION) >= Gem::Version.new("3.3") }

  it "ticks when every thread waits, and stays asleep while a thread holds the GVL" do
    script = <<~'RUBY'
      rec = DatadogHeap::Recorder.new(sampler: :windowed, windows_per_second: 200, max_overhead: nil)
      rec.start
      now = -> { Process.clock_gettime(Process::CLOCK_MONOTONIC) }
      handed = -> { DatadogHeap::Testing._native_window_signals[2] }
      ticks = -> { rec.stats[:sampler_window_ticks] }
      sleep 0.05
      h0, t0 = handed.(), ticks.()
      deadline = now.() + 0.5
      x = Object.new while now.() < deadline # holds the GVL throughout
      busy = [handed.() - h0, ticks.() - t0]
      h1, t1 = handed.(), ticks.()
      sleep 0.5
      idle = [handed.() - h1, ticks.() - t1]
      rec.stop
      print Marshal.dump([DatadogHeap._native_native_window_timer, busy, idle])
    RUBY
    out, err, status = Open3.capture3(RbConfig.ruby, "-I", File.expand_path("../lib", __dir__), "-rdatadog_heap", "-e", script)
    expect(status).to be_success, err
    native, (busy_handed, busy_ticks), (idle_handed, idle_ticks) = Marshal.load(out) # rubocop:disable Security/MarshalLoad
    skip "the native timer is not used on this machine" unless native
    # 200 ticks a second asked: about 100 in each half second.
    expect(busy_ticks).to be > 30, "the signals delivered #{busy_ticks} ticks to the busy thread"
    expect(busy_handed).to be <= 3
    expect(idle_handed).to be > 30
    expect(idle_ticks).to be >= idle_handed
  end

  # The waiting thread holds no GVL and times out only after a second: `stop` must end its wait
  # at once (its unblocking function, or the stopped timer's own word), whether the program
  # sleeps or runs.
  it "lets stop end the Ruby thread's wait at once" do
    script = <<~'RUBY'
      rec = DatadogHeap::Recorder.new(sampler: :windowed, max_overhead: nil)
      now = -> { Process.clock_gettime(Process::CLOCK_MONOTONIC) }
      took = Array.new(20) do |i|
        rec.start
        i.even? ? sleep(0.01) : (t = now.(); x = Object.new while now.() - t < 0.01)
        t = now.()
        rec.stop
        now.() - t
      end
      alive = Thread.list.count { |t| t.name == "datadog_heap window timer" && t.alive? }
      print Marshal.dump([DatadogHeap._native_native_window_timer, took.max, alive])
    RUBY
    out, err, status = Open3.capture3(RbConfig.ruby, "-I", File.expand_path("../lib", __dir__), "-rdatadog_heap", "-e", script)
    expect(status).to be_success, err
    native, slowest, alive = Marshal.load(out) # rubocop:disable Security/MarshalLoad
    skip "the native timer is not used on this machine" unless native
    expect(slowest).to be < 0.5
    expect(alive).to eq(0)
  end
end
