# frozen_string_literal: true

module DatadogHeap
  # A pprof heap profile read back: ours (Recorder#profile), libdatadog's or Go's; gzip, zstd or
  # raw protobuf. Decoded once, by the Rust core, when loaded.
  #
  #   profile = DatadogHeap::Profile.load("heap.pb.gz")
  #   profile.sample_types          # => [["heap-live-samples", "count"], ["heap-live-size", "bytes"]]
  #   profile.top(5, by: :size)     # => [Profile::Site, ...], the sites holding the most live bytes
  #   old.diff(new)                 # => [Profile::SiteDiff, ...], the largest growth first
  #   Profile.merge([a, b])         # => one Profile: the sum of a and b (forked workers, intervals)
  #
  # A site is where Ruby code allocated, plus the allocated class: the file:line of the innermost
  # frame (Ruby's <internal:...> methods are skipped like C methods), the Ruby method that line is
  # in, the method called there that allocated (`callee`, when the innermost frame is another
  # method: a C method such as String#* or Class#new), and the nearest frame of the application
  # further out (`called_from`, when the site is not application code itself). Application code is
  # what is under `app_root:` (default: Rails.root when Rails is loaded, else the current
  # directory), outside installed gems, or has a relative path. Stacks that agree on all of that
  # are one site. `group:` sums sites by :location (file:line), :file, :gem (see Site#library) or
  # :class instead. Locations are arrays of [name, path, line], innermost frame first, as in
  # LiveObject#locations.
  class Profile
    # One pprof sample. `locations` is its stack ([name, path, line] frames, innermost first),
    # `class_name` its `allocation class` label and `gen_age` its `gc gen age` label (each nil
    # when the profile has none). `values` follow `sample_types`; `objects` and `bytes` pick the
    # live-object count and the live bytes out of them (`bytes` is nil when the profile has no
    # sizes). `retained_by` is the sample's `retained by` label (see Recorder#retainers), or nil.
    Sample = Struct.new(:locations, :values, :class_name, :gen_age, :objects, :bytes, :retained_by)

    # An allocation site (or group of them, with `group:`). `label` is what it stands for, as the CLI
    # prints it: "file:line in method" (plus " via callee" for a site), the file, the library or
    # the class. `location` is the site's "file:line", `function` the Ruby method it is in,
    # `callee` the method called there that allocated (or nil), `called_from` "file:line in method"
    # of the nearest app frame (or nil), `library` the gem ("app", a gem's name, "NAME (stdlib)",
    # ...); for a group other than a site these describe its heaviest stack, as `locations` does.
    # `class_name` is nil in groups other than :site and :class. `stacks` counts the distinct stacks
    # summed; `share` is its fraction (0.0..1.0) of the profile's total by the sort key;
    # `median_gen_age` is the median number of GCs its objects survived (nil if unknown).
    # `samples` counts the live objects recorded that the estimates rest on, `objects_stddev` and
    # `bytes_stddev` are one standard deviation of their sampling error (a sample of weight w adds
    # w(w-1) to the variance of live_objects, w(w-1)·size² to that of live_bytes); all three are
    # nil for a profile that does not carry them (see #uncertainty?).
    #
    # The members, in order, are SITE_FIELDS, which the extension sets from its list of the fields
    # it gives a site; SiteDiff's are SITE_DIFF_FIELDS, and SiteTrend starts with PLACE_FIELDS (the
    # fields that say what a row stands for, from locations to library). A field added there
    # appears in the Struct; #top and #diff fill each member by its name.
    Site = Struct.new(*SITE_FIELDS) do
      # Whether the estimates rest on fewer than ROUGH_SAMPLES sampled objects: one sample of
      # weight 14824 says "about 14824 objects, give or take as many". Rows of objects recorded
      # with weight 1 (exact) and rows of profiles without counts are not rough.
      def rough?
        !samples.nil? && samples < ROUGH_SAMPLES && objects_stddev.to_f > 0
      end
    end

    # A site (or group) in two profiles, with the fields of Site that describe it. `old_bytes`
    # and `new_bytes`, `old_objects` and `new_objects` are its live bytes and objects in the old
    # profile (the receiver of Profile#diff) and the new one (its argument). `*_change` is
    # new - old; `*_relative` is change / old, nil when old is 0 (a new site, or a profile without
    # sizes). `old_samples` and `new_samples` are Site#samples on each side; `*_change_stddev` one
    # standard deviation of each change's sampling error (both sides' variances summed);
    # `significant` whether the change (in bytes, in objects when a profile has no sizes) exceeds
    # SIGNIFICANT_SDS of them. Those are nil when a profile does not carry its variances.
    SiteDiff = Struct.new(*SITE_DIFF_FIELDS)

    # A site (or group) over a series of profiles (Profile.trend), with the fields of Site that
    # describe it. `times` are seconds since the first profile's end, `bytes` and `objects` the
    # site's live bytes and objects in each profile (bytes are objects when a profile has no
    # sizes: see `unit`), `stddevs` the sampling error of each bytes value. `slope` is bytes (or
    # objects) per minute, `stderr` its standard error, `confidence` (0.5..1.0) that its sign is
    # right, `relative` the fitted change over the series / the mean level, `verdict` :growing,
    # :steady or :shrinking (see DatadogHeap::Trend), `unit` :bytes or :objects, `intercept` the
    # fitted line's value at the first profile. `samples` are the site's sampled objects in each
    # profile (estimated from its objects and the period for profiles that do not say); `reason`
    # (a Symbol) and `note` (its text) say why a fit that rose or fell reads :steady (few samples,
    # a single step, back where it started), or are nil. Empty profiles before the first with live
    # objects are left out of the series.
    SiteTrend = Struct.new(*PLACE_FIELDS, :times, :bytes, :objects, :stddevs, :slope, :stderr, :confidence, :relative,
      :verdict, :unit, :intercept, :samples, :reason, :note)

    # A row resting on fewer sampled objects than this is rough (Site#rough?).
    ROUGH_SAMPLES = 5
    # A change is significant when it exceeds this many standard deviations of its noise.
    SIGNIFICANT_SDS = 2.0

    SORT_KEYS = %i[size count].freeze
    TREND_KEYWORDS = {group: true, app_root: true}.freeze
    GROUPS = %i[site location file gem class].freeze
    TOP_KEYWORDS = {by: true, group: true, app_root: true}.freeze
    DIFF_KEYWORDS = {group: true, app_root: true}.freeze
    # Bound, so that a String subclass cannot answer for it.
    STRING_BYTESIZE = String.instance_method(:bytesize)

    private_class_method :new

    class << self
      # Reads the profile at `path`: a String, a Pathname or another object with to_path (as
      # File.open takes them; not an IO: parse what it reads instead). Raises TypeError or
      # ArgumentError for a value that is no path, and DatadogHeap::Error naming the path and the
      # reason when the file cannot be read, is not a pprof profile or would take more memory to
      # read than the limit (see `parse`).
      def load(path)
        if IO === path
          raise TypeError, "path must be a path, not an IO, got #{Validate.describe(path)}; " \
            "to read a profile from an IO, parse what it reads: #{self}.parse(io.read)"
        end
        path = Validate.path!(:path, path)
        bytes = begin
          File.binread(path)
        rescue SystemCallError, IOError => e
          raise Error, "cannot read profile #{Validate.utf8(path)}: #{read_failure(e)}"
        end
        parse(bytes, path: path)
      end

      # Decodes a profile held in a String (e.g. Recorder#profile). `path` (nil, or what `load`
      # takes) only names it in messages and #inspect. Reading takes at most
      # ENV["DATADOG_HEAP_MAX_PROFILE_BYTES"] bytes of memory; when it is not set, 4096 times the
      # size of `bytes`, at least 64 MiB and at most 1 GiB (about a million samples). Past it,
      # DatadogHeap::Error names the limit and the variable, so a small file that decodes to a huge
      # profile cannot exhaust memory. ArgumentError when the variable is set to something other
      # than a number of bytes.
      def parse(bytes, path: nil)
        raise TypeError, "bytes must be a String, got #{Validate.describe(bytes)}" unless String === bytes

        path = Validate.path!(:path, path) unless NilClass === path
        profile = begin
          _native_parse(self, bytes)
        rescue Error => e
          raise Error, "#{path ? Validate.utf8(path) : "profile"} is not a readable pprof profile " \
            "(#{STRING_BYTESIZE.bind_call(bytes)} bytes): #{e.message}"
        end
        profile.send(:setup, path ? [path] : [], 1)
        profile
      end

      # One profile holding every sample of `profiles` (an Array of Profiles, one or more): their
      # sum, e.g. of the profiles of several forked workers. It keeps the sample types they all
      # have (sizes only if every one has them) and their period if they agree. Raises
      # DatadogHeap::Error naming the profile that shares no sample type with the others.
      def merge(profiles)
        raise TypeError, "profiles must be an Array of #{self}, got #{Validate.describe(profiles)}" unless Array === profiles
        raise ArgumentError, "profiles must not be empty" if profiles.empty?

        profiles.each_with_index do |p, i|
          raise TypeError, "profiles[#{i}] must be a #{self}, got #{Validate.describe(p)}" unless Profile === p
        end
        profiles = profiles.dup
        merged = begin
          _native_merge(self, profiles)
        rescue Error => e
          message = e.message.sub(/profile (\d+) of (\d+)/) do
            name = profiles[Integer($1) - 1].path
            name ? "#{Validate.utf8(name)} (profile #{$1} of #{$2})" : "profile #{$1} of #{$2}"
          end
          raise Error, "cannot sum #{profiles.size} profiles: #{message}"
        end
        merged.send(:setup, profiles.flat_map(&:paths), profiles.sum(&:count))
        merged
      end

      # Per site, a fit of live bytes over the profiles' times and a verdict: which sites grow
      # steadily, how fast, how sure (see DatadogHeap::Trend and SiteTrend). `profiles` is an
      # Array of at least 2 Profiles with distinct times (their end: time_nanos + duration_nanos),
      # in any order. Growing sites first (fastest first), then steady ones (most bytes last
      # seen first), then shrinking ones. `group:` and `app_root:` as for #top. Raises
      # DatadogHeap::Error naming a profile without a time, or two profiles with the same time.
      def trend(profiles, **options)
        raise TypeError, "profiles must be an Array of #{self}, got #{Validate.describe(profiles)}" unless Array === profiles
        raise ArgumentError, "profiles must hold at least 2 profiles, got #{profiles.size}" if profiles.size < 2

        profiles.each_with_index do |p, i|
          raise TypeError, "profiles[#{i}] must be a #{self}, got #{Validate.describe(p)}" unless Profile === p
        end
        Validate.known_keys!("#{self}.trend", options, TREND_KEYWORDS)
        require_relative "trend"
        Trend.sites(profiles, **options)
      end

      # Absolute directories: each as given (expanded) and, when it exists and differs, its real
      # path, since Ruby names files by either (Profile#top, Recorder#retainers).
      def app_roots(value)
        return [] if value.nil?

        list = Array === value ? value : [value]
        list.each_with_index.flat_map do |dir, i|
          dir = Validate.path!(Array === value ? :"app_root[#{i}]" : :app_root, dir)
          dir = File.expand_path(dir)
          real = begin
            File.realpath(dir)
          rescue SystemCallError
            dir
          end
          [dir, real].uniq
        end
      end

      # How a report shows the file `path` (a frame's file, as in Sample#locations), shortened as
      # memory_profiler and stackprof do: the path under the app root for application code,
      # `NAME-VERSION x/y.rb` for `.../gems/NAME-VERSION/lib/x/y.rb`, `stdlib x/y.rb` for Ruby's own
      # library (`site_ruby x/y.rb`, `vendor_ruby x/y.rb` likewise), anything else as it is
      # (`<internal:kernel>`, `(eval)`, a file of no known place). The same rules as Site#library:
      # `library_of` names the library. `app_root:` as for #top. For people, not a key: two files
      # can share a short form.
      def short_path(path, app_root: default_app_root)
        place(path, app_root)[0]
      end

      # The library the file `path` belongs to, as Site#library names it: "app", a gem's name,
      # "json (stdlib)", "ruby (internal)", "(other)"... `app_root:` as for #top.
      def library_of(path, app_root: default_app_root)
        place(path, app_root)[1]
      end

      # The app root `top` and `diff` use by default: Rails.root when Rails is loaded and has one,
      # else the current directory.
      def default_app_root
        if defined?(::Rails) && ::Rails.respond_to?(:root) && (root = ::Rails.root)
          root.to_s
        else
          Dir.pwd
        end
      end

      private

      # [short path, library] of `path` (a String, "" for a frame without a file).
      def place(path, app_root)
        raise TypeError, "path must be a String, got #{Validate.describe(path)}" unless String === path

        _native_place(Validate.utf8(String.new(path)), app_roots(app_root))
      end

      # Why File.binread failed, without the path Ruby appends to an Errno message (which may be
      # in any encoding, and is in ours already): "No such file or directory".
      def read_failure(error)
        text = SystemCallError === error ? SystemCallError.new(nil, error.errno).message : error.message
        Validate.utf8(String.new(text))
      end
    end

    # The file it was loaded from (nil when parsed from a String or merged).
    attr_reader :path

    # The files it was read from: [path], [] when parsed from a String, every merged profile's.
    attr_reader :paths

    # How many profiles it sums: 1, or how many were merged into it.
    attr_reader :count

    # [[name, unit], ...], in the order of each sample's values.
    def sample_types
      info[:sample_types]
    end

    # [name, unit] of what the period counts (allocations for ours), or nil.
    def period_type
      info[:period_type]
    end

    # Mean allocations between two samples for ours (`sample_every`).
    def period
      info[:period]
    end

    # Whether the profile measures live bytes (false when the recorder had size_enabled: false).
    def sizes?
      !info[:bytes_index].nil?
    end

    # Whether each sample says how many live objects were recorded for it and the variance of its
    # estimates (the heap-live-records and *-variance sample types): true for the profiles
    # Recorder#profile writes, false for older ones, uploads and other profilers' profiles.
    def uncertainty?
      info[:uncertainty] == true
    end

    # The profile's comments: ours say when max_tracked_objects bounded the recorder (estimates
    # thinned, or low), and `go tool pprof` shows them too.
    def comments
      info[:comments]
    end

    # When the profile starts (pprof time_nanos: nanoseconds since the Unix epoch; 0 if unknown)
    # and how long it covers (duration_nanos).
    def time_nanos
      info[:time_nanos] || 0
    end

    # How long the profile covers, in nanoseconds (pprof duration_nanos; 0 if unknown).
    def duration_nanos
      info[:duration_nanos] || 0
    end

    # Where the profile ends, in seconds since the Unix epoch (nil if it has no time): the moment
    # its live heap was seen.
    def end_time
      return nil if time_nanos <= 0

      (time_nanos + duration_nanos) / 1e9
    end

    # A short name for messages: the path, or "profile N".
    def display_name(index = nil)
      path ? Validate.utf8(path) : "profile #{index ? index + 1 : "(string)"}"
    end

    # Sum of live objects over every sample, weighted (what the samples stand for).
    def total_objects
      info[:total_objects] || 0
    end

    # Sum of live bytes over every sample; nil when the profile has no sizes.
    def total_bytes
      info[:total_bytes]
    end

    # Every sample, in file order (samples sharing a stack share one frozen locations array).
    def samples
      objects_at = info[:objects_index]
      bytes_at = info[:bytes_index]
      @samples ||= _native_samples.map do |locations, values, class_name, gen_age, retained_by|
        Sample.new(locations, values, class_name, gen_age, objects_at && values[objects_at], bytes_at && values[bytes_at],
          retained_by)
      end.freeze
    end

    # The `n` sites holding the most live bytes (`by: :size`, the default) or objects
    # (`by: :count`), largest first. A profile without sizes is ranked by count whatever `by` says.
    # `group:` (:site, the default, :location, :file, :gem or :class) sums sites into coarser
    # groups; `app_root:` (a directory, or an Array of them; nil for none) says what application
    # code is (see the class comment). An unknown keyword is an ArgumentError naming it (Ruby's own
    # error for an unknown keyword would call the key's inspect).
    def top(n = 10, **options)
      Validate.known_keys!("#{Profile}#top", options, TOP_KEYWORDS)
      Validate.integer!(:n, n, 1, 2**62 - 1)
      by = options.fetch(:by, :size)
      unless Symbol === by && SORT_KEYS.include?(by)
        raise ArgumentError, "by must be one of #{SORT_KEYS.map(&:inspect).join(", ")}, got #{Validate.describe(by)}"
      end

      structs(Site, _native_top(n, query(options, sizes? && by == :size ? "size" : "count")))
    end

    # #top's sites, each with the `retained by` labels of its samples summed, the most bytes first:
    # `[[site, [[path, live_objects, live_bytes], ...]], ...]` (see Recorder#retainers). Sites
    # whose samples carry no label have an empty list. Takes #top's arguments.
    def top_retained(n = 10, **options)
      sites = top(n, **options)
      by = options.fetch(:by, :size)
      sites.zip(_native_retained_by(n, query(options, sizes? && by == :size ? "size" : "count")))
    end

    # Whether any sample carries a `retained by` label.
    def retained_by?
      samples.any?(&:retained_by)
    end

    # The sites of this profile (the old one) and `other` (the new one), the largest growth in
    # live bytes first, then in objects. Every site of either profile is there, shrunk and
    # vanished ones last; keep those with a positive change to hunt leaks. `group:` and
    # `app_root:` as for #top.
    def diff(other, **options)
      raise TypeError, "other must be a #{Profile}, got #{Validate.describe(other)}" unless Profile === other

      Validate.known_keys!("#{Profile}#diff", options, DIFF_KEYWORDS)
      structs(SiteDiff, _native_diff(other, query(options, sizes? && other.sizes? ? "size" : "count")))
    end

    # Its source (path, string or sum), sample count and sample types in one line.
    def inspect
      source = if count > 1
        "(sum of #{count})"
      else
        path ? Validate.utf8(path) : "(string)"
      end
      "#<#{self.class} #{source} samples=#{info[:samples]} " \
        "types=#{sample_types.map { |t| t.join("/") }.join(",")}>"
    end

    private

    def setup(paths, count)
      @paths = paths.map { |p| p.dup.freeze }.freeze
      @path = @paths.first if count == 1
      @count = count
      @info = _native_info.freeze
    end

    # A `struct` (Site or SiteDiff) for each of `rows`, the extension's Hashes: each member
    # filled from the value under its name (KeyError if the extension left one out).
    def structs(struct, rows)
      members = struct.members
      rows.map { |row| struct.new(*row.fetch_values(*members)) }
    end

    # What the natives of #top, #top_retained and #diff are asked: [`by` ("size" or "count"),
    # group name, app root directories], the last two from their options.
    def query(options, by)
      group = options.fetch(:group, :site)
      unless Symbol === group && GROUPS.include?(group)
        raise ArgumentError, "group must be one of #{GROUPS.map(&:inspect).join(", ")}, got #{Validate.describe(group)}"
      end

      [by, group.to_s, Profile.app_roots(options.fetch(:app_root) { Profile.default_app_root })]
    end


    attr_reader :info
  end
end
