# frozen_string_literal: true

module DatadogHeap
  class CLI
    # `datadog-heap why FILE` and `report --why`: the `retained by` labels a profile written with
    # Recorder#profile(retainers: ...) carries, under each top site.
    module Why
      NO_PATHS = "has no retainer paths (`retained by` labels): write it with " \
        "Recorder#profile(retainers: true), or set DATADOG_HEAP_RETAINERS=1 for datadog_heap/auto"

      private

      def why_parser(options)
        OptionParser.new do |p|
          p.banner = "Usage: datadog-heap why FILE... [--top N] [--by size|count] [--app-root DIR] [--wide]"
          p.separator ""
          p.separator "What keeps the top allocation sites' objects alive: for the sampled objects a retainer"
          p.separator "search named a path for (Recorder#retainers), the chain of references from a GC root,"
          p.separator "as `constant Foo::CACHE (Hash) -> [:k] (String)`, with the live objects and bytes it"
          p.separator "holds. Sites are ranked as in `datadog-heap report`. Exits 1 when no sample has a path."
          p.separator ""
          p.separator "Options:"
          top_option(p, options)
          p.on("--by KEY", %w[size count], "rank by live bytes (size, the default) or live objects (count)") do |key|
            options[:by] = key.to_sym
          end
          p.on("--app-root DIR", "the application's code (default: the current directory); repeatable") do |dir|
            raise OptionParser::InvalidArgument, "--app-root must not be empty" if dir.empty?

            (options[:app_root] ||= []) << File.expand_path(dir)
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
        rows = profile.top_retained(options[:top], by: options[:by], app_root: grouping(options)[:app_root])
        @out.puts(profile_summary(profile, profile.top(2**62 - 1, by: options[:by], app_root: grouping(options)[:app_root]).size))
        @out.puts
        @out.puts("What keeps the top #{plural(rows.size, "site")}' sampled objects alive:")
        shown = paths(options)
        rows.each_with_index do |(site, paths), i|
          @out.puts
          @out.puts("#{i + 1}. #{profile.sizes? ? "#{human_bytes(site.live_bytes)}, " : ""}#{site.live_objects} objects " \
            "(#{percent(site.share)})  #{SafeText.escape(site.class_name || "?")}  #{SafeText.escape(shown.label(site, :site))}")
          why_lines(profile, paths).each { |line| @out.puts("   #{line}") }
        end
        EXIT_OK
      end

      # Under each row `report --why` printed, the paths of that site.
      def why_section(profile, options)
        @out.puts
        unless profile.retained_by?
          @out.puts("(--why: #{profile.count > 1 ? "these profiles have" : "this profile has"} no retainer paths)")
          return
        end
        rows = profile.top_retained(options.fetch(:top, DEFAULT_TOP), by: options.fetch(:by, :size),
          app_root: grouping(options)[:app_root])
        @out.puts("Retained by:")
        shown = paths(options)
        rows.each do |site, paths|
          @out.puts("  #{SafeText.escape(shown.label(site, :site))} (#{SafeText.escape(site.class_name || "?")})")
          why_lines(profile, paths).each { |line| @out.puts("    #{line}") }
        end
      end

      def why_lines(profile, paths)
        return ["(no sampled object of this site has a path)"] if paths.empty?

        paths.map do |path, objects, bytes|
          "#{profile.sizes? ? "#{human_bytes(bytes)}, " : ""}#{objects} objects: #{SafeText.escape(path)}"
        end
      end
    end
  end
end
