# frozen_string_literal: true

require_relative "safe_text"
require_relative "paths"
require_relative "bytes"

module DatadogHeap
  module Report
    # Rows shown at most, unless asked for more (`--top`, the endpoint's ?top=).
    DEFAULT_TOP = 10

    # Text tables and the numbers in them, for what writes a report (Writer, the CLI's commands):
    # they write to `@out`, a SafeText::Output.
    module Format
      include Bytes

      private

      # Columns padded to their widest cell; `aligns` has one "l" or "r" per column. The last column
      # is not padded, and no line ends in spaces. Cells are shown escaped (SafeText.escape): one
      # line per row. With a `width` (nil: none), the columns listed in `cut` are narrowed, the
      # widest first and never below Paths::MIN_CUT_WIDTH or their header, until the lines fit, and
      # their cells shortened with "…" (Paths.cut).
      def table(headers, rows, aligns, width: nil, cut: [])
        all = [headers, *rows].map { |row| row.map { |cell| SafeText.escape(cell) } }
        widths = headers.each_index.map { |i| all.map { |r| r[i].size }.max }
        if width
          floors = cut.to_h { |i| [i, [Paths::MIN_CUT_WIDTH, headers[i].size].max] }
          excess = widths.sum + 2 * (widths.size - 1) - width
          while excess > 0
            i = cut.select { |j| widths[j] > floors[j] }.max_by { |j| widths[j] }
            break unless i

            widths[i] -= 1
            excess -= 1
          end
          all = all.each_with_index.map do |row, r|
            r.zero? ? row : row.each_with_index.map { |cell, i| floors.key?(i) ? Paths.cut(cell, widths[i]) : cell }
          end
        end
        all.map do |row|
          row.each_with_index.map do |cell, i|
            next cell if i == row.size - 1

            aligns[i] == "r" ? cell.rjust(widths[i]) : cell.ljust(widths[i])
          end.join("  ").rstrip
        end.join("\n")
      end

      def signed(n)
        n.negative? ? n.to_s : "+#{n}"
      end

      def percent(share)
        format("%.1f%%", 100.0 * share)
      end

      def relative(ratio)
        ratio.nil? ? "new" : format("%+.1f%%", 100.0 * ratio)
      end

      def plural_noun(noun)
        noun == "class" ? "classes" : "#{noun}s"
      end

      def plural(count, noun)
        "#{count} #{count == 1 ? noun : plural_noun(noun)}"
      end

      # "PATH" for one profile; "N profiles summed (A, B, ...)" for several.
      def profile_name(profile)
        return SafeText.escape(profile.path || "(profile)") if profile.count == 1

        names = profile.paths.map { |name| SafeText.escape(name) }
        shown = names.size > 3 ? names.first(2) + ["... #{names.size - 2} more"] : names
        "#{profile.count} profiles summed (#{shown.join(", ")})"
      end

      def profile_summary(profile, site_count, noun = "site")
        bytes = profile.sizes? ? "#{human_bytes(profile.total_bytes)} in " : ""
        unit = profile.period_type && SafeText.escape(profile.period_type[0])
        period = unit && profile.period > 1 ? ", sampled 1 in #{profile.period} #{unit}" : ""
        "#{profile_name(profile)}: #{bytes}#{profile.total_objects} live objects at #{plural(site_count, noun)}#{period}"
      end

      # {group:, app_root:} of `options`, as Profile#top takes them (defaults: :site, the current
      # directory).
      def grouping(options)
        {group: options.fetch(:group, :site), app_root: options.fetch(:app_root) { Dir.pwd }}
      end

      # How files are shown and how wide tables may be, for `options` (:app_root, :wide) and the
      # terminal this writes to (Paths.terminal_width).
      def paths(options)
        Paths.new(app_root: grouping(options)[:app_root], wide: options[:wide] == true, width: Paths.terminal_width(@out.io))
      end

      # "±1.2 MiB" (the block formats the standard deviation), or "n/a" when it is unknown.
      def spread(stddev)
        stddev.nil? ? "n/a" : "±#{yield stddev}"
      end

      # Measurements first: a row resting on fewer than 5 samples (rough, marked ~) can be off by
      # as much as itself, and one heavy object sampled once (a Class, a Thread's stack) outweighs
      # a leak of thousands of small ones. Rough rows follow, in the same order.
      def measured_first(sites)
        rough, measured = sites.partition(&:rough?)
        measured + rough
      end

      # "67%", "1.3%": whole percents from 10%, one decimal below.
      def share(part, whole)
        return "n/a" if whole.to_i <= 0

        ratio = 100.0 * part / whole
        ratio < 10 ? format("%.1f%%", ratio) : "#{ratio.round}%"
      end
    end
  end
end
