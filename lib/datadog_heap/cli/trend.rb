# frozen_string_literal: true

require_relative "../trend"

module DatadogHeap
  class CLI
    # `datadog-heap trend FILES...`: per site, the slope of live bytes over a series of profiles,
    # how sure, and a verdict (growing sites first). See DatadogHeap::Trend.
    module TrendCommand
      private

      def trend_parser(options)
        OptionParser.new do |p|
          p.banner = "Usage: datadog-heap trend FILE FILE... [--top N] [--all] [--html OUT.html] [--group KIND] [--app-root DIR] [--wide]"
          p.separator ""
          p.separator "Is it a leak? Fits each site's live bytes over the times of the profiles FILE... (two or"
          p.separator "more, e.g. the heap-<pid>-<n>.pb.gz that datadog_heap/auto writes every interval) and"
          p.separator "prints the slope (bytes per minute), the confidence that its sign is right (from the fit"
          p.separator "and the sampling error) and a verdict: growing, steady or shrinking. Growing sites first."
          p.separator "A site is growing when the confidence is at least #{(DatadogHeap::Trend::CONFIDENCE * 100).round(1)}% and the fitted growth over"
          p.separator "the series is at least #{(DatadogHeap::Trend::MIN_RELATIVE_GROWTH * 100).round}% of its mean: sampling noise alone reads steady."
          p.separator "It must also rest on at least #{DatadogHeap::Trend::MIN_SAMPLES} samples in some profile and rise across at least " \
            "#{DatadogHeap::Trend::MIN_STEPS} steps"
          p.separator "(so 3 profiles or more); empty profiles at the start are skipped."
          p.separator "Sites, --group, --app-root and --wide are as in `datadog-heap report`."
          p.separator ""
          p.separator "Options:"
          top_option(p, options)
          p.on("--all", "list steady sites too (default: growing and shrinking ones, or the top steady ones if none)") do
            options[:all] = true
          end
          p.on("--html OUT", "also write a page with a chart per top site (self-contained, no network)") do |path|
            raise UsageError, "--html must not be empty" if path.empty?

            options[:html] = path
          end
          grouping_options(p, options)
          display_options(p, options)
          common_options(p, options)
        end
      end

      def trend_command(argv)
        options = {top: DEFAULT_TOP}
        return EXIT_OK if parse(trend_parser(options), argv, options)
        raise UsageError, "trend needs at least 2 profiles, got #{argv.size}" if argv.size < 2

        profiles = argv.map { |path| load_profile(path) }
        trends = Profile.trend(profiles, **grouping(options))
        print_trend(profiles, trends, options)
        if options[:html]
          require_relative "../report/trend_html"
          path = writing(options[:html]) do
            TrendHtml.write(options[:html], profiles, trends, top: options[:top], paths: paths(options))
          end
          @out.puts
          @out.puts("wrote #{path}")
        end
        EXIT_OK
      end

      def print_trend(profiles, trends, options)
        times = profiles.map(&:end_time).compact.sort
        span = times.last - times.first
        noun = grouping(options)[:group].to_s
        unit = trends.first&.unit || :bytes
        growing = trends.count { |t| t.verdict == :growing }
        shrinking = trends.count { |t| t.verdict == :shrinking }
        @out.puts("#{profiles.size} profiles over #{duration(span)}: #{plural(trends.size, noun)}, " \
          "#{growing} growing, #{shrinking} shrinking, #{trends.size - growing - shrinking} steady")
        skipped = DatadogHeap::Trend.leading_empty(profiles.sort_by { |p| p.end_time.to_f })
        if skipped > 0
          @out.puts("(skipped the first #{plural(skipped, "profile")}: no live samples yet; the series starts at the next)")
        end
        @out.puts("(a profile has no sizes: slopes are in live objects per minute)") if unit == :objects
        return @out.puts("No live objects in these profiles.") if trends.empty?

        shown = options[:all] ? trends : trends.reject { |t| t.verdict == :steady }
        shown = trends if shown.empty?
        shown = shown.first(options[:top])
        @out.puts
        kind = grouping(options)[:group]
        paths = paths(options)
        notes = shown.any?(&:note)
        rows = shown.map do |t|
          slope = if t.slope.nil?
            "-"
          else
            unit == :bytes ? "#{signed_bytes(t.slope.round)}/min" : format("%+.1f/min", t.slope)
          end
          first = unit == :bytes ? human_bytes(t.bytes.first) : t.bytes.first.to_s
          last = unit == :bytes ? human_bytes(t.bytes.last) : t.bytes.last.to_s
          row = [t.verdict.to_s, slope, format("%.1f%%", t.confidence * 100), first, last,
            "#{t.samples.first} -> #{t.samples.last}"]
          row << (t.class_name || "?") if kind == :site
          row << paths.label(t, kind)
          row << (t.note || "") if notes
          row
        end
        headers = ["verdict", "slope", "confidence", "first", "last", "samples"]
        headers << "class" if kind == :site
        headers << noun
        headers << "note" if notes
        cut = [headers.size - (notes ? 2 : 1)]
        @out.puts(table(headers, rows, "lrrrrr#{"l" if kind == :site}ll", width: paths.width, cut: cut))
        why_none_growing(trends, noun) if growing.zero?
      end

      # Why no site reads growing, and how to get a verdict that can say so.
      def why_none_growing(trends, noun)
        rose = trends.select { |t| t.reason && t.slope.to_f > 0 }
        few = rose.count { |t| t.reason == :few_samples }
        shape = rose.size - few
        why = []
        if few > 0
          why << "#{plural(few, noun)} rose but #{few == 1 ? "rests" : "rest"} on fewer than " \
            "#{DatadogHeap::Trend::MIN_SAMPLES} samples, too few to tell growth from one heavy sample appearing"
        end
        if shape > 0
          why << "#{plural(shape, noun)} rose in a single step, or ended no higher than #{shape == 1 ? "it" : "they"} started"
        end
        why << "no #{noun}'s live #{trends.first&.unit || :bytes} rose beyond sampling noise" if why.empty?
        @out.puts
        @out.puts("No #{noun} is growing: #{why.join("; ")}.")
        @out.puts("To tell a leak from noise: take more profiles (a leak keeps rising across several), lower sample_every " \
          "for more samples per #{noun} (datadog-heap run --sample-every N), or use the leak-hunt preset " \
          "(datadog-heap run --preset leak_hunt; preset: :leak_hunt).")
      end

      def duration(seconds)
        return format("%.1f s", seconds) if seconds < 120
        return format("%.1f min", seconds / 60) if seconds < 7200

        format("%.1f h", seconds / 3600)
      end
    end
  end
end
