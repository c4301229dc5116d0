# frozen_string_literal: true

require "pathname"
require_relative "validate"
require_relative "rss_watch"
require_relative "retainer_search"

module DatadogHeap
  # Records sampled allocations and keeps watching the objects while they live. See README.md.
  #
  # Options (all have defaults, all have readers):
  # - sample_every: mean allocations between two samples of the built-in sampler (Integer >= 1)
  # - sample_rate: keep one in this many recordings, weighting each by it (Integer >= 1)
  # - size_enabled: measure object sizes (ObjectSpace.memsize_of) during updates
  # - max_frames: deepest stack kept (1..3000); deeper stacks keep their innermost frames and
  #   end with a "(N frames truncated)" frame
  # - max_tracked_objects: most objects tracked at once; recordings past it are skipped and
  #   counted (stats[:lifetime_recordings_skipped_max_tracked]). The default keeps the
  #   recorder's own memory near 64 MiB at the cap.
  # - sampler: :windowed (sampling windows placed at random along the program's allocations,
  #   64 / sample_every of them, opened and closed at the VM's interrupt checks; between them no
  #   hook is installed) or :countdown (a geometric countdown over every allocation, from an
  #   allocation hook installed all the time).
  #   Either way a sample stands for sample_every allocations on average. Default: :windowed,
  #   except with a sample_every below WINDOWED_FROM (1024), where windows would cover a sixteenth
  #   of the allocations or more and save little: :countdown there. See docs/samplers.md.
  # - windows_per_second: the windowed sampler's timer rate, ticks a second (0 < rate <=
  #   100_000; it arms the windows and runs the young updates, and ticks sooner when a window is
  #   near); only with the windowed sampler (given without sampler:, it chooses it).
  # - max_overhead: the overhead budget, the largest share of the process's CPU time the
  #   sampler's own work (sampled hook calls, commits, young updates, and an estimate of what
  #   its samples make the VM do: slow-path allocations inside windows, WeakMap finalizers
  #   before Ruby 3.3) may take (0 < share <= 1;
  #   nil: no budget). Default: 0.01 (1%) when sample_every is the gem's own default; none when
  #   sample_every is given, so an interval asked for is the interval used. Over it, the sampler
  #   raises its mean interval above sample_every; it lowers it back when there is room. Each
  #   sample weighs the mean interval it was drawn with, so estimates stay unbiased. When it
  #   raised the interval, the gem says so: one warning per process, stats[:sampler_budget_note],
  #   and a note in every profile (which `datadog-heap report` prints under its header). See
  #   docs/samplers.md, "The overhead budget".
  # - preset: a named set of the options above; options given beside it win over it. :leak_hunt
  #   (staging and local runs, never production): the countdown sampler at 1 in 128, no budget,
  #   and every profile with a full GC first and retainer paths (auto mode, the Railtie, the
  #   endpoint). PRESETS lists them.
  # - rss_limit: a profile before the OOM kill. Bytes (Integer) or nil (the default: off). While
  #   the recorder runs, a thread reads RSS (/proc/self/statm, Linux only) every
  #   RssWatch::INTERVAL seconds and writes a profile to rss_output when RSS first reaches the
  #   limit, then again at each further rss_step. Never from the allocation hook.
  # - rss_step: bytes between two such profiles past the limit (default: a tenth of rss_limit, at
  #   least 1 MiB); at least 1 MiB (RssWatch::MIN_STEP), else an ArgumentError; only with rss_limit.
  # - rss_output: the directory those profiles go to, as heap-rss-<pid>-<n>.pb.gz (default: the
  #   current directory when the recorder is created); only with rss_limit.
  #
  # Its methods are those below, the extension's (listed below with their comments), and those of
  # the two modules it prepends: RssLimit (rss_limit, rss_step, rss_output, rss_profiles; #start
  # and #stop run the RSS watch) and RetainerSearch (#retainers, and #profile's retainers: and
  # gc:). Test aids are DatadogHeap::Testing's.
  class Recorder
    SAMPLERS = %i[countdown windowed].freeze
    # sample_every's default depends on the sampler (bench/mixed.rb and bench/allocation.rb: the
    # windowed sampler pays per sample what the countdown one pays on every allocation).
    # The windowed sampler at 1024 gave more live samples but cost more than the defaults may, so
    # it stays at 4096 (the runs: docs/performance.md, "A denser default, tried three times, not
    # taken").
    SAMPLE_EVERY = {countdown: 1024, windowed: 4096}.freeze
    # The smallest sample_every for which sampler: defaults to :windowed (see the options above).
    WINDOWED_FROM = 1024
    DEFAULTS = {sample_every: nil, sample_rate: 1, size_enabled: true, max_frames: 400,
                max_tracked_objects: 262_144, sampler: nil, windows_per_second: 100,
                max_overhead: 0.01, rss_limit: nil, rss_step: nil, rss_output: nil, preset: nil}.freeze
    # Named option sets (see the options above). What a preset does beyond these options (a full
    # GC before each profile, retainer paths) follows from Recorder#preset.
    PRESETS = {
      leak_hunt: {sampler: :countdown, sample_every: 128, max_overhead: nil},
    }.freeze
    RSS_OPTIONS = %i[rss_limit rss_step rss_output].freeze
    # #retainers' options and their defaults (RetainerSearch).
    RETAINERS_DEFAULTS = {top: 5, per_site: 3, max_depth: 30, by: :size, max_visited: 4_000_000,
                          time_budget: 10.0, app_root: nil, values: false}.freeze
    RETAINERS_SORT_KEYS = %i[size count].freeze
    RSS_DEPENDENT_OPTIONS = %i[rss_step rss_output].freeze
    MAX_WINDOWS_PER_SECOND = 100_000
    MAX_FRAMES_LIMIT = 3000
    RECORD_ALLOCATION_KEYWORDS = {weight: true, class_name: true, locations: true}.freeze
    U32_MAX = 2**32 - 1

    # Keyword arguments only (the option names above); a key that is not one of them is an
    # ArgumentError naming it. Ruby's own "unknown keyword" error would call the key's inspect.
    def self.new(**options)
      given = options
      options = check_options(options)
      given = PRESETS.fetch(options[:preset], {}).merge(given)
      DatadogHeap.warn_about_ruby_version
      # The windowed sampler by default only where its timer can keep its rate.
      if options[:sampler] == :windowed && NilClass === given[:sampler] && !given.key?(:windows_per_second)
        sampler_note = DatadogHeap.default_sampler_fallback(options[:sample_every])
        options[:sampler] = :countdown if sampler_note
      end
      rate = options[:sampler] == :windowed ? options[:windows_per_second].to_f : nil
      if rate.nil? && given.key?(:windows_per_second)
        with_preset = options[:preset] ? " (with preset: :#{options[:preset]}, which sets sampler: :countdown)" : ""
        raise ArgumentError, "windows_per_second applies to sampler: :windowed only, got sampler: :countdown#{with_preset}"
      end
      recorder = _native_new(self, *options.values_at(:sample_every, :sample_rate, :size_enabled, :max_frames, :max_tracked_objects), rate,
        options[:max_overhead]&.to_f)
      # Nothing allocated here without rss_limit or a preset (Recorder.new runs in loops under
      # GC.stress).
      recorder.send(:setup_rss, options.slice(*RSS_OPTIONS)) if options[:rss_limit]
      recorder.instance_variable_set(:@preset, options[:preset]) if options[:preset]
      recorder._native_set_sampler_note(sampler_note) if sampler_note
      recorder
    end

    # `options` (option => value) with the missing ones taken from DEFAULTS. Raises ArgumentError
    # for an unknown option or a value out of range and TypeError for a value of the wrong type,
    # before anything else happens; calls no method on the values. `method` names the caller in
    # the unknown-keyword message.
    def self.check_options(options, method = "#{name}.new")
      Validate.known_keys!(method, options, DEFAULTS)
      preset = options[:preset]
      return check_options_of_preset(preset, options, method) unless NilClass === preset

      given_rate = options.key?(:windows_per_second)
      # An interval asked for is the interval used: the budget applies to the default interval,
      # or where max_overhead is given.
      honoured = !(NilClass === options[:sample_every]) && !options.key?(:max_overhead)
      options = DEFAULTS.merge(options)
      options[:max_overhead] = nil if honoured
      options[:sampler] = default_sampler(options[:sample_every], given_rate) if NilClass === options[:sampler]
      Validate.one_of!(:sampler, options[:sampler], SAMPLERS)
      options[:sample_every] = SAMPLE_EVERY.fetch(options[:sampler]) if NilClass === options[:sample_every]
      Validate.integer!(:sample_every, options[:sample_every], 1, U32_MAX)
      Validate.integer!(:sample_rate, options[:sample_rate], 1, U32_MAX)
      Validate.boolean!(:size_enabled, options[:size_enabled])
      Validate.integer!(:max_frames, options[:max_frames], 1, MAX_FRAMES_LIMIT)
      Validate.integer!(:max_tracked_objects, options[:max_tracked_objects], 1, 2**40)
      Validate.positive_number!(:windows_per_second, options[:windows_per_second], MAX_WINDOWS_PER_SECOND)
      Validate.positive_number!(:max_overhead, options[:max_overhead], 1) unless NilClass === options[:max_overhead]
      check_rss_options(options)
    end

    # check_options for options with a preset: the preset's options under those given, checked
    # as one set; a clash between them (windows_per_second beside a countdown preset, say) is an
    # ArgumentError naming both.
    def self.check_options_of_preset(preset, options, method)
      raise TypeError, "preset must be a Symbol, got #{Validate.describe(preset)}" unless Symbol === preset
      Validate.one_of!(:preset, preset, PRESETS.keys)
      begin
        check_options(PRESETS.fetch(preset).merge(options.except(:preset)), method).merge(preset: preset)
      rescue ArgumentError => e
        raise ArgumentError, "#{e.message} (with preset: :#{preset}, which sets " \
          "#{PRESETS.fetch(preset).map { |k, v| "#{k}: #{v.inspect}" }.join(", ")})"
      end
    end
    private_class_method :check_options_of_preset

    # The sampler when none is given: :windowed, unless sample_every is an Integer below
    # WINDOWED_FROM and windows_per_second was not given. Calls no method on `sample_every`.
    def self.default_sampler(sample_every, given_rate)
      small = Integer === sample_every && sample_every < WINDOWED_FROM
      (small && !given_rate) ? :countdown : :windowed
    end
    private_class_method :default_sampler

    # rss_limit, rss_step and rss_output checked, the defaults of the last two filled in.
    def self.check_rss_options(options)
      limit = options[:rss_limit]
      if NilClass === limit
        RSS_DEPENDENT_OPTIONS.each do |key|
          raise ArgumentError, "#{key} applies with rss_limit only, got #{key}: #{Validate.show(options[key])}" unless options[key].nil?
        end
        return options
      end
      Validate.integer!(:rss_limit, limit, 1, 2**62)
      options[:rss_step] = RssWatch.default_step(limit) if NilClass === options[:rss_step]
      RssWatch.check_step(:rss_step, options[:rss_step])
      output = NilClass === options[:rss_output] ? Dir.pwd : Validate.path!(:rss_output, options[:rss_output])
      options[:rss_output] = File.expand_path(output)
      options
    end
    private_class_method :check_rss_options

    alias_method :_native_start, :start # :nodoc:
    private :_native_start
    # The extension's test aids, reached through DatadogHeap::Testing.
    private :exhaust_record_ids!, :reset_last_update!

    # The methods below are defined by the extension (ext/datadog_heap/src/recorder/); these
    # comments are their reference.

    ##
    # :method: stop
    # :call-seq: stop -> true or false
    #
    # Stops sampling. What the recorder tracks stays tracked and in its profiles, and #start
    # samples again. Safe to call when not running. With rss_limit, the RSS watch stops too.

    ##
    # :method: running?
    # :call-seq: running? -> true or false
    #
    # Whether the recorder is sampling (between #start and #stop, and not disabled by an error).

    ##
    # :method: commit
    # :call-seq: commit -> Integer
    #
    # Commits the pending recordings now (a postponed job does it soon after each sample anyway)
    # and returns how many it committed: 0 when another commit or update is busy. An error an
    # earlier postponed commit hit is not raised here; it was warned about once and stays in
    # stats[:last_commit_error].

    ##
    # :method: update_young_objects
    # :call-seq: update_young_objects -> true or false
    #
    # Checks which of the objects tracked since the last GC are still alive. Returns false when
    # the update was skipped: another one is busy, the last ran less than 2 seconds ago, or no GC
    # has run since. Profiles and #each_live_object run a full update of their own.

    ##
    # :method: stats
    # :call-seq: stats -> Hash
    #
    # The recorder's counters, keyed by Symbol: those of Datadog's C heap recorder
    # (:num_object_records, :num_heap_records, :lifetime_recordings_skipped_max_tracked, ...) and
    # the sampler's own (:sampler_effective_sample_every, :sampler_budget_note, ...), plus
    # :disabled_reason when an error stopped it. README.md, "Troubleshooting", reads them.

    ##
    # :method: debug
    # :call-seq: debug -> [[:records, [String, ...]], [:state, Hash]]
    #
    # The tracked records as text and the counters of #stats, for a failure report.

    ##
    # :method: after_fork
    # :call-seq: after_fork -> nil
    #
    # In a forked child, drops what the parent tracked and starts afresh, as the fork hook does on
    # its own. Only for a child that hook missed; a no-op in the process that created the recorder.

    ##
    # :method: record_id_for
    # :call-seq: record_id_for(obj) -> Integer or nil
    #
    # The id under which +obj+ is tracked, or nil when it is not (never sampled, or not committed
    # yet). Retainer paths (#retainers) are keyed by these ids.

    ##
    # :method: recorded?
    # :call-seq: recorded?(record_id) -> true or false
    #
    # Whether a record with the id +record_id+ (see #record_id_for) is still tracked.

    ##
    # :method: sample_every
    # :call-seq: sample_every -> Integer
    #
    # The mean number of allocations between two samples asked for (see the options above; the
    # overhead budget may raise the interval in force, stats[:sampler_effective_sample_every]).

    ##
    # :method: sample_rate
    # :call-seq: sample_rate -> Integer
    #
    # One recording in this many is kept, weighted by it (see the options above).

    ##
    # :method: size_enabled
    # :call-seq: size_enabled -> true or false
    #
    # Whether updates measure object sizes (see the options above).

    ##
    # :method: max_frames
    # :call-seq: max_frames -> Integer
    #
    # The deepest stack kept (see the options above).

    ##
    # :method: max_tracked_objects
    # :call-seq: max_tracked_objects -> Integer
    #
    # The most objects tracked at once (see the options above).

    ##
    # :method: max_overhead
    # :call-seq: max_overhead -> Float or nil
    #
    # The overhead budget, as a share of the process's CPU time, or nil for none.

    ##
    # :method: windows_per_second
    # :call-seq: windows_per_second -> Float or nil
    #
    # The windowed sampler's timer rate (ticks a second), or nil for the countdown sampler.

    # Starts sampling (see docs/samplers.md and docs/architecture.md, "Lifecycle"). The first start of a
    # windowed recorder in the process first checks, before Ruby 3.3, for gems that the window
    # timer's signals would break (DatadogHeap.check_window_signals). Raises DatadogHeap::Error
    # under a GC other than Ruby's default one (Compat.gc_refusal).
    def start
      Compat.check_gc!
      DatadogHeap.check_window_signals if windows_per_second
      DatadogHeap.announce_preset(preset) if preset
      _native_start
    end

    # The preset it was created with (a key of PRESETS), or nil.
    def preset
      @preset if defined?(@preset)
    end

    # Whether each profile comes after a full GC (the :leak_hunt preset), so that garbage not
    # yet collected is not reported as live.
    def gc_before_profile?
      preset == :leak_hunt
    end

    # Whether each profile written for the program (auto mode, the Railtie, the endpoint) carries
    # retainer paths (the :leak_hunt preset).
    def retainers_by_default?
      preset == :leak_hunt
    end

    # :countdown or :windowed (see the options above).
    def sampler
      windows_per_second ? :windowed : :countdown
    end

    # Keeps one in +value+ recordings from now on (an Integer, at least 1), weighting each by it.
    def sample_rate=(value)
      Validate.integer!(:sample_rate, value, 1, U32_MAX)
      _native_set_sample_rate(value)
    end

    # Turns size measurement during updates on or off (true or false).
    def size_enabled=(value)
      Validate.boolean!(:size_enabled, value)
      _native_set_size_enabled(value)
    end

    # Records `obj` as allocated at `locations` (innermost frame first, each [name, path, line]).
    # For profilers that sample on their own; returns true when the object became pending.
    # Keywords: weight (default 1), class_name (default nil), locations (default []); the native
    # side checks their values.
    def record_allocation(obj, **options)
      Validate.known_keys!("#{self.class}#record_allocation", options, RECORD_ALLOCATION_KEYWORDS)
      _native_record_allocation(obj, options.fetch(:weight, 1), options[:class_name], options.fetch(:locations) { [] })
    end

    # Runs a full update, then yields a LiveObject for each tracked object that survived at least
    # one GC. Without a block, returns an Enumerator.
    def each_live_object
      return enum_for(:each_live_object) unless block_given?

      _native_each_live_object do |locations, weight, size, class_name, alloc_gen, gen_age, frozen|
        yield LiveObject.new(locations, weight, size, class_name, alloc_gen, gen_age, frozen)
      end
      self
    end

    # Writes `profile` (gzip pprof) to `path` atomically: a temporary file, then a rename.
    # `path` is a String, a Pathname or another object with to_path (as File.open takes them; not
    # an IO: write `profile` to it instead). Returns the path as a String. `retainers:` as for
    # #profile (lib/datadog_heap/retainers.rb).
    def write_profile(path, retainers: nil, gc: nil)
      path = Validate.path!(:path, path)
      DatadogHeap.own_work do
        data = profile(retainers: retainers, gc: gc)
        tmp = "#{path}.tmp-#{Process.pid}"
        File.binwrite(tmp, data)
        File.rename(tmp, path)
        path
      ensure
        File.unlink(tmp) if tmp && File.exist?(tmp)
      end
    end

    # The recorder's options in one line.
    def inspect
      how = windows_per_second ? "sampler=windowed windows_per_second=#{windows_per_second}" : "sample_every=#{sample_every}"
      "#<#{self.class} #{how} sample_rate=#{sample_rate} " \
        "size_enabled=#{size_enabled} max_frames=#{max_frames} max_tracked_objects=#{max_tracked_objects} " \
        "max_overhead=#{max_overhead.inspect}#{" preset=#{preset.inspect}" if preset}>"
    end

    # Last, so that the aliases above (_native_start) name the extension's methods, not these.
    prepend RssLimit
    prepend RetainerSearch
  end

  # One tracked object as the last full update saw it (Recorder#each_live_object yields them).
  class LiveObject
    # Where it was allocated: [name, path, line] frames, innermost first.
    attr_reader :locations
    # How many allocations its sample stands for.
    attr_reader :weight
    # Its size in bytes (ObjectSpace.memsize_of) as an update last measured it; 0 if none did
    # (size_enabled false).
    attr_reader :size
    # The name of its class, or nil when it has none (an anonymous class).
    attr_reader :class_name
    # The GC count when it was allocated.
    attr_reader :alloc_gen
    # How many GCs it has survived.
    attr_reader :gen_age

    # Built by Recorder#each_live_object from what the update read.
    def initialize(locations, weight, size, class_name, alloc_gen, gen_age, frozen)
      @locations = locations
      @weight = weight
      @size = size
      @class_name = class_name
      @alloc_gen = alloc_gen
      @gen_age = gen_age
      @frozen = frozen
    end

    # Whether the tracked object was frozen (not this LiveObject).
    def frozen?
      @frozen
    end

    # Its class, weight, size, age and allocation site in one line.
    def inspect
      top = locations.first
      "#<#{self.class} #{class_name || "?"} weight=#{weight} size=#{size} gen_age=#{gen_age} " \
        "at #{top ? "#{top[1]}:#{top[2]}" : "?"}>"
    end
  end
end
