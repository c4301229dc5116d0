# frozen_string_literal: true

require_relative "text"

module DatadogHeap
  module Report
    # The two ways to write a profile's report to `@out` (a SafeText::Output): the text table and
    # the HTML page. Writer and the CLI both include it, over Text.
    module Writing
      # Writes the text report of `profile` (a Profile); the options are the report command's
      # (by: :size or :count, group: a Profile::GROUPS member, wide: full paths, uncut). Tables
      # fit Paths.terminal_width of `out`.
      def write_report(profile, top: DEFAULT_TOP, by: :size, group: :site, app_root: Dir.pwd, wide: false)
        report(profile, {top: top, by: by, group: group, app_root: app_root, wide: wide})
        nil
      end

      # Writes the page `datadog-heap report --html` writes for `profile`; the options as for
      # #write_report.
      def write_html_report(profile, top: DEFAULT_TOP, by: :size, group: :site, app_root: Dir.pwd, wide: false)
        @out.write(report_page(profile, {top: top, by: by, group: group, app_root: app_root, wide: wide}))
        nil
      end
    end

    # Writes the report of a profile to an IO: what `datadog-heap report` prints, or its --html
    # page. The endpoint's ?report=1 and ?html=1 answer with it; the CLI's commands include the
    # same modules (Text, Writing, RetainerShapes, Format). Everything goes through
    # SafeText::Output, so nothing written holds a control character from the profile.
    #
    #   Report::Writer.new($stdout).write_report(profile, top: 5)
    class Writer
      include Text
      include Writing

      def initialize(out)
        @out = SafeText::Output.new(out)
      end
    end
  end
end
