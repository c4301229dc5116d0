# frozen_string_literal: true

module DatadogHeap
  # Checks of the Ruby the gem runs on that no header can make at build time (see
  # docs/compatibility.md): which GC it runs, and which Ractor loads the extension.
  module Compat
    # Environment variable that lets a recorder start under a GC other than Ruby's default one
    # anyway (its value must name that GC, e.g. DATADOG_HEAP_ALLOW_GC=mmtk): for trying it out.
    ALLOW_GC_VAR = "DATADOG_HEAP_ALLOW_GC"

    class << self
      # The GC implementation this Ruby runs: "default", or the modular GC's name (Ruby 3.4+
      # built with --with-modular-gc and started with RUBY_GC_LIBRARY=mmtk answers "mmtk").
      # Rubies before 3.4 have no GC.config and only the default GC.
      def gc_implementation(config = (GC.config if GC.respond_to?(:config)))
        name = config[:implementation] if config.is_a?(Hash)
        name.nil? || name.to_s.empty? ? "default" : name.to_s
      end

      # Why a recorder must not start under `gc` (nil when it may). The recorder learns that a
      # sampled object died from its ObjectSpace::WeakMap entry going away; the MMTk GC may keep
      # a WeakMap's values strongly, so nothing tracked would ever die, and every profile would
      # list every sampled object as live forever.
      def gc_refusal(gc = gc_implementation, env = ENV)
        return nil if gc == "default"
        return nil if env[ALLOW_GC_VAR] == gc

        "datadog_heap: this Ruby runs the #{gc.inspect} GC (RUBY_GC_LIBRARY), not Ruby's default one. " \
          "The recorder tracks sampled objects with ObjectSpace::WeakMap, which that GC may keep as a " \
          "strong map: no tracked object would ever die, and profiles would list them all as live. " \
          "Recording is refused; run with Ruby's default GC (unset RUBY_GC_LIBRARY), or set " \
          "#{ALLOW_GC_VAR}=#{gc} to record anyway and check the results"
      end

      # Raises DatadogHeap::Error when recording must not start under this Ruby's GC; warns
      # once when it is allowed through ALLOW_GC_VAR.
      def check_gc!
        gc = gc_implementation
        return if gc == "default"

        refusal = gc_refusal(gc)
        raise DatadogHeap::Error, refusal if refusal
        return if @warned_gc

        @warned_gc = true
        warn "datadog_heap: recording under the #{gc.inspect} GC (#{ALLOW_GC_VAR}=#{gc}): untested; " \
          "check that objects you drop leave the profile"
      end

      # Raises LoadError unless the caller is the main Ractor. The extension registers process-
      # lifetime VALUEs with the GC when it loads (its GC root, its error class), and from Ruby
      # 4.1 such a registration belongs to the Ractor that made it (Feature #22277): only the
      # main Ractor lives as long as the process.
      def check_main_ractor!(ractor = (Ractor if defined?(Ractor)))
        return unless ractor.respond_to?(:main) && ractor.respond_to?(:current)
        return if ractor.current == ractor.main

        raise LoadError, "datadog_heap must be loaded from the main Ractor (it was required from " \
          "#{ractor.current.inspect}): require it at boot, before any Ractor starts"
      end
    end
  end
end
