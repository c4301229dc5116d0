# frozen_string_literal: true

module DatadogHeap
  class CLI
    # `datadog-heap diff OLD NEW`: the sites whose live size grew between two profiles (or two
    # sums of profiles), the largest growth first; with --html one self-contained page
    # (DatadogHeap::DiffHtml), a diff flame graph and the sites that grew and shrank most.
    module DiffCommand
      private

      def diff_parser(options)
        OptionParser.new do |p|
          p.banner = "Usage: datadog-heap diff OLD NEW [--top N] [--group KIND] [--app-root DIR] [--wide]\n" \
            "       datadog-heap diff OLD... -- NEW... [options]"
          p.separator ""
          p.separator "The allocation sites whose live size grew from the profile OLD to the profile NEW, the"
          p.separator "largest growth first, with the absolute and relative change: what to look at when memory"
          p.separator "keeps growing. Only growing sites are listed. Profiles without sizes are compared by live"
          p.separator "objects. With --, the profiles before it are summed into OLD and the ones after it into"
          p.separator "NEW (one per forked worker, say: diff tmp/heap-*-1.pb.gz -- tmp/heap-*-9.pb.gz)."
          p.separator "Sites, --group, --app-root and --wide are as in `datadog-heap report`. With --html, a page"
          p.separator "with a diff flame graph (growth red, shrinkage blue) and the sites that grew and shrank most."
          p.separator ""
          p.separator "Options:"
          top_option(p, options)
          grouping_options(p, options)
          display_options(p, options)
          diff_html_options(p, options)
          common_options(p, options)
        end
      end

      def diff_command(argv)
        options = {top: DEFAULT_TOP}
        split = argv.index("--")
        parser = diff_parser(options)
        if split
          old_paths = argv[0...split]
          new_paths = argv[(split + 1)..]
          return EXIT_OK if parse(parser, old_paths, options) || parse(parser, new_paths, options)
          raise UsageError, "diff needs at least one OLD profile before --" if old_paths.empty?
          raise UsageError, "diff needs at least one NEW profile after --" if new_paths.empty?
        else
          return EXIT_OK if parse(parser, argv, options)
          unless argv.size == 2
            raise UsageError, "diff needs two profiles, OLD and NEW, got #{plural(argv.size, "argument")} " \
              "(to sum several on each side: diff OLD... -- NEW...)"
          end

          old_paths, new_paths = [argv[0]], [argv[1]]
        end
        diff_or_page(load_profiles(old_paths), load_profiles(new_paths), options)
        EXIT_OK
      end

      def diff(old, new, options)
        top = options.fetch(:top, DEFAULT_TOP)
        group = grouping(options)
        kind = group[:group]
        noun = kind.to_s
        sizes = old.sizes? && new.sizes?
        diffs = old.diff(new, **group)
        measure = sizes ? :bytes_change : :objects_change
        growing = diffs.select { |d| d.public_send(measure) > 0 }
        growing = growing.sort_by.with_index { |d, i| [-d.objects_change, i] } unless sizes
        totals = if sizes
          "live bytes #{human_bytes(old.total_bytes)} -> #{human_bytes(new.total_bytes)} " \
            "(#{signed_bytes(new.total_bytes - old.total_bytes)})"
        else
          "live objects #{old.total_objects} -> #{new.total_objects} (#{signed(new.total_objects - old.total_objects)})"
        end
        @out.puts("#{profile_name(old)} -> #{profile_name(new)}: #{totals}")
        @out.puts("(a profile has no sizes: #{plural_noun(noun)} are compared by live objects)") unless sizes
        if growing.empty?
          @out.puts("No #{noun} grew: live #{sizes ? "size" : "objects"} did not increase at any of the #{plural(diffs.size, noun)}.")
          return
        end
        shown = growing.first(top)
        largest = shown.size < growing.size ? "; the #{shown.size} largest growth#{"s" unless shown.size == 1}" : ""
        known = growing.reject { |d| d.significant.nil? }
        beyond = known.empty? ? "" : ", #{known.count(&:significant)} beyond #{growing.size == 1 ? "its" : "their"} noise " \
          "(|growth| > #{Profile::SIGNIFICANT_SDS.to_i} sd)"
        @out.puts("#{growing.size} of #{plural(diffs.size, noun)} grew#{beyond}#{largest}:")
        @out.puts
        callers = kind == :site && shown.any?(&:called_from)
        paths = paths(options)
        rows = shown.map do |d|
          row = if sizes
            [signed_bytes(d.bytes_change), spread(d.bytes_change_stddev) { |sd| human_bytes(sd.round) },
              relative(d.bytes_relative), human_bytes(d.old_bytes), human_bytes(d.new_bytes), signed(d.objects_change)]
          else
            [signed(d.objects_change), spread(d.objects_change_stddev) { |sd| sd.round.to_s },
              relative(d.objects_relative), d.old_objects.to_s, d.new_objects.to_s]
          end
          row += [samples_change(d), significance(d.significant)]
          row << (d.class_name || "?") if kind == :site
          row << paths.label(d, kind)
          row << (paths.called_from(d) || "") if callers
          row
        end
        headers = sizes ? ["growth", "±", "relative", "old bytes", "new bytes", "objects +/-"] : ["growth", "±", "relative", "old objects", "new objects"]
        headers += ["samples", "significant"]
        headers << "class" if kind == :site
        headers << noun
        headers << "called from" if callers
        cut = callers ? [headers.size - 2, headers.size - 1] : [headers.size - 1]
        @out.puts(table(headers, rows, "#{"r" * (sizes ? 7 : 6)}l#{"l" if kind == :site}ll", width: paths.width, cut: cut))
        @out.puts
        if known.empty?
          @out.puts("(a profile does not say how many samples its rows rest on: ± and significance are n/a)")
        else
          @out.puts("± is one standard deviation of the change's sampling error; significant: the growth exceeds " \
            "#{Profile::SIGNIFICANT_SDS.to_i} of them. ~ marks a side resting on fewer than #{Profile::ROUGH_SAMPLES} samples.")
        end
      end

      # "old -> new" sample counts, "~" before a side with fewer than ROUGH_SAMPLES; "n/a" if unknown.
      def samples_change(diff)
        sampled = diff.bytes_change_stddev.to_f > 0 || diff.objects_change_stddev.to_f > 0
        side = ->(n) { n.nil? ? "n/a" : "#{"~" if sampled && n < Profile::ROUGH_SAMPLES && n > 0}#{n}" }
        "#{side.call(diff.old_samples)} -> #{side.call(diff.new_samples)}"
      end

      def significance(flag)
        flag.nil? ? "n/a" : (flag ? "yes" : "no")
      end

      # The diff parser's --html, --out and --by.
      def diff_html_options(parser, options)
        parser.on("--html", "write an HTML page with a diff flame graph (to stdout, or to --out PATH) instead") do
          options[:html] = true
        end
        parser.on("--out PATH", "with --html: where the page goes (default: stdout)") do |path|
          raise UsageError, "--out must not be empty" if path.empty?

          options[:out] = path
        end
      end

      # Writes the page, or the text diff when --html was not given.
      def diff_or_page(old, new, options)
        raise UsageError, "--out PATH writes the HTML page: it needs --html" if options[:out] && !options[:html]
        return diff(old, new, options) unless options[:html]

        require_relative "../report/diff_html"
        by = old.sizes? && new.sizes? ? options.fetch(:by, :size) : :count
        page = DiffHtml.page(old, new, paths: paths(options), by: by, group: grouping(options),
          top: options.fetch(:top, DEFAULT_TOP))
        if options[:out]
          path = Validate.path!(:out, options[:out])
          File.write(path, page)
          @out.puts("wrote #{path}")
        else
          @out.write(page)
        end
      end
    end
  end
end
