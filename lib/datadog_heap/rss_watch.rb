# frozen_string_literal: true

require_relative "fork_hooks"

# etc and fileutils are required when first used: `require "datadog_heap"` stays small (every GC
# marks what it loads).

module DatadogHeap
  # A profile before the OOM kill: a background thread that reads the process's resident set size
  # every INTERVAL seconds and calls its block when RSS first reaches `limit`, then again each time
  # it reaches a further `step` (limit + step, limit + 2·step, ...). Used by the Recorder's
  # `rss_limit:` option and by DATADOG_HEAP_RSS_LIMIT in datadog_heap/auto.
  #
  # The check is a read of /proc/self/statm from this thread, never from the allocation hook. The
  # thread needs the GVL to run, so next to a thread that never releases it checks come late.
  # Linux only: elsewhere (no /proc/self/statm) RssWatch.supported? is false and #start does
  # nothing. The block runs in the watch thread; an exception from it is warned about once and
  # the watch goes on.
  class RssWatch
    # Seconds between two reads of RSS (a read costs a few microseconds).
    INTERVAL = 0.25
    STATM = "/proc/self/statm"
    # The smallest step taken, and the default step's floor (the default: a tenth of the limit). A
    # smaller step would write a profile at nearly every check of a growing process.
    MIN_STEP = 1 << 20
    UNITS = {"" => 1, "b" => 1, "k" => 1 << 10, "kb" => 1 << 10, "m" => 1 << 20, "mb" => 1 << 20,
             "g" => 1 << 30, "gb" => 1 << 30}.freeze

    class << self
      # The resident set size in bytes, or nil where it cannot be read (not Linux).
      def rss
        pages = File.read(STATM).split[1]
        pages && Integer(pages, 10) * page_size
      rescue SystemCallError, IOError, ArgumentError
        nil
      end

      def supported?
        !rss.nil?
      end

      # `text` ("512mb", "2g", "1048576") as bytes (binary units: mb = MiB), or nil when it is not
      # a size.
      def parse_size(text)
        m = /\A\s*(\d+)\s*([kmg]?b?)\s*\z/i.match(text.to_s)
        return nil unless m

        bytes = Integer(m[1], 10) * UNITS.fetch(m[2].downcase)
        bytes > 0 ? bytes : nil
      end

      def default_step(limit)
        [limit / 10, MIN_STEP].max
      end

      # `step` when it is an Integer of at least MIN_STEP bytes; raises naming `name` otherwise.
      def check_step(name, step)
        raise TypeError, "#{name} must be an Integer (bytes), got #{Validate.describe(step)}" unless Integer === step
        return step if step.between?(MIN_STEP, 2**62)

        raise ArgumentError, "#{name} must be at least 1 MiB (#{MIN_STEP} bytes; a profile per smaller growth " \
          "is noise) and at most 2**62 bytes, got #{Validate.show(step)}"
      end

      private

      def page_size
        @page_size ||= begin
          require "etc"
          Etc.sysconf(Etc::SC_PAGESIZE)
        end
      end
    end

    attr_reader :limit, :step

    # Calls `on_cross.call(rss, threshold)` from the watch thread at each threshold crossed.
    # `limit` and `step` in bytes; `step` at least MIN_STEP (1 MiB), default a tenth of the limit
    # (at least 1 MiB).
    def initialize(limit:, step: nil, interval: INTERVAL, &on_cross)
      @limit = limit
      @step = step.nil? ? self.class.default_step(limit) : self.class.check_step(:step, step)
      @interval = interval
      @on_cross = on_cross
      @next = limit
      @thread = nil
    end

    # Starts the watch thread (once; again in a forked child, where the thread is gone).
    def start
      return self if @thread&.alive? || !self.class.supported?

      @stopping = false
      @thread = Thread.new { watch }
      @thread.name = "datadog_heap rss watch"
      @thread.report_on_exception = false
      self
    end

    def stop
      @stopping = true
      thread = @thread
      @thread = nil
      thread.wakeup if thread&.alive?
      thread&.join(5)
      self
    rescue ThreadError
      self
    end

    def running?
      !@thread.nil? && @thread.alive?
    end

    # The next threshold (bytes) that triggers the block.
    def next_threshold
      @next
    end

    # One check now; returns the threshold crossed, or nil. The watch thread calls it.
    def check
      rss = self.class.rss
      return nil if rss.nil? || rss < @next

      threshold = @next
      # Past several steps at once: one profile, and the next threshold is the first step above
      # the current RSS.
      @next += ((rss - @next) / @step + 1) * @step
      begin
        @on_cross&.call(rss, threshold)
      rescue StandardError => e
        warn "datadog_heap: RSS limit handler failed: #{e.class}: #{e.message}" unless @warned
        @warned = true
      end
      threshold
    end

    private

    def watch
      until @stopping
        check
        sleep @interval
      end
    end
  end
