# frozen_string_literal: true

require_relative "datadog_heap/version"

# Sampling live-heap recorder for CRuby, written in Rust (see README.md).
module DatadogHeap
  # Recorder misuse and internal inconsistencies. A RuntimeError, so code that rescues the
  # reference recorder's RuntimeError keeps working.
  class Error < RuntimeError; end

  # Rubies whose ObjectSpace::WeakMap GC.compact can corrupt (https://bugs.ruby-lang.org/issues/19529).
  WEAK_MAP_COMPACTION_BUG = Gem::Requirement.new([">= 3.1.0", "< 3.1.4"]).satisfied_by?(Gem::Version.new(RUBY_VERSION)) ||
    Gem::Requirement.new([">= 3.2.0", "< 3.2.3"]).satisfied_by?(Gem::Version.new(RUBY_VERSION))

  @warned_about_ruby_version = false

  # Warns once per process when this Ruby has the WeakMap compaction bug.
  def self.warn_about_ruby_version
    return if @warned_about_ruby_version || !WEAK_MAP_COMPACTION_BUG

    @warned_about_ruby_version = true
    warn "datadog_heap: Ruby #{RUBY_VERSION} has bug #19529 (GC.compact can corrupt ObjectSpace::WeakMap, " \
      "which tracks live objects); avoid GC.compact or use Ruby >= 3.1.4 / >= 3.2.3"
  end

  # The window timer of the windowed sampler where the native one is not used (Ruby 3.3.0 with M:N
  # threads, no free real-time signal before 3.3, or DATADOG_HEAP_WINDOW_TIMER=ruby; see
  # ext/datadog_heap/src/runtime/windows.rs): a Ruby thread that sleeps a random time (uniform
  # between 0.5 and 1.5 times 1 / rate, as the native timer), then runs one tick, until no
  # windowed recorder runs. Next to a CPU-bound thread it gets the GVL back only every 100 ms.
  # Before Ruby 3.3 it also runs beside the native timer, whose signals reach only a thread that
  # holds the GVL: there it waits, without the GVL, for the ticks the native timer could not
  # deliver (every thread waiting on IO), and keeps no time of its own. Started, retuned and
  # stopped by the extension; one per process.
  module WindowTimer
    @thread = nil
    @rate = nil
    # Bumped by every start of a thread and every stop: a thread whose generation is no longer
    # current ends at its next turn, and never writes its tick's rate back. A tick runs Ruby code
    # (young updates) where other threads may run, stop the timer and start another meanwhile.
    @generation = 0

    class << self
      def start(rate)
        @rate = rate
        return if @thread&.alive?

        generation = (@generation += 1)
        @thread = Thread.new { run(generation) }
        @thread.name = "datadog_heap window timer"
        @thread.report_on_exception = false
      end

      # Stops the thread and waits for it. Not Thread#kill: the thread may be running one of the
      # extension's postponed jobs, where a kill would be swallowed (and kept as a job error);
      # woken from its sleep, it sees it is no longer current and returns.
      def stop
        thread = @thread
        @thread = nil
        @rate = nil
        @generation += 1
        return unless thread&.alive?

        begin
          thread.wakeup
        rescue ThreadError
          # It ended meanwhile.
        end
        thread.join unless thread == Thread.current
      end

      private

      # The jitter comes from a Random of this thread's own: Kernel#rand would draw from the
      # program's generator and change what `srand(seed); rand` gives it.
      def run(generation)
        random = Random.new
        while @generation == generation && (rate = @rate)
          handed = DatadogHeap._native_window_timer_wait
          sleep((0.5 + random.rand) / rate) if handed.nil?
          break unless @generation == generation
          next if handed == false # woken without a tick (stop, or a second passed)

          next_rate = DatadogHeap._native_window_tick
          @rate = next_rate if @generation == generation
          DatadogHeap.warn_about_window_timer
        end
      end
    end
  end

  # Whether the windowed sampler's timer may be a native thread here: not on Ruby 3.3.0 with M:N
  # threads (RUBY_MN_THREADS=1), where triggering a postponed job from a native thread crashes
  # the VM (Ruby bug #20016, fixed in 3.3.1). The timer is then a Ruby thread, as before 3.3.
  def self.native_window_timer_safe?(version = RUBY_VERSION, env = ENV)
    !(version == "3.3.0" && env["RUBY_MN_THREADS"] == "1")
  end

  # Why the window timer should not send signals in this process, or nil. Before Ruby 3.3 the
  # native timer signals the Ruby threads (see docs/samplers.md), and a signal can make a system
  # call fail with EINTR; some native libraries then fail the operation instead of retrying it.
  # These are the ones Datadog's profiler, which signals too, turns its signals off for:
  # - rugged (libgit2): some operations fail when interrupted;
  # - mysql2 over a libmysqlclient before 8.0.0 (MySQL bug #83109: a query fails when a signal
  #   interrupts it), or of a version that cannot be read because Mysql2::Client is not loaded yet;
  #   MariaDB's client (version < 5, headers >= 10) is fine;
  # - passenger before 6.0.19.
  # From Ruby 3.3 on the timer sends no signals: nil. The keywords are for the specs.
  def self.signal_conflict(version: RUBY_VERSION, specs: Gem.loaded_specs, rugged: defined?(::Rugged),
    mysql_info: -> { ::Mysql2::Client.info if defined?(::Mysql2::Client) && ::Mysql2::Client.respond_to?(:info) },
    passenger: (::PhusionPassenger::VERSION_STRING if defined?(::PhusionPassenger::VERSION_STRING)))
    return nil if Gem::Version.new(version) >= Gem::Version.new("3.3")

    return "the rugged gem is loaded (some of its operations fail when a signal interrupts them)" if specs["rugged"] || rugged

    info = mysql_info.call
    if specs["mysql2"] || info
      client = info && info[:version] && Gem::Version.new(info[:version])
      headers = info && info[:header_version] && Gem::Version.new(info[:header_version])
      mariadb = client && headers && client < Gem::Version.new("5") && headers >= Gem::Version.new("10")
      unless mariadb || (client && client >= Gem::Version.new("8.0.0"))
        return "the mysql2 gem is loaded with libmysqlclient #{client || "of a version not known yet"} (before 8.0.0 " \
          "a query fails when a signal interrupts it, MySQL bug #83109)"
      end
    end

    passenger ||= specs["passenger"]&.version&.to_s
    if passenger && Gem::Version.new(passenger) < Gem::Version.new("6.0.19")
      return "passenger #{passenger} is loaded (before 6.0.19 it fails when a signal interrupts it)"
    end

    nil
  end

  # Called by the first start of a windowed recorder, before its timer exists: where
  # signal_conflict names a reason (and DATADOG_HEAP_WINDOW_TIMER is not set), the timer becomes
  # a Ruby thread, which sends no signals, with a warning. A gem loaded after that first start is
  # not seen. DATADOG_HEAP_WINDOW_TIMER=native skips the check.
  def self.check_window_signals
    return if @window_signals_checked

    @window_signals_checked = true
    return if ENV["DATADOG_HEAP_WINDOW_TIMER"].to_s != ""

    reason = signal_conflict
    return unless reason

    use_ruby_timer(reason)
    warn "datadog_heap: #{reason}; the windowed sampler's timer is a Ruby thread here and sends no signals " \
      "(about 10 ticks a second next to a busy thread; DATADOG_HEAP_WINDOW_TIMER=native sends them anyway)"
  end

  # Makes the window timer the Ruby thread for good, and keeps why (nil: the user asked for it
  # with DATADOG_HEAP_WINDOW_TIMER=ruby).
  def self.use_ruby_timer(reason)
    @ruby_timer_reason = reason
    _native_use_ruby_timer(true)
  end

  # Why the windowed sampler's timer cannot tick at the rate asked for in a busy program here, or
  # nil: its timer would be a Ruby thread (about 10 ticks a second next to a thread that never
  # waits) because of this Ruby, a loaded gem that its signals would break, no free signal, or a
  # program that replaced the signal's handler. DATADOG_HEAP_WINDOW_TIMER=ruby (the user's own
  # choice) is not a problem here, and =native skips the check for gems.
  def self.window_timer_problem
    return @ruby_timer_reason if @ruby_timer_reason

    forced = ENV["DATADOG_HEAP_WINDOW_TIMER"].to_s
    return nil if forced == "ruby"

    conflict = signal_conflict if forced == ""
    conflict || _native_window_timer_problem
  end

  # The default sampler where the windowed one cannot keep its rate (window_timer_problem): the
  # countdown, at the interval asked, with one warning per process. Returns the note the
  # recorder keeps in its stats and profiles, or nil when the windowed sampler can run as asked.
  def self.default_sampler_fallback(sample_every)
    problem = window_timer_problem
    return nil unless problem

    note = "datadog_heap: #{problem}, so the default sampler is the countdown here (1 in #{sample_every}, " \
      "every allocation through the VM's slow path, about +25 ns each) rather than windows at about 10 a " \
      "second, whose estimates would be off; pass sampler: :windowed to keep windows anyway"
    unless @warned_sampler_fallback
      @warned_sampler_fallback = true
      warn note
    end
    note
  end

  # Warns once when the native window timer stops reaching the VM while windows are wanted (the
  # program replaced the handler of its signal). Called by the Ruby timer thread after each tick.
  def self.warn_about_window_timer
    return if @warned_window_timer

    problem = _native_window_timer_problem
    return unless problem

    @warned_window_timer = true
    warn "datadog_heap: #{problem}; windows are timed by a Ruby thread from now on (about 10 ticks a second " \
      "next to a busy thread, too few to arm them in time), so estimates are rougher (stats[:window_timer_note], " \
      "the profiles' notes)"
  end

  # Stops the window timer around `exec` (Kernel#exec, Kernel.exec, Process.exec) before Ruby
  # 3.3, where the timer signals Ruby threads: a signal sent just before the exec can arrive
  # after it, in the new program, where a real-time signal with no handler ends the process
  # (puma's restart on SIGUSR1 died so). Only a failed exec returns, and the timer then goes on.
  # Nothing else changes: the hooks and the recorders stay as they were.
  def self.around_exec
    _native_before_exec
    yield
  ensure
    _native_after_failed_exec
  end

  # For the module functions Kernel.exec and Process.exec.
  module ExecGuard
    ruby2_keywords def exec(*args, &block)
      DatadogHeap.around_exec { super }
    end
  end

  # For Kernel#exec: the same method, private like the one it stands in front of.
  module KernelExecGuard
    include ExecGuard
    private :exec
  end

  # Stops all sampling before the first Ractor starts: allocation hooks are not Ractor-safe (on
  # Ruby 3.1 the VM itself crashes when a NEWOBJ hook runs while a Ractor allocates).
  module RactorGuard
    def new(*args, **kwargs, &block)
      DatadogHeap._native_ractors_starting
      super
    end
  end
