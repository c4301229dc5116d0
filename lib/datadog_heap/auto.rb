# frozen_string_literal: true

# `require "datadog_heap/auto"` (or `RUBYOPT=-rdatadog_heap/auto`): profiles the whole process with
# the process-wide recorder and writes pprof files, configured by the environment:
#
# - DATADOG_HEAP_OUTPUT: where profiles go. A directory (one that exists, or any path ending in
#   "/") gets `heap-<pid>-<n>.pb.gz`, n = 1, 2, ... for each write, so the last n is the final
#   profile and the first and last can be diffed. Any other path is a file, replaced by each write
#   (so it always holds the latest profile); a forked child writes `<name>-<pid>.pb.gz` beside it.
#   Missing directories are created. Default: the current directory.
# - DATADOG_HEAP_INTERVAL: seconds (a number > 0) between two writes, from a background thread.
#   Default: unset, write only at exit. The thread needs the GVL to write, so next to a thread
#   that never releases it writes come less often than asked (the program is not slowed down).
# - DATADOG_HEAP_SAMPLER: countdown or windowed (see Recorder). Default: the Recorder's.
# - DATADOG_HEAP_SAMPLE_EVERY: the recorder's sample_every (an Integer >= 1). Default: the
#   Recorder's.
# - DATADOG_HEAP_UPLOAD: also (or, when DATADOG_HEAP_OUTPUT is unset, only) send each profile to
#   a Datadog agent or a Pyroscope server, from the writer thread (see lib/datadog_heap/upload.rb);
#   DATADOG_HEAP_INTERVAL then defaults to 60.
# - DATADOG_HEAP_RSS_LIMIT: a profile before the OOM kill. A size ("512mb", "2g", bytes; binary
#   units): when the process's RSS first reaches it, one profile is written (and uploaded) as
#   above, with a warning, then again at each DATADOG_HEAP_RSS_STEP further (default: a tenth of
#   the limit, at least 1 MiB). RSS is read from /proc/self/statm (Linux only) by a thread every
#   DatadogHeap::RssWatch::INTERVAL seconds, never from the allocation hook. Default: unset, off.
#
# At exit (after the program's own at_exit handlers), sampling stops, a GC runs and the final
# profile is written. An invalid value gets one warning naming the variable, then its default; a
# failed write gets a warning; nothing here raises into the program. Forked children (Process.fork,
# fork, Process.daemon) get their own writer thread and their own files, named by their pid. It
# is otherwise silent.

require "fileutils"
begin
  require "datadog_heap"
  require "datadog_heap/upload"
rescue ScriptError, StandardError => e
  warn "datadog_heap/auto: not profiling: #{e.class}: #{e.message}"
end

module DatadogHeap
  # The machinery behind `require "datadog_heap/auto"`; see lib/datadog_heap/auto.rb.
  module Auto
    ENV_OUTPUT = "DATADOG_HEAP_OUTPUT"
    ENV_INTERVAL = "DATADOG_HEAP_INTERVAL"
    ENV_SAMPLE_EVERY = "DATADOG_HEAP_SAMPLE_EVERY"
    ENV_SAMPLER = "DATADOG_HEAP_SAMPLER"
    # "1": every profile carries retainer paths (Recorder#profile(retainers: true)).
    ENV_RETAINERS = "DATADOG_HEAP_RETAINERS"
    ENV_RSS_LIMIT = "DATADOG_HEAP_RSS_LIMIT"
    ENV_RSS_STEP = "DATADOG_HEAP_RSS_STEP"
    # How long the exit handler waits for a write in progress in the writer thread.
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

      # What the environment asked for: {output:, interval:, sample_every:}. Warns about each
      # invalid value and uses its default instead.
      def config(env = ENV)
        {output: output(env), interval: interval(env), sample_every: sample_every(env), sampler: sampler(env)}
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
        @retainers = env[ENV_RETAINERS] == "1"
        opts = config.slice(:sample_every, :sampler).compact
        @publish_lock = Mutex.new
        # The writer thread first, so its own allocations are not sampled.
        start_writer
        at_exit { finish }
        DatadogHeap.start(**opts)
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
        @retainers ? DatadogHeap.recorder.write_profile(path, retainers: true) : DatadogHeap.write_profile(path)
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
          unless step
            warn "datadog_heap/auto: ignoring #{ENV_RSS_STEP}=#{step_value.inspect}: expected a size such as 64mb; " \
              "using a tenth of the limit"
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

      # :countdown, :windowed or nil (the Recorder's default).
      def sampler(env)
        value = env[ENV_SAMPLER]
        return nil if value.nil? || value.strip.empty?

        found = Recorder::SAMPLERS.find { |s| s.to_s == value.strip }
        return found if found

        warn "datadog_heap/auto: ignoring #{ENV_SAMPLER}=#{value.inspect}: expected " \
          "#{Recorder::SAMPLERS.join(" or ")}; using the default #{Recorder::DEFAULTS[:sampler]}"
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
        publish
      rescue *FAILURES => e
        warn "datadog_heap/auto: no final profile: #{e.class}: #{e.message}"
      end
    end

    # Restarts the writer in a forked child (after DatadogHeap::ForkHook has reset the recorder).
    module ForkHook
      def _fork
        pid = super
        DatadogHeap::Auto.after_fork if pid == 0
        pid
      end

      # On Linux Process.daemon calls libc daemon(3), not _fork; only the daemon returns here.
      def daemon(*args)
        result = super
        DatadogHeap::Auto.after_fork
        result
      end
    end
  end
end

if defined?(DatadogHeap::Recorder)
  Process.singleton_class.prepend(DatadogHeap::Auto::ForkHook)
  DatadogHeap::Auto.setup
end
