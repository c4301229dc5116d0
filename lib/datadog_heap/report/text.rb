# frozen_string_literal: true

require_relative "format"
require_relative "retainer_shapes"

module DatadogHeap
  module Report
    # The report of a profile: the top sites as a text table with its notes (#report, what
    # `datadog-heap report` and the endpoint's ?report=1 print), or one self-contained page
    # (#report_page: ReportHtml, for `report --html` and ?html=1). Options as the report command
    # takes them: top:, by: (:size or :count), group: (a Profile::GROUPS member), app_root:,
    # wide:, why: and values: (retainer paths under each site, keys as they are).
    module Text
      include Format
      include RetainerShapes

      private

      # The page for `profile` (see ReportHtml.page); `series` as `report --html` makes it for
      # several profiles (CLI's html_report), or nil. The page's code loads on first use.
      def report_page(profile, options, series = nil)
        require_relative "report_html"
        group = grouping(options)
        by = profile.sizes? ? options.fetch(:by, :size) : :count
        paths = paths(options)
        top = options.fetch(:top, DEFAULT_TOP)
        sites = measured_first(profile.top(2**62 - 1, by: by, **group))
        classes = measured_first(profile.top(2**62 - 1, by: by, group: :class, app_root: group[:app_root]))
        held = group[:group] == :site && profile.retained_by? ? holders(profile, sites.first(top), options) : nil
        ReportHtml.page(profile, paths: paths, by: by, series: series, holders: held && holder_rows(profile, held, paths),
          sites: site_table(profile, sites.first(top), group[:group], paths).merge(count: sites.size, noun: group[:group].to_s),
          classes: site_table(profile, classes.first(top), :class, paths).merge(count: classes.size, noun: "class"))
      end

      def report(profile, options)
        group = grouping(options)
        by = options.fetch(:by, :size)
        sites = measured_first(profile.top(2**62 - 1, by: by, **group))
        by = :count unless profile.sizes?
        kind = group[:group]
        noun = kind.to_s
        paths = paths(options)
        @out.puts(profile_summary(profile, sites.size, noun))
        profile.comments.each { |comment| @out.puts("Note: #{SafeText.escape(comment)}") }
        if sites.empty?
          @out.puts("No live objects in #{profile.count > 1 ? "these profiles" : "this profile"}.")
          return
        end
        shown = sites.first(options.fetch(:top, DEFAULT_TOP))
        @out.puts("(#{profile.count > 1 ? "these profiles have" : "this profile has"} no sizes: " \
          "#{plural_noun(noun)} are ranked by live objects)") unless profile.sizes?
        @out.puts
        rough_last = sites.any?(&:rough?) ? ", rows on fewer than 5 samples (~) last" : ""
        @out.puts("Top #{shown.size} of #{plural(sites.size, noun)} by live #{by == :size ? "bytes" : "objects"}#{rough_last}:")
        @out.puts
        t = site_table(profile, shown, kind, paths)
        @out.puts(table(t[:headers], t[:rows], t[:aligns], width: paths.width, cut: t[:cut]))
        @out.puts
        uncertainty_notes(profile, shown)
        if options[:why]
          why_section(profile, kind == :site ? shown : profile.top(shown.size, by: by, app_root: group[:app_root]), options)
        elsif kind == :site && profile.retained_by?
          main_holders(profile, shown, options)
        end
      end

      # One line per top site with paths: the shape holding most of its objects (`why` for all).
      def main_holders(profile, shown, options)
        lines = holder_lines(profile, shown, options)
        return if lines.empty?

        @out.puts
        @out.puts("What keeps them alive (each site's main retainer path shape; `datadog-heap why` for all):")
        lines.each { |line| @out.puts("  #{line}") }
      end

      # What the HTML page shows of `held` (Why::Holders): per site with paths, its label and
      # class, a line on how many of its objects have one, and its shapes as
      # [counts, shape, example or nil]; the example's keys by class and size.
      def holder_rows(profile, held, paths)
        held.reject { |h| h.shapes.empty? }.map do |h|
          {site: paths.label(h.site, :site), class_name: h.site.class_name || "?", found: found_line(h),
           shapes: h.shapes.map do |s|
             example = shown_path(s.example, {})
             [shape_counts(profile, h, s), s.shape, example == s.shape ? nil : example]
           end}
        end
      end

      # The report's table of `shown` (Sites of `kind`): {headers:, rows:, aligns:, cut:, titles:,
      # rough:}, `cut` the columns a narrow terminal may shorten (the site and its caller),
      # `titles` per row the full text of the cells shown shortened (nil where none is), `rough`
      # per row Site#rough?. Cells are Strings, not yet escaped. The HTML page shows the same cells.
      def site_table(profile, shown, kind, paths)
        callers = kind == :site && shown.any?(&:called_from)
        titles = shown.map do |s|
          title = [s.label]
          title << s.called_from if callers
          title
        end
        rows = shown.map do |s|
          rough = s.rough? ? "~" : ""
          row = if profile.sizes?
            ["#{rough}#{human_bytes(s.live_bytes)}", spread(s.bytes_stddev) { |sd| human_bytes(sd.round) }, s.live_objects.to_s]
          else
            ["-", spread(s.objects_stddev) { |sd| sd.round.to_s }, "#{rough}#{s.live_objects}"]
          end
          row += [s.samples&.to_s || "n/a", percent(s.share)]
          row << (s.class_name || "?") if kind == :site
          row += [s.median_gen_age&.to_s || "-", paths.label(s, kind)]
          row << (paths.called_from(s) || "") if callers
          row
        end
        headers = ["live bytes", "±", "live objects", "samples", "share"]
        headers << "class" if kind == :site
        headers += ["median age", kind.to_s]
        headers << "called from" if callers
        cut = callers ? [headers.size - 2, headers.size - 1] : [headers.size - 1]
        titles = titles.map { |full| Array.new(headers.size - full.size) + full }
        {headers: headers, rows: rows, aligns: "rrrrr#{"l" if kind == :site}rll", cut: cut, titles: titles,
         rough: shown.map(&:rough?)}
      end

      # What ± and ~ mean, under a report's table.
      def uncertainty_notes(profile, shown)
        unless profile.uncertainty?
          @out.puts("(this profile does not say how many samples each row rests on: it was written by an older " \
            "datadog_heap or another profiler, so ± and samples are n/a)")
          return
        end
        @out.puts("samples: live objects recorded, each standing for its weight of allocations; " \
          "± is one standard deviation of the sampling error.")
        return unless shown.any?(&:rough?)

        @out.puts("~ rough: fewer than #{Profile::ROUGH_SAMPLES} samples: the estimate may be off by as much as itself.")
        advice = settle_advice(profile, shown)
        @out.puts(advice) if advice
      end

      # When the top rows rest on few samples, one line saying so and what would settle it: the
      # leak-hunt preset (with the samples it would record for the first rough row: its live
      # objects / the preset's sample_every), a longer run, `trend` over a series. Nil when the
      # rows that lead are measured.
      def settle_advice(profile, shown)
        rough = shown.select(&:rough?)
        lead = shown.first(3)
        return nil unless rough.size * 2 >= shown.size || lead.any?(&:rough?)

        dense = Recorder::PRESETS[:leak_hunt][:sample_every]
        first = rough.first
        where = if shown.size == 1
          "the top row rests"
        elsif rough.size == shown.size
          "all #{shown.size} top rows rest"
        else
          "#{rough.size} of the top #{shown.size} rows rest"
        end
        preset = if profile.period.to_i > dense
          expected = (first.live_objects / dense.to_f).round
          "the leak-hunt preset (`datadog-heap run --preset leak_hunt`, DATADOG_HEAP_PRESET=leak_hunt: 1 in #{dense}) " \
            "would record about #{expected} samples for #{rough.size == 1 ? "it" : "the first of them"} " \
            "(#{first.live_objects} live objects / #{dense}; " \
            "#{first.samples} now), "
        else
          ""
        end
        "Not conclusive: #{where} on fewer than #{Profile::ROUGH_SAMPLES} samples. To settle it: #{preset}" \
          "a longer run (a leak keeps adding samples), or `datadog-heap trend` over a series of profiles."
      end
    end
  end
end
