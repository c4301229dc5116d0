# frozen_string_literal: true

module DatadogHeap
  # A pprof heap profile read back: ours (Recorder#profile), libdatadog's or Go's; gzip, zstd or
  # raw protobuf. Decoded once, by the Rust core, when loaded.
  #
  #   profile = DatadogHeap::Profile.load("heap.pb.gz")
  #   profile.sample_types          # => [["heap-live-samples", "count"], ["heap-live-size", "bytes"]]
  #   profile.top(5, by: :size)     # => [Profile::Site, ...], the sites holding the most live bytes
  #   old.diff(new)                 # => [Profile::SiteDiff, ...], the largest growth first
  #
  # A site is an allocation stack plus the allocated class. Locations are arrays of
  # [name, path, line], innermost frame first, as in LiveObject#locations.
  class Profile
    # One pprof sample. `values` follow `sample_types`; `objects` and `bytes` pick the live-object
    # count and the live bytes out of them (`bytes` is nil when the profile has no sizes).
    Sample = Struct.new(:locations, :values, :class_name, :gen_age, :objects, :bytes)

    # An allocation site. `location` is "file:line" of the innermost app frame (else the innermost
    # frame); `share` is its fraction (0.0..1.0) of the profile's total by the sort key;
    # `median_gen_age` is the median number of GCs its objects survived (nil if unknown).
    Site = Struct.new(:locations, :class_name, :location, :live_bytes, :live_objects, :share, :median_gen_age)

    # A site in two profiles. `*_change` is new - old; `*_relative` is change / old, nil when old
    # is 0 (a new site, or a profile without sizes).
    SiteDiff = Struct.new(:locations, :class_name, :location, :old_bytes, :new_bytes, :old_objects, :new_objects,
      :bytes_change, :objects_change, :bytes_relative, :objects_relative)

    SORT_KEYS = %i[size count].freeze
    TOP_KEYWORDS = {by: true}.freeze
    # Bound, so that a String subclass cannot answer for it.
    STRING_BYTESIZE = String.instance_method(:bytesize)

    private_class_method :new

    class << self
      # Reads the profile at `path`: a String, a Pathname or another object with to_path (as
      # File.open takes them; not an IO: parse what it reads instead). Raises TypeError or
      # ArgumentError for a value that is no path, and DatadogHeap::Error naming the path and the
      # reason when the file cannot be read or is not a pprof profile.
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
      # takes) only names it in messages and #inspect.
      def parse(bytes, path: nil)
        raise TypeError, "bytes must be a String, got #{Validate.describe(bytes)}" unless String === bytes

        path = Validate.path!(:path, path) unless NilClass === path
        profile = begin
          _native_parse(self, bytes)
        rescue Error => e
          raise Error, "#{path ? Validate.utf8(path) : "profile"} is not a readable pprof profile " \
            "(#{STRING_BYTESIZE.bind_call(bytes)} bytes): #{e.message}"
        end
        profile.send(:setup, path)
        profile
      end

      private

      # Why File.binread failed, without the path Ruby appends to an Errno message (which may be
      # in any encoding, and is in ours already): "No such file or directory".
      def read_failure(error)
        text = SystemCallError === error ? SystemCallError.new(nil, error.errno).message : error.message
        Validate.utf8(String.new(text))
      end
    end

    # The file it was loaded from (nil when parsed from a String).
    attr_reader :path

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
      @samples ||= _native_samples.map do |locations, values, class_name, gen_age|
        Sample.new(locations, values, class_name, gen_age, objects_at && values[objects_at], bytes_at && values[bytes_at])
      end.freeze
    end

    # The `n` sites holding the most live bytes (`by: :size`, the default) or objects
    # (`by: :count`), largest first. A profile without sizes is ranked by count whatever `by` says.
    # `by` is the only keyword; another is an ArgumentError naming it (Ruby's own error for an
    # unknown keyword would call the key's inspect).
    def top(n = 10, **options)
      Validate.known_keys!("#{Profile}#top", options, TOP_KEYWORDS)
      Validate.integer!(:n, n, 1, 2**62 - 1)
      by = options.fetch(:by, :size)
      unless Symbol === by && SORT_KEYS.include?(by)
        raise ArgumentError, "by must be one of #{SORT_KEYS.map(&:inspect).join(", ")}, got #{Validate.describe(by)}"
      end

      _native_top(n, sizes? && by == :size ? "size" : "count").map { |row| Site.new(*row) }
    end

    # The sites of this profile (the old one) and `other` (the new one), the largest growth in
    # live bytes first, then in objects. Every site of either profile is there, shrunk and
    # vanished ones last; keep those with a positive change to hunt leaks.
    def diff(other)
      raise TypeError, "other must be a #{Profile}, got #{Validate.describe(other)}" unless Profile === other

      _native_diff(other).map { |row| SiteDiff.new(*row) }
    end

    def inspect
      "#<#{self.class} #{path ? Validate.utf8(path) : "(string)"} samples=#{info[:samples]} " \
        "types=#{sample_types.map { |t| t.join("/") }.join(",")}>"
    end

    private

    def setup(path)
      @path = path&.dup&.freeze
      @info = _native_info.freeze
    end

    attr_reader :info
  end
end