end

require_relative "datadog_heap/compat"
DatadogHeap::Compat.check_main_ractor!

# A build for this Ruby's minor version first (`rake compile` and precompiled gems put it there),
# then the one `gem install` compiles.
begin
  require "datadog_heap/#{RUBY_VERSION[/\d+\.\d+/]}/datadog_heap"
rescue LoadError
  begin
    require "datadog_heap/datadog_heap"
  rescue LoadError => e
    # A precompiled gem on a Ruby it has no extension for: say which it has and what to do.
    built = Dir[File.join(__dir__, "datadog_heap", "*", "datadog_heap.{so,bundle}")].map { |f| File.basename(File.dirname(f)) }.sort
    raise e if built.empty?

    raise LoadError, "datadog_heap has no extension for Ruby #{RUBY_VERSION} here (it has one for Ruby " \
      "#{built.join(", ")}): install the source gem, which compiles one (`gem install datadog_heap --platform ruby`; " \
      "needs cargo), or in a checkout run `rake compile` (#{e.message})"
  end
end

if ENV["DATADOG_HEAP_WINDOW_TIMER"] == "ruby"
  DatadogHeap.use_ruby_timer(nil)
elsif !DatadogHeap.native_window_timer_safe?
  DatadogHeap.use_ruby_timer("Ruby 3.3.0 with RUBY_MN_THREADS=1 crashes when a native thread triggers a postponed job (bug #20016)")
  warn "datadog_heap: Ruby 3.3.0 with RUBY_MN_THREADS=1 has bug #20016 (a postponed job triggered from a " \
    "native thread crashes the VM); the windowed sampler's timer is a Ruby thread here (fixed in 3.3.1)"
