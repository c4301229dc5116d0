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
# - DATADOG_HEAP_MAX_OVERHEAD: the recorder's max_overhead, a share of the process's CPU time
#   (0 < share <= 1), or "none" for no budget. Default: the Recorder's (0.01 with the default
#   interval; none when DATADOG_HEAP_SAMPLE_EVERY is set).
# - DATADOG_HEAP_PRESET: leak_hunt (see Recorder's preset option), for staging and local runs:
#   dense sampling, no budget, a full GC and retainer paths in every profile. The variables
#   above, when set, win over it.
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
#
# The datadog-heap command itself is never profiled: it finds this file in RUBYOPT when it runs
# under `datadog-heap run` or in a shell that profiles every Ruby, and it only reads profiles;
# profiling it would make it write or upload a profile of its own at exit, and wait for that (up
# to the upload's timeout, at zero CPU) before it exits.

# $PROGRAM_NAME is already the script's path when RUBYOPT's -r runs.
unless File.basename($PROGRAM_NAME.to_s) == "datadog-heap"
  loaded = begin
    require "datadog_heap/auto_mode"
    true
  rescue ScriptError, StandardError => e
    warn "datadog_heap/auto: not profiling: #{e.class}: #{e.message}"
    false
  end

  DatadogHeap::Auto.setup if loaded
end
