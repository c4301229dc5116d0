# frozen_string_literal: true

module DatadogHeap
  class CLI
    # `datadog-heap why FILE`: what keeps the top sites' objects alive, their retainer paths
    # grouped by shape (Report::RetainerShapes, which `report --why` and the report's page use
    # too). Hash keys are shown by class and size unless --values.
    module Why
      include Report::RetainerShapes

      NO_PATHS = "has no retainer paths (`retained by` labels): write it with " \
        "Recorder#profile(retainers: true), or run the program with `datadog-heap run --preset leak_hunt` " \
        "(or --retainers), or set DATADOG_HEAP_PRESET=leak_hunt (or DATADOG_HEAP_RETAINERS=1) for datadog_heap/auto"

      private

      def why_parser(options)
        OptionParser.new do |p|
          p.banner = "Usage: datadog-heap why FILE... [--top N] [--by size|count] [--app-root DIR] [--values] [--wide]"
          p.separator ""
          p.separator "What keeps the top allocation sites' objects alive: for the sampled objects a retainer"
          p.separator "search named a path for (Recorder#retainers), the chain of references from a GC root,"
          p.separator "grouped by shape (Hash keys and Array indexes as *), as"
          p.separator "`constant Foo::CACHE (Hash) -> [*] (String)`, with how many of the site's sampled objects"
          p.separator "each shape holds and the live objects and bytes they stand for, and one example path."
          p.separator "Hash keys are shown by class and size (`key (String, 12 bytes)`) unless --values."
          p.separator "Sites are ranked as in `datadog-heap report`. Exits 1 when no sample has a path."
          p.separator ""
          p.separator "Options:"
          top_option(p, options)
          by_option(p, options)
          p.on("--app-root DIR", "the application's code (default: the current directory); repeatable") do |dir|
            raise UsageError, "--app-root must not be empty" if dir.empty?

            (options[:app_root] ||= []) << File.expand_path(dir)
          end
          p.on("--values", "show Hash keys in paths as the profile holds them (they are the program's data)") do
            options[:values] = true
          end
          display_options(p, options)
          common_options(p, options)
        end
      end

      def why_command(argv)
        options = {top: DEFAULT_TOP, by: :size}
        return EXIT_OK if parse(why_parser(options), argv, options)
        raise UsageError, "why needs at least one profile FILE, got 0 arguments" if argv.empty?

        profile = load_profiles(argv)
        unless profile.retained_by?
          @err.puts("datadog-heap: #{profile_name(profile)} #{NO_PATHS}")
          return EXIT_ERROR
        end
        app_root = grouping(options)[:app_root]
        # The report's order: measured sites first, rough ones (under 5 samples) after them, so
        # one large object sampled once does not come before a leak of thousands.
        sites = measured_first(profile.top(2**62 - 1, by: options[:by], app_root: app_root))
        rows = holders(profile, sites.first(options[:top]), options)
        @out.puts(profile_summary(profile, sites.size))
        @out.puts
        whose = (rows.size == 1) ? "top site's" : "top #{rows.size} sites'"
        @out.puts("What keeps the #{whose} sampled objects alive (paths grouped by shape: " \
          "Hash keys and Array indexes as *):")
        shown = paths(options)
        rows.each_with_index do |held, i|
          site = held.site
          @out.puts
          @out.puts("#{i + 1}. #{profile.sizes? ? "#{human_bytes(site.live_bytes)}, " : ""}#{site.live_objects} objects " \
            "(#{percent(site.share)})  #{SafeText.escape(site.class_name || "?")}  #{SafeText.escape(shown.label(site, :site))}")
          why_lines(profile, held, options).each { |line| @out.puts("   #{line}") }
        end
        @out.puts
        keys = options[:values] ? "Hash keys as the profile holds them (--values)" : "Hash keys by class and size (--values shows them)"
        @out.puts("(#{SEARCHED.sub(/\A./, &:upcase)}; #{keys}.)")
        EXIT_OK
      end

    end
  end
end
