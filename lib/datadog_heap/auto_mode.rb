# frozen_string_literal: true

# DatadogHeap::Auto, the machinery of auto mode (see lib/datadog_heap/auto.rb), without starting
# it: `require "datadog_heap/auto"` starts it from the environment, the Railtie from its config.

require "fileutils"
require "datadog_heap"
require "datadog_heap/upload"

module DatadogHeap
  # The machinery behind `require "datadog_heap/auto"`; see lib/datadog_heap/auto.rb.
  module Auto
    ENV_OUTPUT = "DATADOG_HEAP_OUTPUT"
    ENV_INTERVAL = "DATADOG_HEAP_INTERVAL"
    ENV_SAMPLE_EVERY = "DATADOG_HEAP_SAMPLE_EVERY"
    ENV_MAX_OVERHEAD = "DATADOG_HEAP_MAX_OVERHEAD"
    ENV_SAMPLER = "DATADOG_HEAP_SAMPLER"
    # A preset (Recorder::PRESETS): leak_hunt.
    ENV_PRESET = "DATADOG_HEAP_PRESET"
    # "1": every profile carries retainer paths (Recorder#profile(retainers: true)); "values":
    # the same, with Hash keys in them as they are (retainers: {values: true}).
    ENV_RETAINERS = "DATADOG_HEAP_RETAINERS"
    # "1": a full GC before every profile (Recorder#profile(gc: true)); default: the preset's.
    ENV_GC = "DATADOG_HEAP_GC"
    ENV_RSS_LIMIT = "DATADOG_HEAP_RSS_LIMIT"
    ENV_RSS_STEP = "DATADOG_HEAP_RSS_STEP"
    # How long the exit handler waits for a write in progress in the writer thread, and at most
    # for each of: a write or upload another thread has under way, the final upload.
    STOP_TIMEOUT = 10
    # Seconds between two profiles when uploading and DATADOG_HEAP_INTERVAL is unset.
    UPLOAD_INTERVAL = 60
    # What a failure here can raise. Not Interrupt, SignalException or SystemExit: those belong
    # to the program.
    FAILURES = [StandardError, ScriptError, NoMemoryError, SystemStackError].freeze

    # Where the profiles of one process go.
    class Output
      def initialize(path, directory)
        @path = path
        @directory = directory
        @root_pid = Process.pid
        @count = 0
      end

      # The path of the next write.
      def next_path
        @count += 1
        return File.join(@path, "heap-#{Process.pid}-#{@count}.pb.gz") if @directory
        return @path if Process.pid == @root_pid

        base = File.basename(@path).sub(/(\.pb)?(\.gz)?\z/, "")
        File.join(File.dirname(@path), "#{base}-#{Process.pid}.pb.gz")
      end

      # In a forked child: numbering starts again (the pid in the names tells the files apart).
      def after_fork
        @count = 0
      end

      def prepare
        FileUtils.mkdir_p(@directory ? @path : File.dirname(@path))
      end
    end

    class << self
      # The DatadogHeap::Upload profiles go to, or nil.
      attr_reader :upload

      # Whether setup started writing or uploading profiles in this process.
      def active?
        !!(@output || @upload)
      end

      # What the environment asked for: {output:, interval:, sample_every:}. Warns about each
      # invalid value and uses its default instead.
      def config(env = ENV)
        {output: output(env), interval: interval(env), sample_every: sample_every(env), sampler: sampler(env),
         max_overhead: max_overhead(env), preset: preset(env)}
      end

      # Starts recording and the writer, and registers the exit handler. Called once, when this
      # file is required; warns instead of raising.
      def setup(env = ENV)
        config = config(env)
        @output = config[:output]
        @interval = config[:interval]
        @upload = upload_from_env(env)
        if @upload
          @output = nil if env[ENV_OUTPUT].nil? || env[ENV_OUTPUT].empty?
          @interval ||= UPLOAD_INTERVAL
        end
        @retainers = %w[1 values].include?(env[ENV_RETAINERS])
        @values = env[ENV_RETAINERS] == "values"
        @gc = env[ENV_GC] == "1" || nil
        opts = config.slice(:sample_every, :sampler, :max_overhead, :preset).compact
        opts[:max_overhead] = nil if opts[:max_overhead] == :none
        @publish_lock = Mutex.new
        # The writer thread first, so its own allocations are not sampled.
        start_writer
        at_exit { finish }
        DatadogHeap.start(**opts)
        @retainers ||= DatadogHeap.recorder.retainers_by_default?
        start_rss_watch(env)
        true
      rescue *FAILURES => e
        @output = nil
        @upload = nil
        stop_writer
        warn "datadog_heap/auto: not profiling: #{e.class}: #{e.message}"
        false
      end

      # Writes one profile now; returns its path, or nil (after a warning) when the write failed.
      def write
        path = @output.next_path
        @output.prepare if @failing || !@prepared
        @prepared = true
        retainers = @retainers && (@values ? {values: true} : true)
        DatadogHeap.recorder.write_profile(path, retainers: retainers || nil, gc: @gc)
        @failing = false
        path
      rescue *FAILURES => e
        # One warning per run of failures, not one per interval.
        warn "datadog_heap/auto: could not write #{path || "a profile"}: #{e.class}: #{e.message}" unless @failing
        @failing = true
        nil
      end

      # Writes and uploads one profile, as configured; returns the path written, or nil. One at a
      # time (the writer and the RSS watch both call it).
      def publish
        @publish_lock.synchronize do
          path = write if @output
          @upload&.push(DatadogHeap.recorder)
          path
        end
      rescue *FAILURES => e
        warn "datadog_heap/auto: could not upload a profile: #{e.class}: #{e.message}"
      end

      # In a forked child the writer thread is gone: start a new one, with new numbering.
      def after_fork
        return unless @output || @upload

        @output&.after_fork
        @upload&.after_fork
        @failing = false
        @publish_lock = Mutex.new
        start_writer
      rescue *FAILURES => e
        warn "datadog_heap/auto: no periodic profiles in child #{Process.pid}: #{e.class}: #{e.message}"
      end

      # The RSS watch DATADOG_HEAP_RSS_LIMIT started, or nil.
      attr_reader :rss_watch

      private

      # DATADOG_HEAP_RSS_LIMIT and DATADOG_HEAP_RSS_STEP: {limit:, step:} or nil (unset, or
      # invalid after a warning).
      def rss_config(env)
        value = env[ENV_RSS_LIMIT]
        return nil if value.nil? || value.strip.empty?

        limit = RssWatch.parse_size(value)
        unless limit
          warn "datadog_heap/auto: ignoring #{ENV_RSS_LIMIT}=#{value.inspect}: expected a size such as 512mb, 2g " \
            "or a number of bytes; no profile on RSS"
          return nil
        end
        step_value = env[ENV_RSS_STEP]
        step = nil
        unless step_value.nil? || step_value.strip.empty?
          step = RssWatch.parse_size(step_value)
          if step.nil? || step < RssWatch::MIN_STEP
            warn "datadog_heap/auto: ignoring #{ENV_RSS_STEP}=#{step_value.inspect}: expected a size of at least 1mb " \
              "such as 64mb; using a tenth of the limit"
            step = nil
          end
        end
        {limit: limit, step: step}
      end

      def start_rss_watch(env)
        config = rss_config(env)
        return unless config && (@output || @upload)

        unless RssWatch.supported?
          warn "datadog_heap/auto: ignoring #{ENV_RSS_LIMIT}: RSS cannot be read here (no #{RssWatch::STATM})"
          return
        end
        @rss_watch = RssWatch.new(**config) do |rss, threshold|
          path = publish
          warn "datadog_heap/auto: RSS #{rss >> 20} MiB reached #{threshold >> 20} MiB " \
            "(#{ENV_RSS_LIMIT}=#{env[ENV_RSS_LIMIT]}): #{path ? "wrote #{path}" : "profile sent"}"
        end
        @rss_watch.start
        RssWatch.register(@rss_watch)
      end

      def upload_from_env(env)
        return nil if env[DatadogHeap::Upload::ENV_UPLOAD].to_s.strip.empty?

        DatadogHeap::Upload.from_env(env)
      rescue *FAILURES => e
        warn "datadog_heap/auto: not uploading: #{e.class}: #{e.message}"
        nil
      end

      def output(env)
        value = env[ENV_OUTPUT]
        return Output.new(Dir.pwd, true) if value.nil? || value.empty?

        path = File.expand_path(value)
        Output.new(path, value.end_with?("/") || File.directory?(path))
      end

      def interval(env)
        value = env[ENV_INTERVAL]
        return nil if value.nil? || value.strip.empty?

        seconds = Float(value, exception: false)
        return seconds if seconds&.finite? && seconds > 0

        warn "datadog_heap/auto: ignoring #{ENV_INTERVAL}=#{value.inspect}: expected a number of seconds > 0; " \
          "writing a profile at exit only"
        nil
      end

      # A share in (0, 1], :none (no budget), or nil (the Recorder's default).
      def max_overhead(env)
        value = env[ENV_MAX_OVERHEAD]
        return nil if value.nil? || value.strip.empty?
        return :none if value.strip == "none"

        share = Float(value.strip, exception: false)
        return share if share && share > 0 && share <= 1

        warn "datadog_heap/auto: ignoring #{ENV_MAX_OVERHEAD}=#{value.inspect}: expected a share of the CPU time " \
          "above 0 and at most 1, or none; using the default (#{Recorder::DEFAULTS[:max_overhead]} with the default " \
          "sample_every, none when #{ENV_SAMPLE_EVERY} is set)"
        nil
      end

      # A key of Recorder::PRESETS, or nil (none).
      def preset(env)
        value = env[ENV_PRESET]
        return nil if value.nil? || value.strip.empty?

        found = Recorder::PRESETS.each_key.find { |p| p.to_s == value.strip }
        return found if found

        warn "datadog_heap/auto: ignoring #{ENV_PRESET}=#{value.inspect}: expected " \
          "#{Recorder::PRESETS.keys.join(" or ")}; using no preset"
        nil
      end

      # :countdown, :windowed or nil (the Recorder's default).
      def sampler(env)
        value = env[ENV_SAMPLER]
        return nil if value.nil? || value.strip.empty?

        found = Recorder::SAMPLERS.find { |s| s.to_s == value.strip }
        return found if found

        warn "datadog_heap/auto: ignoring #{ENV_SAMPLER}=#{value.inspect}: expected " \
          "#{Recorder::SAMPLERS.join(" or ")}; using the default (windowed, countdown for a sample_every below " \
          "#{Recorder::WINDOWED_FROM})"
        nil
      end

      def sample_every(env)
        value = env[ENV_SAMPLE_EVERY]
        return nil if value.nil? || value.strip.empty?

        n = Integer(value.strip, 10, exception: false)
        return n if n && n.between?(1, Recorder::U32_MAX)

        warn "datadog_heap/auto: ignoring #{ENV_SAMPLE_EVERY}=#{value.inspect}: expected an Integer between 1 " \
          "and #{Recorder::U32_MAX}; using the sampler's default"
        nil
      end

      # A thread that writes every @interval seconds until #stop_writer. Its own mutex and
      # condition variable each time, so a child never waits on a lock its parent's thread held.
      def start_writer
        return unless @interval

        @lock = Mutex.new
        @wakeup = ConditionVariable.new
        @stopping = false
        @writer = Thread.new { writer_loop }
        @writer.name = "datadog_heap/auto writer"
        @writer.report_on_exception = false
      end

      def writer_loop
        loop do
          @lock.synchronize do
            deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + @interval
            until @stopping
              left = deadline - Process.clock_gettime(Process::CLOCK_MONOTONIC)
              break if left <= 0

              @wakeup.wait(@lock, left)
            end
          end
          break if @stopping

          publish
        end
      rescue *FAILURES => e
        warn "datadog_heap/auto: periodic profiles stopped: #{e.class}: #{e.message}"
      end

      def stop_writer
        writer = @writer
        return unless writer&.alive?

        @lock.synchronize do
          @stopping = true
          @wakeup.signal
        end
        writer.kill unless writer.join(STOP_TIMEOUT)
      end

      # The exit handler: stop the writer, stop sampling, collect what is dead, write.
      def finish
        return unless @output || @upload

        stop_writer
        if @rss_watch
          RssWatch.unregister(@rss_watch)
          @rss_watch.stop
        end
        DatadogHeap.stop
        GC.start
        publish_at_exit
      rescue *FAILURES => e
        warn "datadog_heap/auto: no final profile: #{e.class}: #{e.message}"
      end

      # The final profile: written, and sent, as `publish` does, but the process never waits
      # long for it to exit: at most STOP_TIMEOUT for a publish another thread has under way (the
      # RSS watch's), and as long for the upload, whose own timeout (DATADOG_HEAP_UPLOAD_TIMEOUT)
      # may be up to 600 s. Writing the file is not cut short.
      def publish_at_exit
        deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + STOP_TIMEOUT
        until @publish_lock.try_lock
          if Process.clock_gettime(Process::CLOCK_MONOTONIC) >= deadline
            warn "datadog_heap/auto: no final profile: a profile was still being written or sent after #{STOP_TIMEOUT} s"
            return
          end
          sleep 0.01
        end
        begin
          write if @output
          upload_at_exit if @upload
        ensure
          @publish_lock.unlock
        end
      end

      # Sends the final profile from a thread of its own, given up after STOP_TIMEOUT (killing
      # the thread cancels the request).
      def upload_at_exit
        sender = Thread.new { @upload.push(DatadogHeap.recorder) }
        sender.report_on_exception = false
        if sender.join(STOP_TIMEOUT)
          sender.value
        else
          sender.kill
          sender.join(1)
          warn "datadog_heap/auto: gave up sending the final profile after #{STOP_TIMEOUT} s"
        end
      rescue *FAILURES => e
        warn "datadog_heap/auto: could not upload a profile: #{e.class}: #{e.message}"
      end
    end
  end
end

# In a forked child (Process.daemon's too), after the recorders are reset: the writer starts again.
DatadogHeap::ForkHooks.register(:auto_mode, DatadogHeap::ForkHooks::AUTO_MODE) { DatadogHeap::Auto.after_fork }