end

module DatadogHeap
  class RssWatch
    # The watches whose thread runs, so a forked child can start them again (its threads are gone).
    @active = {}
    @lock = Mutex.new

    class << self
      def register(watch)
        @lock.synchronize { @active[watch.object_id] = watch }
      end

      def unregister(watch)
        @lock.synchronize { @active.delete(watch.object_id) }
      end

      # In a forked child: restart every watch that ran in the parent.
      def after_fork
        @lock = Mutex.new
        @active.each_value(&:restart_after_fork)
      end
    end

    # Start again in a forked child: thresholds as the parent left them.
    def restart_after_fork
      @thread = nil
      start
    end
  end

  # Recorder's rss_limit:, rss_step:, rss_output: (see the Recorder options): readers, and the
  # watch that runs while the recorder does. Recorder prepends it (recorder.rb).
  module RssLimit
    # The RSS in bytes at which the first profile is written, or nil (off).
    def rss_limit
      @rss_options&.fetch(:rss_limit)
    end

    # Bytes of RSS between two profiles past rss_limit, or nil without rss_limit.
    def rss_step
      @rss_options&.fetch(:rss_step)
    end

    # The directory the RSS profiles go to (an absolute path), or nil without rss_limit.
    def rss_output
      @rss_options&.fetch(:rss_output)
    end

    # The profiles written because RSS crossed the limit or a step, in order (frozen; empty
    # without rss_limit).
    def rss_profiles
      (@rss_profiles ||= []).dup.freeze
    end

    # Recorder#start, and the RSS watch with it.
    def start
      result = super
      @rss_watch&.start
      RssWatch.register(@rss_watch) if @rss_watch
      result
    end

    # Recorder#stop, and the RSS watch with it.
    def stop
      if @rss_watch
        RssWatch.unregister(@rss_watch)
        @rss_watch.stop
      end
      super
    end

    private

    def setup_rss(options)
      @rss_options = options.freeze
      @rss_count = 0
      @rss_watch = RssWatch.new(limit: options[:rss_limit], step: options[:rss_step]) do |rss, threshold|
        write_rss_profile(rss, threshold)
      end
    end

    # From the watch thread: one profile, named by pid and count, and a warning saying why.
    def write_rss_profile(rss, threshold)
      @rss_count += 1
      require "fileutils"
      FileUtils.mkdir_p(rss_output)
      path = write_profile(File.join(rss_output, "heap-rss-#{Process.pid}-#{@rss_count}.pb.gz"))
      (@rss_profiles ||= []) << path
      warn "datadog_heap: RSS #{rss >> 20} MiB reached #{threshold >> 20} MiB " \
        "(rss_limit #{rss_limit >> 20} MiB, step #{rss_step >> 20} MiB): wrote #{path}"
    end
  end
end

# In a forked child, after the recorders are reset, the watches of the parent's recorders start
# again.
DatadogHeap::ForkHooks.register(:rss_watch, DatadogHeap::ForkHooks::RSS_WATCH) { DatadogHeap::RssWatch.after_fork }
