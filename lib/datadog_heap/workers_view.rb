# frozen_string_literal: true

require "datadog_heap"

module DatadogHeap
  # The endpoint's cluster view (Middleware's `?workers=1`): which files of a workers' directory
  # to sum with this process's heap, and why each other one was left out.
  #
  # A file `heap-<pid>-<n>.pb.gz` is taken when all of these hold:
  # - its pid is not this process's (this heap is read live instead);
  # - the file belongs to this process's user, and so does the process: `kill(0, pid)` succeeds
  #   (ESRCH: not running; EPERM: another user's process, so not one of this app's workers);
  # - it is that pid's newest file by modification time (not by `n`: a pid reused by a later run
  #   starts again at 1, below the numbers an earlier run left);
  # - it was written less than `max_age` seconds ago: workers write one every interval, so an
  #   older file was left by a process that stopped writing, or by an earlier run (a persistent
  #   output directory keeps files across restarts, and a pid such as 1 comes back every time).
  # Files owned by another user, written in the future, or that vanish or cannot be read while
  # this runs are skipped too, saying so.
  class WorkersView
    NAME = /\Aheap-(\d+)-(\d+)\.pb\.gz\z/
    # The longest max_age taken, in seconds (a year, as the Railtie's longest interval).
    MAX_AGE_LIMIT = 365 * 24 * 3600
    # How many writer intervals old a worker's newest file may be, and the least age allowed.
    INTERVALS = 3
    MIN_AGE = 10
    # The most skipped files the notes name one by one; the rest are counted by reason.
    LISTED = 20
    # The kind of each reason, for the count of the skipped files not listed.
    KINDS = {/ago, more than/ => "stale", /is not running/ => "of processes not running",
             /belongs to another user/ => "of another user's processes", /owned by another user/ => "owned by another user",
             /after it/ => "older than their pid's newest", /own file/ => "of this process", /in the future/ => "written in the future",
             /could not be read/ => "unreadable", /no process/ => "of no process"}.freeze

    # The max_age that goes with a writer writing every `interval` seconds: INTERVALS of them,
    # and at least MIN_AGE seconds (writing a large profile takes a moment).
    def self.max_age_for(interval)
      [INTERVALS * interval, MIN_AGE].max
    end

    Entry = Struct.new(:path, :name, :pid, :n, :mtime, :foreign)

    # `dir`: the workers' directory; `max_age`: seconds; `now`: the clock (a Time), for tests.
    def initialize(dir, max_age:, now: Time.now)
      @dir = dir
      @max_age = max_age
      @now = now
    end

    # [taken, skipped]: taken an Array of Entry, lowest pid first; skipped an Array of
    # [file name, reason].
    def select
      taken = []
      skipped = []
      foreign, ours = entries.partition(&:foreign)
      foreign.each { |e| skipped << [e.name, "owned by another user than this process's"] }
      ours.group_by(&:pid).sort.each do |pid, files|
        files = files.sort_by { |e| [-e.mtime.to_r, -e.n] }
        newest = files.first
        reason = process_reason(pid) || stale_reason(newest)
        if reason
          files.each { |e| skipped << [e.name, reason] }
          next
        end
        taken << newest
        files.drop(1).each { |e| skipped << [e.name, "pid #{pid} wrote #{newest.name} after it (the newest file of a pid is taken)"] }
      end
      [taken, skipped]
    end

    # `own` (this process's profile) summed with the files #select takes, its notes saying what
    # was taken and what was skipped, and why.
    def sum(own)
      taken, skipped = select
      profiles = [own]
      taken.each do |entry|
        profiles << Profile.load(entry.path)
      rescue DatadogHeap::Error, SystemCallError => e
        skipped << [entry.name, "could not be read: #{e.message}"]
        entry.path = nil
      end
      taken = taken.select(&:path)
      summed = profiles.size == 1 ? own : Profile.merge(profiles)
      notes = self.notes(taken, skipped)
      comments = notes + summed.comments
      summed.define_singleton_method(:comments) { comments }
      summed
    end

    # The notes the report shows first: the rule, each file taken, each skipped (LISTED at most,
    # then how many more, by kind of reason).
    def notes(taken, skipped)
      notes = ["datadog_heap: workers=1: this process's heap (pid #{Process.pid}) now, plus the newest file of each " \
        "other worker written in the last #{age(@max_age)} in #{@dir}: #{taken.size} taken, #{skipped.size} skipped"]
      taken.each do |e|
        notes << "datadog_heap: workers=1: took #{e.name} (pid #{e.pid}, written #{age(@now - e.mtime)} ago)"
      end
      skipped.first(LISTED).each { |name, reason| notes << "datadog_heap: workers=1: skipped #{name}: #{reason}" }
      rest = skipped.drop(LISTED)
      unless rest.empty?
        counts = rest.group_by { |_, reason| KINDS.find { |pattern, _| pattern.match?(reason) }&.last || "other" }
        notes << "datadog_heap: workers=1: #{rest.size} more skipped: #{counts.map { |kind, files| "#{files.size} #{kind}" }.join(", ")}"
      end
      notes
    end

    private

    # The directory's heap-<pid>-<n>.pb.gz files, as Entry; files that vanish are left out.
    def entries
      Dir.children(@dir).filter_map do |name|
        match = NAME.match(name) or next
        path = File.join(@dir, name)
        stat = begin
          File.stat(path)
        rescue SystemCallError
          next
        end
        next unless stat.file?

        # Another user's file is not this app's, whatever its pid.
        Entry.new(path, name, Integer(match[1], 10), Integer(match[2], 10), stat.mtime, stat.uid != Process.euid)
      end
    rescue SystemCallError
      []
    end

    # Why the files of `pid` are not a worker's, or nil when they may be.
    def process_reason(pid)
      return "this process's own file (its heap is read live instead)" if pid == Process.pid
      return "pid 0 is no process" if pid.zero?

      Process.kill(0, pid)
      nil
    rescue Errno::ESRCH
      "pid #{pid} is not running"
    rescue Errno::EPERM
      "pid #{pid} belongs to another user, so it is not one of this app's workers"
    rescue RangeError
      "pid #{pid} is no process"
    end

    def stale_reason(entry)
      old = @now - entry.mtime
      return "written #{age(-old)} in the future (its clock or its time was set by hand)" if old < -MIN_AGE
      return nil if old <= @max_age

      "written #{age(old)} ago, more than #{age(@max_age)} (the workers write one every interval: this one was left " \
        "by a process that stopped writing, or by an earlier run under the same pid)"
    end

    def age(seconds)
      seconds = seconds.to_f
      return "#{seconds.round} s" if seconds < 120
      return "#{(seconds / 60).round} min" if seconds < 7200

      "#{(seconds / 3600).round(1)} h"
    end
  end
end