end

require_relative "datadog_heap/fork_hooks"
require_relative "datadog_heap/recorder"
require_relative "datadog_heap/profile"

# In a forked child, every recorder drops what the parent tracked and starts afresh (the RSS
# watches of the parent's recorders restart after, see RssWatch).
DatadogHeap::ForkHooks.register(:recorders, DatadogHeap::ForkHooks::RECORDERS) { DatadogHeap._native_after_fork_all }

# Registered first, so it runs after every at_exit handler the program registers: profiles written
# at exit are still sampled up to then, and no timer outlives the program.
at_exit { DatadogHeap._native_shutdown }
Ractor.singleton_class.prepend(DatadogHeap::RactorGuard) if defined?(Ractor)
# DATADOG_HEAP_EXEC_GUARD=0 leaves exec alone (then an exec while a windowed recorder runs can end
# the new program with the timer's signal).
if Gem::Version.new(RUBY_VERSION) < Gem::Version.new("3.3") && ENV["DATADOG_HEAP_EXEC_GUARD"] != "0"
  Kernel.prepend(DatadogHeap::KernelExecGuard)
  Kernel.singleton_class.prepend(DatadogHeap::ExecGuard)
  Process.singleton_class.prepend(DatadogHeap::ExecGuard)
end

# The process-wide recorder.
module DatadogHeap
  @recorder = nil

  class << self
    # The process-wide recorder (nil before the first start).
    attr_reader :recorder

    # Starts sampling into the process-wide recorder, creating it with `opts` (see Recorder)
    # the first time. Options given to a later start must match, or stop and create anew.
    # Every option is checked (unknown keys, types, ranges) before anything is created or started.
    # A recorder that disabled itself (stats[:disabled_reason]) never records again, so a start
    # after that replaces it with a fresh one: its options, with `opts` on top (what the old one
    # tracked goes with it). If the fresh one cannot start either, the old one stays.
    def start(**opts)
      checked = Recorder.check_options(opts, "DatadogHeap.start")
      if @recorder && @recorder.stats[:disabled_reason]
        fresh = Recorder.new(**options_of(@recorder, opts).merge(opts))
        fresh.start
        @recorder = fresh
      elsif @recorder
        # Keys come from DEFAULTS, never from the caller; values are checked Integers and booleans.
        differing = Recorder::DEFAULTS.each_key.select { |key| opts.key?(key) && @recorder.public_send(key) != checked[key] }
        unless differing.empty?
          raise ArgumentError, "DatadogHeap is already set up with #{@recorder.inspect}; options " \
            "#{differing.map { |key| "#{key}: #{checked[key]}" }.join(", ")} differ"
        end
      else
        @recorder = Recorder.new(**opts)
      end
      @recorder.start
      @recorder
    end

    # Writes the process-wide recorder's profile to `path` (see Recorder#write_profile), with
    # retainer paths when its preset asks for them.
    def write_profile(path)
      raise Error, "DatadogHeap.start was never called: there is no process-wide recorder" unless @recorder

      @recorder.write_profile(path, retainers: @recorder.retainers_by_default? || nil)
    end

    # What each preset costs, said once per process when a recorder with it first starts.
    PRESET_LINES = {
      leak_hunt: "datadog_heap: preset :leak_hunt: countdown sampler at 1 in 128, no overhead budget, a full " \
        "GC and retainer paths with every profile written for you. For staging and local runs: it costs " \
        "about +28% CPU on an allocation-heavy workload (+12% of it the VM's allocation hook; see " \
        "docs/samplers.md), so keep it out of production. Options given beside the preset win over it",
    }.freeze

    # Warns PRESET_LINES[preset], once per process and preset.
    def announce_preset(preset)
      @announced ||= {}
      return if @announced[preset]

      @announced[preset] = true
      warn PRESET_LINES.fetch(preset)
    end

    # Runs the block as the gem's own work: what this thread allocates in it is never sampled
    # (profiles written, the endpoint's answers, uploads). Returns the block's value.
    def own_work(&block)
      _native_own_work(&block)
    end

    # Stops sampling; what is tracked stays readable through DatadogHeap.recorder.
    def stop
      @recorder&.stop
      @recorder
    end

    private

    # The options `recorder` was created with, as Recorder.new takes them; none when `opts` asks
    # for another sampler (sample_every's default and windows_per_second depend on it).
    def options_of(recorder, opts)
      return {} if opts.key?(:sampler) && opts[:sampler] != recorder.sampler

      options = Recorder::DEFAULTS.each_key.to_h { |key| [key, recorder.public_send(key)] }
      options.delete(:windows_per_second) if options[:sampler] == :countdown
      options
    end
  end
end

module DatadogHeap
  # For this gem's own specs and benchmarks only, not part of its API: switches and probes the
  # extension defines (the `_native_` methods) to force rare paths and read internal counters,
  # and the recorder's test aids below. They may change or go in any release.
  module Testing
    class << self
      # For tests only: moves `recorder`'s id counter to its last value, so that the next
      # recording finds no id left and the recorder's handling of that runs.
      def exhaust_record_ids!(recorder)
        recorder.__send__(:exhaust_record_ids!)
      end

      # For tests only: forgets when `recorder`'s last young update ran, so
      # Recorder#update_young_objects does not skip the next one for having run less than 2
      # seconds ago.
      def reset_last_update!(recorder)
        recorder.__send__(:reset_last_update!)
      end
    end
  end
end

# In a Rails app (Bundler.require loads this after Rails): config.datadog_heap, see railtie.rb.
require "datadog_heap/railtie" if defined?(::Rails::Railtie)
