# frozen_string_literal: true

module DatadogHeap
  # What keeps the sampled objects of the top allocation sites alive: for each, a shortest chain
  # of references from a GC root, named as a Ruby reader names them.
  #
  #   rec.retainers(top: 5, per_site: 3).to_s
  #   # constant LeakyCache::CACHE (Hash) -> [:k] (String)
  #   # constant QUOTES (Hash) -> key (Array of 4) (Array) -> [2] (String)
  #   # global $registry (Registry) -> @items (Array) -> [3] (String)
  #   # thread #<Thread main> local :seen (Array) -> [0] (String)
  #   # class Foo ivar @instances (Array) -> [2] (Foo)
  #
  # The search (ext/datadog_heap/src/recorder/retainers.rs) runs natively, under the GVL, only
  # when asked: a breadth-first walk of the VM's own references from every GC root but the
  # calling thread's machine stack, bounded by max_depth, max_visited and time_budget. Naming an
  # edge takes a second look at the object holding it (which ivar, which key, which index, which
  # constant), done here with methods bound from the core classes (UnboundMethod#bind_call), so a
  # BasicObject or an object overriding #instance_variables, #each or #== is named all the same.
  #
  # A path names the program's structure, not its data: a Hash key is shown by its class and
  # size (`key (String, 12 bytes)`, `[(Array of 4)]`), except Symbols, nil, true, false, named
  # modules and Integers from -1024 to 1024, which are identifiers the program itself holds. With
  # `values: true` keys are shown as they are (`["CHF", "GBP"]`): a path may then carry a
  # cookie or a token that was a key, so only ask for it where the output stays with you.
  class Retainers
    # A top site, ranked as `Profile#top` ranks a profile of the same objects, and the objects
    # searched for.
    # `label`, `class_name`, `location`, `function`, `callee`, `called_from`, `live_bytes`,
    # `live_objects`, `share` and `median_gen_age` are as in Profile::Site; `objects` are the
    # Retained objects searched for, the largest first.
    Site = Struct.new(:label, :class_name, :location, :function, :callee, :called_from, :live_bytes,
      :live_objects, :share, :median_gen_age, :objects)

    # One sampled object and what keeps it alive. `status` is :alive (path says why),
    # :unreachable (no root reaches it: garbage at the next GC), :not_found (the search stopped
    # before it: see Retainers#stopped and #depth_cut) or :collected (gone before the search).
    # `path` is the whole chain as one String; `root` the kind of GC root it starts from.
    # `record_id` is the object's record (Recorder#record_id_for); `class_name`, `size`, `weight`
    # and `gen_age` are as in LiveObject; `steps` is the path one step at a time ("edge (Class)"
    # Strings), nil unless :alive.
    Retained = Struct.new(:record_id, :class_name, :size, :weight, :gen_age, :status, :path, :root, :steps) do
      def alive?
        status == :alive
      end
    end

    # The top sites searched (`sites`, Site rows), how many objects the search visited
    # (`visited`) in how many seconds (`elapsed`), why it stopped early (`stopped`: :time_budget,
    # :max_visited, or nil), whether objects lay deeper than max_depth (`depth_cut`), and the
    # options it ran with (`limits`).
    attr_reader :sites, :visited, :elapsed, :stopped, :depth_cut, :limits

    # Built by Recorder#retainers.
    def initialize(sites, visited:, elapsed:, stopped:, depth_cut:, limits:)
      @sites = sites.freeze
      @visited = visited
      @elapsed = elapsed
      @stopped = stopped
      @depth_cut = depth_cut
      @limits = limits.freeze
    end

    # Every object searched for, site by site.
    def objects
      sites.flat_map(&:objects)
    end

    # {record_id => path} for the objects a path was found for (Recorder#profile(retainers:)).
    def paths_by_record_id
      objects.select(&:alive?).to_h { |o| [o.record_id, o.path] }
    end

    # Why the search ended early, for a reader; nil when it did not.
    def limit_note
      case stopped
      when :time_budget then "the search hit its time budget (#{limits[:time_budget]} s) after #{visited} objects"
      when :max_visited then "the search hit its visited-set cap (max_visited: #{limits[:max_visited]})"
      else
        "some objects lie deeper than max_depth: #{limits[:max_depth]} from every root" if depth_cut && objects.any? { |o| o.status == :not_found }
      end
    end

    # The report the CLI prints for a live recorder.
    def to_s
      lines = ["Retainers of #{plural(objects.size, "sampled object")} at the top #{plural(sites.size, "site")} " \
        "(#{visited} objects visited in #{format("%.2f", elapsed)} s)"]
      note = limit_note
      lines << "Note: #{note}" if note
      sites.each_with_index do |site, i|
        lines << ""
        lines << "#{i + 1}. #{site.label} (#{site.class_name || "?"}): #{site.live_objects} live objects, #{site.live_bytes} bytes"
        site.objects.each { |o| lines << "   #{Retainers.describe(o)}" }
      end
      lines.join("\n")
    end

    # Its counts of sites, objects and visited objects, and why it stopped, in one line.
    def inspect
      "#<#{self.class} sites=#{sites.size} objects=#{objects.size} visited=#{visited} stopped=#{stopped.inspect}>"
    end


    # How the CLI shows the Retained `object`: its path, or why it has none.
    def self.describe(object)
      case object.status
      when :alive then object.path
      when :unreachable then "unreachable from every root: garbage at the next GC"
      when :collected then "collected before the search"
      else "not found within the search's limits"
      end
    end

    private

    def plural(n, noun)
      "#{n} #{noun}#{"s" unless n == 1}"
    end

    public

    # Paths as text, read back from a profile's `retained by` labels: the shape of a path (its
    # keys and indexes as `*`, so the objects a cache holds under different keys read as one
    # holder), and a path with its keys shown by class and size (Namer.key_text), for paths
    # written with `values: true` or by a datadog_heap that always showed keys.
    module PathText
      # Where a step ends: the class of the object it reaches, in parentheses, before the next
      # " -> " or the end of the path.
      STEP_END = / \(([^()]*)\)(?= -> |\z)/
      SEPARATOR = " -> "
      # An edge holding a value: `[KEY]` (a Hash's value, an Array's index) or `key KEY`.
      VALUE_EDGE = /\A(?:\[(?<value>.*)\]|key (?<value>.*))\z/m

      module_function

      # The steps of `path`, `[[edge, class name or nil], ...]`. A step ends at the first
      # STEP_END outside a quoted String, so a key shown as `"a (String) -> b"` stays whole.
      def steps(path)
        steps = []
        pos = 0
        while pos < path.size
          match = step_end(path, pos)
          unless match
            steps << [path[pos..], nil]
            break
          end
          steps << [path[pos...match.begin(0)], match[1]]
          pos = match.end(0) + SEPARATOR.size
        end
        steps
      end

      # The first STEP_END from `pos` with an even number of unescaped `"` before it in the step.
      def step_end(path, pos)
        from = pos
        while (match = STEP_END.match(path, from))
          return match if path[pos...match.begin(0)].gsub(/\\./m, "").count('"').even?

          from = match.begin(0) + 1
        end
        nil
      end

      # `path` with every Hash key and Array index as `*`:
      # `constant QUOTER (Quoter) -> @memo (Hash) -> key * (Array) -> [*] (String)`.
      def shape(path)
        join(steps(path).map { |edge, klass| [replace_value(edge) { "*" }, klass] })
      end

      # `path` with its Hash keys shown as a path written without `values` shows them: Symbols,
      # nil, true, false, module names and small Integers as they are, anything else by class
      # (and size, when the text says it). Array indexes stay.
      def redact(path)
        parent = nil
        redacted = steps(path).map do |edge, klass|
          edge = replace_value(edge) { |value| parent == "Array" && value.match?(/\A\d+\z/) ? value : redact_value(value) }
          parent = klass
          [edge, klass]
        end
        join(redacted)
      end

      def join(steps)
        steps.map { |edge, klass| klass ? "#{edge} (#{klass})" : edge }.join(SEPARATOR)
      end

      # `edge` with the key it holds replaced by what the block returns for it.
      def replace_value(edge)
        match = VALUE_EDGE.match(edge)
        return edge unless match

        value = yield match[:value]
        edge.start_with?("[") ? "[#{value}]" : "key #{value}"
      end

      def redact_value(value)
        case value
        when /\A\(.*\)\z/m, /\A:/, "nil", "true", "false", /\A[A-Z]\w*(::[A-Z]\w*)*\z/ then value
        when /\A-?\d+\z/ then value.to_i.between?(-Namer::SHOWN_INTEGER, Namer::SHOWN_INTEGER) ? value : "(Integer)"
        when /\A"/ then string_value(value)
        when /\A\[/ then "(Array)"
        when /\A\{/ then "(Hash)"
        when /\A#<([^<>]*)>\z/ then "(#{$1})"
        else "(value)"
        end
      end

      # `(String, N bytes)` for the inspect of a String, `(String)` when it was cut short.
      def string_value(text)
        "(String, #{text.undump.bytesize} bytes)"
      rescue RuntimeError, ArgumentError, EncodingError
        "(String)"
      end
    end

    # Names the references of one path found by the native search.
    module Namer
      KERNEL = {
        class: Kernel.instance_method(:class),
        ivars: Kernel.instance_method(:instance_variables),
        ivar_get: Kernel.instance_method(:instance_variable_get),
        singleton_class: Kernel.instance_method(:singleton_class),
      }.freeze
      EQUAL = BasicObject.instance_method(:equal?)
      MODULE_CONSTANTS = Module.instance_method(:constants)
      MODULE_CONST_GET = Module.instance_method(:const_get)
      MODULE_AUTOLOAD = Module.instance_method(:autoload?)
      MODULE_CVARS = Module.instance_method(:class_variables)
      MODULE_CVAR_GET = Module.instance_method(:class_variable_get)
      HASH_DEFAULT = Hash.instance_method(:default)
      HASH_DEFAULT_PROC = Hash.instance_method(:default_proc)
      ARRAY_INDEX = Array.instance_method(:index)
      STRUCT_MEMBERS = Struct.instance_method(:members)
      STRUCT_AREF = Struct.instance_method(:[])
      PROC_BINDING = Proc.instance_method(:binding)
      BINDING_LOCALS = Binding.instance_method(:local_variables)
      BINDING_LOCAL_GET = Binding.instance_method(:local_variable_get)
      BINDING_RECEIVER = Binding.instance_method(:receiver)
      METHOD_RECEIVER = Method.instance_method(:receiver)
      THREAD_KEYS = Thread.instance_method(:keys)
      THREAD_AREF = Thread.instance_method(:[])
      THREAD_VARIABLES = Thread.instance_method(:thread_variables)
      THREAD_VARIABLE_GET = Thread.instance_method(:thread_variable_get)
      THREAD_NAME = Thread.instance_method(:name)
      STRING_BYTESIZE = String.instance_method(:bytesize)
      # Integer keys from -SHOWN_INTEGER to SHOWN_INTEGER are shown as they are without `values`.
      SHOWN_INTEGER = 1024
      # What a hostile object's methods may raise while we look at it.
      FAILURES = [StandardError, SystemStackError].freeze
      # The GC's names for its roots, as a reader would say them.
      ROOTS = {
        "vm" => "the VM",
        "global_tbl" => "a global variable",
        "global_list" => "a C global (rb_gc_register_address)",
        "end_proc" => "an at_exit block",
        "finalizers" => "a finalizer",
      }.freeze

      module_function

      # `[path String, root, steps]` for `nodes` (objects, nil for internal ones, which `notes`
      # describes) found from a root of `category`. Hash keys are shown as they are with
      # `values`, else by Namer.key_text (their class and size).
      def name_path(category, nodes, notes, values = false)
        visible = nodes.each_index.reject { |i| NilClass === nodes[i] }
        anchor = visible[0...-1].reverse.find { |i| anchor?(nodes[i]) }
        steps = []
        if anchor
          start = anchor
          first = nodes[anchor]
        else
          start = visible.first
          first = nodes[start] if start
        end
        return [ROOTS.fetch(category, "#{category} root"), category, []] if start.nil?

        following = visible.select { |i| i > start }
        head = anchor ? nil : root_head(category, first)
        prev = start
        following.each_with_index do |i, k|
          edge = edge_name(nodes[prev], nodes[i], values)
          hops = notes[(prev + 1)...i].compact
          edge ||= hops.empty? ? "?" : hops.map { |h| "<#{h}>" }.join(" -> ")
          if k == 0 && anchor
            steps << "#{anchor_text(first, edge)} (#{class_name(nodes[i])})"
          else
            steps << "#{edge} (#{class_name(nodes[i])})"
          end
          prev = i
        end
        steps.unshift("#{head} (#{class_name(first)})") if head
        steps.unshift(anchor_text(first, nil)) if anchor && following.empty?
        [steps.join(" -> "), category, steps]
      end

      # A named module or a thread: where a reader starts.
      def anchor?(object)
        return true if Thread === object

        Module === object && !module_name(object).nil?
      end

      def module_name(mod)
        name = Validate::MODULE_NAME.bind_call(mod)
        name && !name.start_with?("#<") ? name : nil
      end

      # The first step, from the anchor `object` over `edge`.
      def anchor_text(object, edge)
        if Thread === object
          who = "thread #{thread_label(object)}"
          return edge ? "#{who} #{edge}" : who
        end
        name = module_name(object)
        kind = Class === object ? "class" : "module"
        case edge
        when nil then "#{kind} #{name}"
        when /\Aconstant (.*)\z/m then "constant #{EQUAL.bind_call(object, Object) ? "" : "#{name}::"}#{$1}"
        when /\A@@/ then "#{kind} #{name} class variable #{edge}"
        when /\A@/ then "#{kind} #{name} ivar #{edge}"
        else "#{kind} #{name} -> #{edge}"
        end
      end

      def thread_label(thread)
        name = THREAD_NAME.bind_call(thread)
        return "#<Thread main>" if EQUAL.bind_call(thread, Thread.main)

        "#<Thread #{name || format("0x%x", thread.__id__)}>"
      rescue *FAILURES
        "#<Thread>"
      end

      # How the root of `category` refers to `object`.
      def root_head(category, object)
        if category == "global_tbl"
          name = global_name(object)
          return "global #{name}" if name
        end
        ROOTS.fetch(category, "#{category} root")
      end

      def global_name(object)
        global_variables.each do |name|
          value = begin
            eval(name.to_s, TOPLEVEL_BINDING) # rubocop:disable Security/Eval -- a global's name
          rescue *FAILURES, ScriptError
            next
          end
          return name.to_s if EQUAL.bind_call(value, object)
        end
        nil
      end

      # How `parent` refers to `child`, or nil when no look at `parent` says.
      def edge_name(parent, child, values = false)
        name = case parent
        when Module then module_edge(parent, child)
        when Thread then thread_edge(parent, child)
        when Hash then hash_edge(parent, child, values)
        when Array then array_edge(parent, child)
        when Struct then struct_edge(parent, child)
        when Proc then binding_edge(proc_binding(parent), child)
        when Binding then binding_edge(parent, child)
        when Method then "receiver" if EQUAL.bind_call(METHOD_RECEIVER.bind_call(parent), child)
        when Range then range_edge(parent, child)
        when Fiber then "stack"
        end
        name || ivar_edge(parent, child) || singleton_edge(parent, child)
      rescue *FAILURES
        nil
      end

      def module_edge(mod, child)
        MODULE_CONSTANTS.bind_call(mod, false).each do |const|
          next if MODULE_AUTOLOAD.bind_call(mod, const)

          value = begin
            MODULE_CONST_GET.bind_call(mod, const, false)
          rescue *FAILURES, ScriptError
            next
          end
          return "constant #{const}" if EQUAL.bind_call(value, child)
        end
        MODULE_CVARS.bind_call(mod, false).each do |cvar|
          return cvar.to_s if EQUAL.bind_call(MODULE_CVAR_GET.bind_call(mod, cvar), child)
        end
        nil
      end

      def thread_edge(thread, child)
        return "fiber" if Fiber === child

        THREAD_KEYS.bind_call(thread).each do |key|
          return "local #{Validate.show(key)}" if EQUAL.bind_call(THREAD_AREF.bind_call(thread, key), child)
        end
        names = THREAD_VARIABLES.bind_call(thread)
        if Hash === child && !names.empty? && names.all? { |k| EQUAL.bind_call(THREAD_VARIABLE_GET.bind_call(thread, k), hash_value(child, k)) }
          return "variables"
        end
        "stack"
      end

      def hash_value(hash, key)
        Validate::HASH_EACH_PAIR.bind_call(hash) { |k, v| return v if EQUAL.bind_call(k, key) }
        nil
      end

      def hash_edge(hash, child, values = false)
        Validate::HASH_EACH_PAIR.bind_call(hash) do |key, value|
          return "[#{values ? Validate.show(key) : key_text(key)}]" if EQUAL.bind_call(value, child)
          return "key #{values ? Validate.show(key) : key_text(key)}" if EQUAL.bind_call(key, child)
        end
        return "default proc" if EQUAL.bind_call(HASH_DEFAULT_PROC.bind_call(hash), child)
        return "default" if EQUAL.bind_call(HASH_DEFAULT.bind_call(hash), child)

        nil
      end

      # A Hash key as a path shows it without `values`: Symbols, nil, true, false, named modules
      # and Integers within SHOWN_INTEGER as they are (the program's own identifiers); anything
      # else by its class, with the size of a String (bytes), an Array or a Hash (elements), in
      # parentheses: `(String, 12 bytes)`, `(Array of 4)`, `(Time)`.
      def key_text(key)
        case key
        when Symbol, NilClass, TrueClass, FalseClass then Validate.show(key)
        when Integer then key.between?(-SHOWN_INTEGER, SHOWN_INTEGER) ? Validate.show(key) : "(Integer)"
        when Module then module_name(key) || "(#{class_name(key)})"
        when String then "(#{class_name(key)}, #{STRING_BYTESIZE.bind_call(key)} bytes)"
        when Array then "(#{class_name(key)} of #{Validate::ARRAY_SIZE.bind_call(key)})"
        when Hash then "(#{class_name(key)} of #{Validate::HASH_SIZE.bind_call(key)})"
        else "(#{class_name(key)})"
        end
      rescue *FAILURES
        "(#{class_name(key)})"
      end

      def array_edge(array, child)
        at = ARRAY_INDEX.bind_call(array) { |e| EQUAL.bind_call(e, child) }
        at && "[#{at}]"
      end

      def struct_edge(struct, child)
        STRUCT_MEMBERS.bind_call(struct).each do |member|
          return ".#{member}" if EQUAL.bind_call(STRUCT_AREF.bind_call(struct, member), child)
        end
        nil
      end

      def proc_binding(proc)
        PROC_BINDING.bind_call(proc)
      rescue ArgumentError # a C-level proc (Symbol#to_proc, Method#to_proc) has no binding
        nil
      end

      def binding_edge(binding, child)
        return nil unless binding

        BINDING_LOCALS.bind_call(binding).each do |local|
          return "local `#{local}`" if EQUAL.bind_call(BINDING_LOCAL_GET.bind_call(binding, local), child)
        end
        "self" if EQUAL.bind_call(BINDING_RECEIVER.bind_call(binding), child)
      end

      def range_edge(range, child)
        return "begin" if EQUAL.bind_call(Validate::RANGE_BEGIN.bind_call(range), child)

        "end" if EQUAL.bind_call(Validate::RANGE_END.bind_call(range), child)
      end

      def ivar_edge(object, child)
        KERNEL[:ivars].bind_call(object).each do |ivar|
          return ivar.to_s if EQUAL.bind_call(KERNEL[:ivar_get].bind_call(object, ivar), child)
        end
        nil
      rescue *FAILURES
        nil
      end

      def singleton_edge(object, child)
        return nil unless Class === child

        "singleton class" if EQUAL.bind_call(KERNEL[:singleton_class].bind_call(object), child)
      rescue *FAILURES, TypeError
        nil
      end

      def class_name(object)
        Validate.class_name(object)
      rescue *FAILURES
        "?"
      end
    end
  end
end
