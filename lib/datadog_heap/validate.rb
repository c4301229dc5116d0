# frozen_string_literal: true

module DatadogHeap
  # Argument checks shared by the public API: TypeError for the wrong type, ArgumentError for an
  # out-of-range value, both naming the argument and showing the value.
  #
  # The value may be anything, hostile included: a BasicObject (no methods at all), an object
  # whose inspect, ==, is_a? or respond_to? raises or lies, an array nested 100k deep. So types are
  # checked with Module#=== (which asks the VM, not the value), the class is read with Kernel#class
  # bound to the value, core scalars are shown with their class's own inspect (bound), arrays and
  # hashes a few levels deep by hand, and anything else by its class name alone.
  module Validate
    KERNEL_CLASS = Kernel.instance_method(:class)
    KERNEL_RESPOND_TO = Kernel.instance_method(:respond_to?)
    MODULE_NAME = Module.instance_method(:name)
    MODULE_TO_S = Module.instance_method(:to_s)
    ARRAY_SIZE = Array.instance_method(:size)
    ARRAY_FIRST = Array.instance_method(:first)
    HASH_SIZE = Hash.instance_method(:size)
    HASH_EACH_PAIR = Hash.instance_method(:each_pair)
    RANGE_BEGIN = Range.instance_method(:begin)
    RANGE_END = Range.instance_method(:end)
    RANGE_EXCLUDE_END = Range.instance_method(:exclude_end?)
    # Longest text shown for one value, in characters.
    SHOWN_LENGTH = 200
    # How deep into arrays and hashes, and how many of their elements, a value is shown.
    SHOWN_DEPTH = 3
    SHOWN_ELEMENTS = 5
    # What a user's inspect may raise that still leaves us a message to build.
    INSPECT_FAILURES = [StandardError, SystemStackError].freeze

    module_function

    def integer!(name, value, min, max)
      raise TypeError, "#{name} must be an Integer, got #{describe(value)}" unless Integer === value
      return value if min <= value && value <= max

      raise ArgumentError, "#{name} must be between #{min} and #{max}, got #{show(value)}"
    end

    def one_of!(name, value, allowed)
      return value if allowed.any? { |a| Symbol === value && a == value }

      raise TypeError, "#{name} must be a Symbol, got #{describe(value)}" unless Symbol === value

      raise ArgumentError, "#{name} must be one of #{allowed.map(&:inspect).join(", ")}, got #{show(value)}"
    end

    def positive_number!(name, value, max)
      unless Integer === value || Float === value
        raise TypeError, "#{name} must be a number, got #{describe(value)}"
      end
      return value if value > 0 && value <= max

      raise ArgumentError, "#{name} must be above 0 and at most #{max}, got #{show(value)}"
    end

    def boolean!(name, value)
      return value if TrueClass === value || FalseClass === value

      raise TypeError, "#{name} must be true or false, got #{describe(value)}"
    end

    # Raises ArgumentError naming every key of `options` that is not a key of `known` (Symbols).
    def known_keys!(method, options, known)
      unknown = nil
      options.each_key { |key| (unknown ||= []) << key unless Symbol === key && known.key?(key) }
      return unless unknown

      raise ArgumentError, "#{method}: unknown keyword#{"s" if unknown.size > 1} " \
        "#{unknown.map { |key| show(key) }.join(", ")}; known: #{known.keys.map(&:inspect).join(", ")}"
    end

    # `value` as a plain String path: a String, or what to_path returns (a Pathname, ...). TypeError
    # for anything else, IOs included (a path is replaced by a rename, the IO would not see it);
    # ArgumentError for a String no file can be named by.
    def path!(name, value)
      if IO === value
        raise TypeError, "#{name} must be a path, not an IO, got #{describe(value)}; " \
          "to write into an IO, write the recorder's profile to it"
      end
      path = String === value ? value : to_path(name, value)
      path = String.new(path) # a plain String: a subclass could redefine what is called below
      unless path.encoding.ascii_compatible?
        raise ArgumentError, "#{name} must be in an ASCII-compatible encoding, got #{show(path)} (#{path.encoding})"
      end
      raise ArgumentError, "#{name} must not be empty" if path.empty?
      raise ArgumentError, "#{name} must not contain a NUL byte, got #{show(path)}" if path.include?("\0")

      path
    end

    # What value.to_path returns when it has one and it returns a String; else a TypeError.
    def to_path(name, value)
      has_to_path = begin
        KERNEL_RESPOND_TO.bind_call(value, :to_path)
      rescue *INSPECT_FAILURES # a respond_to_missing? that raises
        false
      end
      raise TypeError, "#{name} must be a String or Pathname (or have to_path), got #{describe(value)}" unless has_to_path

      path = begin
        value.to_path
      rescue *INSPECT_FAILURES => e
        raise TypeError, "#{name}: #{describe(value)} raised #{class_name(e)} from to_path"
      end
      return path if String === path

      raise TypeError, "#{name}: #{describe(value)} returned #{describe(path)} from to_path, not a String"
    end

    # The value shown, then its class: `"2" (String)`.
    def describe(value)
      "#{show(value)} (#{class_name(value)})"
    end

    # The value as inspect shows it, in UTF-8, cut at SHOWN_LENGTH characters; `#<ClassName>`
    # when its inspect cannot be used.
    def show(value, depth = 0)
      text = case value
      when Array then show_array(value, depth)
      when Hash then show_hash(value, depth)
      when Kernel then own_inspect(value)
      else "#<#{class_name(value)}>" # a BasicObject: its method_missing could answer anything
      end
      return text if text.length <= SHOWN_LENGTH

      "#{text[0, SHOWN_LENGTH]}... (#{text.length} characters)"
    end

    def show_array(array, depth)
      size = ARRAY_SIZE.bind_call(array)
      return "[]" if size == 0
      return "[...#{size} elements]" if depth >= SHOWN_DEPTH

      shown = ARRAY_FIRST.bind_call(array, SHOWN_ELEMENTS).map { |element| show(element, depth + 1) }
      shown << "...#{size - SHOWN_ELEMENTS} more" if size > SHOWN_ELEMENTS
      "[#{shown.join(", ")}]"
    end

    def show_hash(hash, depth)
      size = HASH_SIZE.bind_call(hash)
      return "{}" if size == 0
      return "{...#{size} entries}" if depth >= SHOWN_DEPTH

      shown = []
      HASH_EACH_PAIR.bind_call(hash) do |key, value|
        break if shown.size == SHOWN_ELEMENTS

        shown << "#{show(key, depth + 1)}=>#{show(value, depth + 1)}"
      end
      shown << "...#{size - SHOWN_ELEMENTS} more" if size > SHOWN_ELEMENTS
      "{#{shown.join(", ")}}"
    end

    # The inspect of a value whose exact class is one of these core classes: their own inspect
    # method, bound, so neither a subclass nor a redefinition runs.
    CORE_INSPECT = [String, Symbol, Integer, Float, Rational, Complex, NilClass, TrueClass, FalseClass,
      Range, Module, Class, Encoding, IO, File, Pathname].to_h { |klass| [klass, klass.instance_method(:inspect)] }.freeze

    # A core scalar shown by its class's own inspect (a Range is shown only when both ends are
    # scalars), as valid UTF-8; anything else as `#<ClassName>`. No user inspect runs: one could
    # raise, lie, or walk a structure nested deep enough for Ruby 3.1 to abort if a GC starts there.
    def own_inspect(value)
      klass = KERNEL_CLASS.bind_call(value)
      inspect = CORE_INSPECT[klass]
      return "#<#{class_name(value)}>" unless inspect
      return show_range(value) if klass == Range

      utf8(String.new(inspect.bind_call(value)))
    rescue *INSPECT_FAILURES
      "#<#{class_name(value)}>"
    end

    def show_range(range)
      ends = [RANGE_BEGIN.bind_call(range), RANGE_END.bind_call(range)]
      return "#<Range>" unless ends.all? { |e| CORE_INSPECT.key?(KERNEL_CLASS.bind_call(e)) && !(Range === e) }

      "#{own_inspect(ends[0]) unless ends[0].nil?}#{RANGE_EXCLUDE_END.bind_call(range) ? "..." : ".."}" \
        "#{own_inspect(ends[1]) unless ends[1].nil?}"
    end

    # The real class's name (Kernel#class and Module#name bound, so neither can be redefined);
    # `#<Class:0x...>` for an anonymous class.
    def class_name(value)
      klass = KERNEL_CLASS.bind_call(value)
      utf8(MODULE_NAME.bind_call(klass) || MODULE_TO_S.bind_call(klass))
    end

    # `text` as valid UTF-8, so that it goes into a message whatever its encoding: invalid bytes
    # and characters UTF-8 lacks become U+FFFD, and an encoding with no converter is escaped.
    def utf8(text)
      return text if text.encoding == Encoding::UTF_8 && text.valid_encoding?

      text.encode(Encoding::UTF_8, invalid: :replace, undef: :replace)
    rescue EncodingError
      text.dump.force_encoding(Encoding::UTF_8)
    end
  end
end
