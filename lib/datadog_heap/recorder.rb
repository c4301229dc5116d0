# frozen_string_literal: true

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
  class Recorder
    DEFAULTS = {sample_every: 1024, sample_rate: 1, size_enabled: true, max_frames: 400,
                max_tracked_objects: 262_144}.freeze
    MAX_FRAMES_LIMIT = 3000
    U32_MAX = 2**32 - 1

    def self.new(sample_every: DEFAULTS[:sample_every], sample_rate: DEFAULTS[:sample_rate],
      size_enabled: DEFAULTS[:size_enabled], max_frames: DEFAULTS[:max_frames],
      max_tracked_objects: DEFAULTS[:max_tracked_objects])
      Validate.integer!(:sample_every, sample_every, 1, U32_MAX)
      Validate.integer!(:sample_rate, sample_rate, 1, U32_MAX)
      Validate.boolean!(:size_enabled, size_enabled)
      Validate.integer!(:max_frames, max_frames, 1, MAX_FRAMES_LIMIT)
      Validate.integer!(:max_tracked_objects, max_tracked_objects, 1, 2**40)
      DatadogHeap.warn_about_ruby_version
      _native_new(self, sample_every, sample_rate, size_enabled, max_frames, max_tracked_objects)
    end

    def sample_rate=(value)
      Validate.integer!(:sample_rate, value, 1, U32_MAX)
      _native_set_sample_rate(value)
    end

    def size_enabled=(value)
      Validate.boolean!(:size_enabled, value)
      _native_set_size_enabled(value)
    end

    # Records `obj` as allocated at `locations` (innermost frame first, each [name, path, line]).
    # For profilers that sample on their own; returns true when the object became pending.
    def record_allocation(obj, weight: 1, class_name: nil, locations: [])
      _native_record_allocation(obj, weight, class_name, locations)
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
    # Returns the path.
    def write_profile(path)
      path = path.to_s
      data = profile
      tmp = "#{path}.tmp-#{Process.pid}"
      File.binwrite(tmp, data)
      File.rename(tmp, path)
      path
    ensure
      File.unlink(tmp) if tmp && File.exist?(tmp)
    end

    def inspect
      "#<#{self.class} sample_every=#{sample_every} sample_rate=#{sample_rate} " \
        "size_enabled=#{size_enabled} max_frames=#{max_frames} max_tracked_objects=#{max_tracked_objects}>"
    end
  end

  # One tracked object as the last full update saw it.
  class LiveObject
    attr_reader :locations, :weight, :size, :class_name, :alloc_gen, :gen_age

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

    def inspect
      top = locations.first
      "#<#{self.class} #{class_name || "?"} weight=#{weight} size=#{size} gen_age=#{gen_age} " \
        "at #{top ? "#{top[1]}:#{top[2]}" : "?"}>"
    end
  end

  # Argument checks shared by the public API: TypeError for the wrong type, ArgumentError for an
  # out-of-range value, both naming the argument and the value.
  module Validate
    module_function

    def integer!(name, value, min, max)
      raise TypeError, "#{name} must be an Integer, got #{value.inspect} (#{value.class})" unless value.is_a?(Integer)
      return value if value.between?(min, max)

      raise ArgumentError, "#{name} must be between #{min} and #{max}, got #{value}"
    end

    def boolean!(name, value)
      return value if value == true || value == false

      raise TypeError, "#{name} must be true or false, got #{value.inspect} (#{value.class})"
    end
  end
end
