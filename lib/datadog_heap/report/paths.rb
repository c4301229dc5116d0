# frozen_string_literal: true

require "io/console"

module DatadogHeap
  module Report
    # How the lines of `report`, `diff`, `trend`, `why` and the HTML pages show files: shortened
    # (Profile.short_path: `rack-3.0.8 rack/utils.rb`, `stdlib json/common.rb`, paths under the
    # app root relative to it) or, with --wide, as the profile holds them; and how wide a table
    # may be before its site columns are cut with "…".
    #
    # Only what is shown changes: grouping, sorting and the Profile API (Site#location, #label,
    # #library...) keep the full paths.
    class Paths
      ELLIPSIS = "…"
      # The width of a table on a terminal that does not say its own: wide enough for most sites
      # of a real program, narrow enough to read.
      DEFAULT_WIDTH = 160
      # A site column is never cut below this many characters.
      MIN_CUT_WIDTH = 24

      # The width tables fit in: the columns of the terminal `io` is (its winsize, else
      # IO.console's), DEFAULT_WIDTH when the terminal does not say; nil (rows uncut) when `io`
      # is no terminal (a pipe, a file, the endpoint's ?report=1): what reads it there may want
      # every character, and cutting a row in the middle of its site loses the part that matters.
      def self.terminal_width(io)
        return nil unless io.respond_to?(:tty?) && io.tty?

        columns = (io.respond_to?(:winsize) ? io.winsize : IO.console&.winsize)&.last
        columns.is_a?(Integer) && columns > 0 ? columns : DEFAULT_WIDTH
      rescue SystemCallError, IOError
        DEFAULT_WIDTH
      end

      # `text` in at most `width` characters, "…" marking what was cut. A site or caller reads
      # "file:line in method...": when its file:line fits, the end is cut (file:line and the
      # start of the method stay); otherwise the middle (the start of the path and the end of
      # the method stay).
      def self.cut(text, width)
        return text if text.size <= width
        return text[0, width] if width < 3

        location = text.index(" in ")
        return "#{text[0, width - 1]}#{ELLIPSIS}" if location && location < width - 1

        head = width / 2
        tail = width - 1 - head
        "#{text[0, head]}#{ELLIPSIS}#{tail.zero? ? "" : text[-tail..]}"
      end

      # Tables are as wide as they need to be (nil) with wide; otherwise `width`.
      attr_reader :width

      # `app_root`: as Profile#top takes it. `wide`: full paths, tables not cut.
      def initialize(app_root:, wide: false, width: DEFAULT_WIDTH)
        @app_root = app_root
        @wide = wide
        @width = wide ? nil : width
        @short = {}
        @library = {}
      end

      def wide?
        @wide
      end

      # The file `file` as shown: Profile.short_path's form, or `file` itself with wide.
      def path(file)
        return file if @wide

        @short[file] ||= Profile.short_path(file, app_root: @app_root)
      end

      # The library of `file` (Profile.library_of), whatever `wide` says.
      def library(file)
        @library[file] ||= Profile.library_of(file, app_root: @app_root)
      end

      # A row's label (a Site, SiteDiff or SiteTrend of `group`) as shown: the site's file
      # shortened where the label starts with it (site, location and file groups).
      def label(row, group)
        label = row.label.to_s
        return label if @wide || !%i[site location file].include?(group)

        file = location_file(row)
        label = "#{path(file)}#{label[file.size..]}" if file && label.start_with?(file)
        # A C extension's init frame, the callee of a `require`, is named by its file.
        callee = row.callee if group == :site
        if callee&.start_with?("/") && label.end_with?(" via #{callee}")
          label = "#{label.delete_suffix(callee)}#{path(callee)}"
        end
        label
      end

      # A row's `called_from` ("file:line in method", or nil) with its file shortened.
      def called_from(row)
        text = row.called_from
        return text if text.nil? || @wide

        frame = row.locations&.find do |_, file, line|
          !file.empty? && text.start_with?(line > 0 ? "#{file}:#{line} in " : "#{file} in ")
        end
        frame ? "#{path(frame[1])}#{text[frame[1].size..]}" : text
      end

      # A frame as the flame graph labels it: "method (file:line)", the file shortened.
      def frame(name, file, line)
        return name.to_s if file.to_s.empty?

        where = line.to_i > 0 ? "#{path(file)}:#{line}" : path(file)
        name.to_s.empty? || name == file ? where : "#{name} (#{where})"
      end

      private

      # The file of `row.location` ("file:line", or the file alone): the file of the frame of its
      # stack that location names, or nil.
      def location_file(row)
        location = row.location
        frame = row.locations&.find do |_, file, line|
          !file.empty? && location == (line > 0 ? "#{file}:#{line}" : file)
        end
        frame && frame[1]
      end
    end
  end
end
