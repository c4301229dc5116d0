# frozen_string_literal: true

module DatadogHeap
  class CLI
    # `datadog-heap report FILE...`: the top sites of a profile (or of several, summed) as a text
    # table, or with --html as one self-contained page (DatadogHeap::ReportHtml). The report
    # itself is Report::Text's, which the endpoint's ?report=1 and ?html=1 use too.
    module ReportCommand
      private

      def report_parser(options)
        OptionParser.new do |p|
          p.banner = "Usage: datadog-heap report FILE... [--top N] [--by size|count] [--group KIND] [--app-root DIR] " \
            "[--wide] [--html [--out PATH]]"
          p.separator ""
          p.separator "The allocation sites holding the most live memory in the profile FILE, or in the sum of"
          p.separator "several (one per forked worker, say): live bytes, live objects, share of the total, class,"
          p.separator "median age (GCs survived), the site and where the application called it from."
          p.separator ""
          p.separator "A site is the file:line of the innermost Ruby frame, the method it is in and the method"
          p.separator "called there that allocated (`via String#*`). When the site is not application code,"
          p.separator "`called from` is the nearest frame that is: a file under --app-root, not in an installed gem."
          p.separator "Files are shortened (`rack-3.0.8 rack/utils.rb`, `stdlib json/common.rb`, paths under the"
          p.separator "app root relative to it) and, on a terminal, rows cut with … to fit it (nothing is cut when"
          p.separator "stdout is not a terminal); --wide shows full paths, uncut."
          p.separator ""
          p.separator "With --html, one self-contained HTML page instead (nothing fetched): a flame graph of live"
          p.separator "bytes by stack (click a frame to zoom into it, search frames), the top sites and classes, the"
          p.separator "facts and notes. Given several FILEs it shows the latest one, with the trend charts of all below."
          p.separator ""
          p.separator "Options:"
          top_option(p, options)
          by_option(p, options)
          grouping_options(p, options)
          display_options(p, options)
          p.on("--why", "also print each site's retainer paths, grouped by shape (see `datadog-heap why`)") { options[:why] = true }
          p.on("--values", "with --why: Hash keys in paths as the profile holds them (the program's data)") do
            options[:values] = true
          end
          p.on("--html", "write an HTML page (to stdout, or to --out PATH) instead of the text report") do
            options[:html] = true
          end
          p.on("--out PATH", "with --html: where the page goes (default: stdout)") do |path|
            raise UsageError, "--out must not be empty" if path.empty?

            options[:out] = path
          end
          common_options(p, options)
        end
      end

      def report_command(argv)
        options = {top: DEFAULT_TOP, by: :size}
        return EXIT_OK if parse(report_parser(options), argv, options)
        raise UsageError, "report needs at least one profile FILE, got 0 arguments" if argv.empty?
        raise UsageError, "--out PATH writes the HTML page: it needs --html" if options[:out] && !options[:html]
        raise UsageError, "--why is for the text report: the HTML page shows what keeps each site alive by itself" if options[:why] && options[:html]
        raise UsageError, "--values shows the keys in --why's paths: it needs --why" if options[:values] && !options[:why]

        return html_report(argv, options) if options[:html]

        report(load_profiles(argv), options)
        EXIT_OK
      end

      # `report --html`: the page of the only profile, or of the latest of several with their
      # trend below (the trend is left out, saying why, when they cannot make one: two with the
      # same time, say).
      def html_report(argv, options)
        profiles = argv.map { |path| load_profile(path) }
        latest = profiles.each_with_index.max_by { |profile, i| [profile.end_time || -Float::INFINITY, i] }.first
        series = nil
        if profiles.size > 1
          series = begin
            {profiles: profiles, trends: Profile.trend(profiles, **grouping(options))}
          rescue DatadogHeap::Error => e
            {profiles: profiles, error: e.message}
          end
        end
        page = report_page(latest, options, series)
        if options[:out]
          path = Validate.path!(:out, options[:out])
          writing(path) { File.write(path, page) }
          @out.puts("wrote #{path}")
        else
          @out.write(page)
        end
        EXIT_OK
      end
    end
  end
end
