# frozen_string_literal: true

require_relative "html_text"

module DatadogHeap
  # An icicle graph of a profile's live heap by stack, as inline SVG (no script): the root, all
  # live bytes, at the top; under each frame the frames it called, as wide as the live bytes
  # (live objects with `by: :count` or a profile without sizes) their stacks hold, the heaviest
  # first. Each frame is "method (file:line)", the file as CLI::Paths shows it, and carries a
  # `<title>` tooltip: the frame in full, bytes, objects and share. Frames narrower than
  # MIN_WIDTH pixels are left out (their parent's width still counts them), as are frames past
  # MAX_RECTS.
  class FlameGraph
    include HtmlText

    WIDTH = 1200
    ROW = 18
    MIN_WIDTH = 0.8
    MAX_RECTS = 20_000
    # Pixels per character of the frame labels (11px monospace).
    CHAR_WIDTH = 6.7
    # Hue and saturation by kind of library; lightness varies by name so neighbours differ.
    HUES = {app: [28, 85], gem: [140, 40], ruby: [210, 60], other: [0, 0]}.freeze
    KIND_NAMES = {app: "application", gem: "gems", ruby: "Ruby's library", other: "internal, eval, other"}.freeze

    Node = Struct.new(:name, :file, :line, :bytes, :objects, :children)

    attr_reader :measure, :stacks

    # `profile`: a Profile; `paths`: a CLI::Paths (labels and library kinds); `by`: :size or :count.
    def initialize(profile, paths:, by: :size)
      @paths = paths
      @measure = profile.sizes? && by == :size ? :bytes : :objects
      @root = Node.new("all", "", 0, 0, 0, {})
      @stacks = 0
      @left_out = 0
      profile.samples.each { |sample| add(sample) }
    end

    # Live bytes (or objects) under the root.
    def total
      @root[@measure]
    end

    # The graph as one `<svg>` element (empty of frames when the profile holds nothing).
    def svg
      rects = []
      depth = 0
      scale = total > 0 ? WIDTH.to_f / total : 0.0
      pending = [[@root, 0.0, 0]]
      until pending.empty?
        node, x, level = pending.pop
        width = node[@measure] * scale
        if width < MIN_WIDTH || rects.size >= MAX_RECTS
          @left_out += 1
          next
        end
        rects << frame(node, x, level, width)
        depth = level if level > depth
        offset = x
        placed = node.children.values.sort_by { |c| [-c[@measure], label(c)] }.map do |c|
          at = offset
          offset += c[@measure] * scale
          [c, at]
        end
        # Last in, first out: the heaviest child is drawn first.
        placed.reverse_each { |c, at| pending << [c, at, level + 1] }
      end
      height = (depth + 1) * ROW
      %(<svg class="flame" xmlns="http://www.w3.org/2000/svg" width="#{WIDTH}" height="#{height}" ) +
        %(viewBox="0 0 #{WIDTH} #{height}" role="img" aria-label="live #{@measure} by stack, root at the top">) +
        rects.join("\n") + "</svg>"
    end

    # How many frames (each with the frames under it) were too narrow to draw, or past MAX_RECTS;
    # known once #svg ran.
    attr_reader :left_out

    # [[kind name, CSS colour], ...] for a legend.
    def self.legend
      HUES.map { |kind, (hue, sat)| [KIND_NAMES.fetch(kind), "hsl(#{hue},#{sat}%,68%)"] }
    end

    private

    def add(sample)
      bytes = sample.bytes.to_i
      objects = sample.objects.to_i
      # A crafted profile may hold negative values: they would make widths negative.
      return if bytes < 0 || objects < 0 || (@measure == :bytes ? bytes : objects).zero?

      @stacks += 1
      node = @root
      grow(node, bytes, objects)
      sample.locations.reverse_each do |name, file, line|
        node = (node.children[[name, file, line]] ||= Node.new(name, file, line, 0, 0, {}))
        grow(node, bytes, objects)
      end
    end

    def grow(node, bytes, objects)
      node.bytes += bytes
      node.objects += objects
    end

    def label(node)
      return "all: #{@measure == :bytes ? human(node.bytes) : "#{node.objects} objects"}" if node.equal?(@root)

      @paths.frame(node.name, node.file, node.line)
    end

    def frame(node, x, level, width)
      # Escaped for the terminal's sake first, so that the cut below counts what is shown.
      text = CLI::SafeText.escape(label(node))
      y = level * ROW
      share = total > 0 ? 100.0 * node[@measure] / total : 0.0
      tip = [text]
      tip << (node.line.to_i > 0 ? "#{node.file}:#{node.line}" : node.file) unless node.equal?(@root) || node.file.to_s.empty?
      tip << "#{human(node.bytes)}, #{node.objects} objects, #{format("%.1f%%", share)} of live #{@measure}"
      fits = ((width - 6) / CHAR_WIDTH).floor
      shown = if fits < 3
        nil
      else
        text.size > fits ? "#{text[0, fits - 1]}…" : text
      end
      parts = [%(<g class="f"><title>#{tip.map { |t| h(t) }.join("\n")}</title>),
        %(<rect x="#{f(x)}" y="#{y}" width="#{f(width)}" height="#{ROW - 1}" rx="2" fill="#{color(node)}"/>)]
      parts << %(<text x="#{f(x + 3)}" y="#{y + ROW - 5}">#{h(shown)}</text>) if shown
      parts << "</g>"
      parts.join
    end

    def color(node)
      return "hsl(0,0%,80%)" if node.equal?(@root)

      hue, sat = HUES.fetch(kind(node.file.to_s))
      light = 60 + (node.name.to_s.bytes.sum % 19)
      "hsl(#{hue},#{sat}%,#{light}%)"
    end

    # :app, :gem, :ruby (Ruby's library) or :other, from the file's library (Profile.library_of).
    def kind(file)
      return :other if file.empty?

      library = @paths.library(file)
      if library == "app" then :app
      elsif library.end_with?("(stdlib)", "(site_ruby)", "(vendor_ruby)") then :ruby
      elsif library.start_with?("(") || library == "ruby (internal)" then :other
      else :gem
      end
    end
  end
end
