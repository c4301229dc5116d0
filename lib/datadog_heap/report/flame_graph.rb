# frozen_string_literal: true

require "digest"
require "json"
require_relative "html_text"

module DatadogHeap
  # An icicle graph of a profile's live heap by stack: the root, all live bytes, at the top;
  # under each frame the frames it called, as wide as the live bytes (live objects with
  # `by: :count` or a profile without sizes) their stacks hold, the heaviest first. Each frame is
  # "method (file:line)", the file as Report::Paths shows it, and carries a `<title>` tooltip: the
  # frame in full, bytes, objects and share.
  #
  # The page gets the graph twice. #svg draws it as inline SVG, readable with no script at all
  # (frames narrower than MIN_WIDTH pixels, or past MAX_RECTS, are left out; their parent's width
  # still counts them). #data holds the tree as JSON, in a `<script type="application/json">`
  # block (data, never run), and SCRIPT, the page's one script, redraws the SVG from it: click a
  # frame to zoom into it (a breadcrumb of its callers and "reset zoom" lead back out), type in
  # the search box to mark every frame whose method or file contains the text and see the share
  # they hold, switch between live bytes and live objects. The state is kept in the URL's
  # fragment (`#zoom=7&search=Cache&measure=objects`), so a link opens the same view. SCRIPT and
  # CSS are constants: a Content-Security-Policy allows them by hash (ReportHtml.content_security_policy).
  #
  # With `base:` (an older profile) it draws the difference instead, as a diff flame graph: widths
  # by the newer profile (or the older one, a switch away), each frame coloured by how much its
  # live bytes (or objects) grew, red, or shrank, blue, as a share of the larger total.
  class FlameGraph
    include HtmlText

    WIDTH = 1200
    ROW = 18
    MIN_WIDTH = 0.8
    MAX_RECTS = 20_000
    # The tree the script gets: nodes holding at least MIN_SHARE of a total, MAX_NODES at most.
    MIN_SHARE = 1e-5
    MAX_NODES = 30_000
    # Pixels per character of the frame labels (11px monospace).
    CHAR_WIDTH = 6.7
    # Hue and saturation by kind of library; lightness varies by name so neighbours differ.
    HUES = {app: [28, 85], gem: [140, 40], ruby: [210, 60], other: [0, 0]}.freeze
    KIND_NAMES = {app: "application", gem: "gems", ruby: "Ruby's library", other: "internal, eval, other"}.freeze
    # A change of this share of the larger total (or more) gets the strongest colour.
    FULL_CHANGE = 0.05

    Node = Struct.new(:name, :file, :line, :bytes, :objects, :children, :old_bytes, :old_objects)

    attr_reader :measure, :stacks

    # `profile`: a Profile; `paths`: a Report::Paths (labels and library kinds); `by`: :size or
    # :count; `base`: nil, or the older Profile of a diff.
    def initialize(profile, paths:, by: :size, base: nil)
      @paths = paths
      @diff = !base.nil?
      sizes = profile.sizes? && (base.nil? || base.sizes?)
      @sizes = sizes
      @measure = sizes && by == :size ? :bytes : :objects
      @root = Node.new("all", "", 0, 0, 0, {}, 0, 0)
      @stacks = 0
      @left_out = 0
      profile.samples.each { |sample| add(sample, false) }
      base&.samples&.each { |sample| add(sample, true) }
    end

    def diff?
      @diff
    end

    # Live bytes (or objects) under the root: of the newer profile in a diff.
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

    # The tree for SCRIPT, as the text of a `<script type="application/json">` block: every `<`,
    # `>` and `&` escaped, so no text from a profile can end the block. Nodes are
    # [parent, label, file, colour, bytes, objects(, old bytes, old objects in a diff)], the three
    # texts as indexes into `s`, parents before their children.
    def data
      strings = {}
      string = ->(text) { strings[text] ||= strings.size }
      nodes = []
      kept(@root).each_with_index do |(node, parent), index|
        row = [parent, string.call(Report::SafeText.escape(label(node))), string.call(place(node)),
          string.call(color(node)), node.bytes, node.objects]
        row.push(node.old_bytes, node.old_objects) if @diff
        nodes << row
      end
      json = JSON.generate({measure: @measure.to_s, sizes: @sizes, diff: @diff, width: WIDTH, row: ROW,
        min: MIN_WIDTH, max: MAX_RECTS, char: CHAR_WIDTH, full: FULL_CHANGE, s: strings.keys, n: nodes})
      json.gsub(/[<>&]/) { |c| format("\\u%04x", c.ord) }
    end

    # The search box, the bytes/objects switch (and old/new in a diff), the breadcrumb and the
    # line saying what the search matched; `hidden` until SCRIPT runs, as they need it.
    def controls
      measures = if @sizes
        %(<label>Width: <select id="flame-measure"><option value="bytes"#{" selected" if @measure == :bytes}>live bytes</option>) +
          %(<option value="objects"#{" selected" if @measure == :objects}>live objects</option></select></label>)
      else
        ""
      end
      side = @diff ? %(<label>Of: <select id="flame-side"><option value="new" selected>the new profile</option>) +
        %(<option value="old">the old profile</option></select></label>) : ""
      %(<div class="flame-controls" id="flame-controls" hidden>) +
        %(<label>Search: <input type="search" id="flame-search" placeholder="method or file" autocomplete="off"></label>) +
        %(#{measures}#{side}<button type="button" id="flame-reset">Reset zoom</button>) +
        %(<span id="flame-match" class="match-info"></span></div>\n<nav id="flame-crumbs" class="crumbs" hidden></nav>)
    end

    # [[kind name, CSS class], ...] for a legend; CSS colours each class.
    def self.legend
      HUES.keys.map { |kind| [KIND_NAMES.fetch(kind), "k-#{kind}"] }
    end

    # The page's one script (see the class comment). It reads #flame-data and draws into
    # svg.flame; all it writes is text (textContent) and SVG attributes.
    SCRIPT = <<~'JS'
      (function () {
        "use strict";
        var holder = document.getElementById("flame-data");
        var svg = document.querySelector("svg.flame");
        if (!holder || !svg) return;
        var d = JSON.parse(holder.textContent);
        var S = d.s, N = d.n, NS = "http://www.w3.org/2000/svg";
        var kids = N.map(function () { return []; });
        for (var i = 1; i < N.length; i++) kids[N[i][0]].push(i);
        var state = {zoom: 0, measure: d.measure, side: "new", term: ""};
        var $ = function (id) { return document.getElementById(id); };
        var search = $("flame-search"), measureBox = $("flame-measure"), sideBox = $("flame-side");
        var crumbs = $("flame-crumbs"), info = $("flame-match"), reset = $("flame-reset");

        function column() { return (state.measure === "bytes" ? 4 : 5) + (d.diff && state.side === "old" ? 2 : 0); }
        function value(n) { return N[n][column()]; }
        function label(n) { return S[N[n][1]]; }
        function human(b) {
          var units = ["B", "KiB", "MiB", "GiB", "TiB"], v = Math.abs(b), u = 0;
          while (v >= 1024 && u < units.length - 1) { v /= 1024; u++; }
          return (b < 0 ? "-" : "") + (u === 0 ? Math.round(v) + " B" : v.toFixed(1) + " " + units[u]);
        }
        function amount(v, measure) { return measure === "bytes" ? human(v) : v + " objects"; }
        function signed(v, measure) { return (v > 0 ? "+" : "") + amount(v, measure); }
        function percent(part, whole) { return (whole > 0 ? 100 * part / whole : 0).toFixed(1) + "%"; }
        function callers(n) { var list = []; while (n > 0) { n = N[n][0]; list.unshift(n); } return list; }
        function matches(n) {
          if (!state.term || n === 0) return false;
          return label(n).toLowerCase().indexOf(state.term) >= 0 || S[N[n][2]].toLowerCase().indexOf(state.term) >= 0;
        }
        function color(n) {
          if (!d.diff || n === 0) return S[N[n][3]];
          var k = state.measure === "bytes" ? 4 : 5, change = N[n][k] - N[n][k + 2];
          var whole = Math.max(N[0][k], N[0][k + 2], 1), strength = Math.min(1, Math.abs(change) / whole / d.full);
          if (change === 0) return "hsl(0,0%,82%)";
          return change > 0 ? "hsl(0,80%," + (88 - 36 * strength).toFixed(0) + "%)" : "hsl(215,75%," + (88 - 36 * strength).toFixed(0) + "%)";
        }
        function tip(n) {
          var lines = [label(n)], whole = N[0][column()];
          if (n > 0 && S[N[n][2]]) lines.push(S[N[n][2]]);
          if (d.diff) {
            ["bytes", "objects"].forEach(function (m) {
              if (m === "bytes" && !d.sizes) return;
              var k = m === "bytes" ? 4 : 5;
              lines.push(m + ": " + amount(N[n][k + 2], m) + " -> " + amount(N[n][k], m) + " (" + signed(N[n][k] - N[n][k + 2], m) + ")");
            });
            lines.push(percent(value(n), whole) + " of live " + state.measure + " in the " + state.side + " profile");
          } else {
            lines.push((d.sizes ? human(N[n][4]) + ", " : "") + N[n][5] + " objects, " + percent(value(n), whole) + " of live " + state.measure);
          }
          return lines.join("\n");
        }
        function node(tag, attrs, parent) {
          var e = document.createElementNS(NS, tag);
          for (var key in attrs) e.setAttribute(key, attrs[key]);
          if (parent) parent.appendChild(e);
          return e;
        }
        function frame(n, x, level, width, extra) {
          var g = node("g", {"class": "f" + extra + (matches(n) ? " match" : ""), "data-i": n}, svg);
          node("title", {}, g).textContent = tip(n);
          node("rect", {x: x.toFixed(1), y: level * d.row, width: width.toFixed(1), height: d.row - 1, rx: 2, fill: color(n)}, g);
          var fits = Math.floor((width - 6) / d.char), text = n === 0 ? "all: " + amount(value(0), state.measure) : label(n);
          if (fits >= 3) {
            node("text", {x: (x + 3).toFixed(1), y: level * d.row + d.row - 5}, g).textContent =
              text.length > fits ? text.slice(0, fits - 1) + "\u2026" : text;
          }
        }
        function draw() {
          while (svg.firstChild) svg.removeChild(svg.firstChild);
          if (value(state.zoom) <= 0) state.zoom = 0;
          var zoom = state.zoom, above = callers(zoom), scale = value(zoom) > 0 ? d.width / value(zoom) : 0;
          above.forEach(function (n, level) { frame(n, 0, level, d.width, " above"); });
          var drawn = 0, depth = above.length, pending = [[zoom, 0, above.length]];
          while (pending.length) {
            var top = pending.pop(), n = top[0], x = top[1], level = top[2], width = value(n) * scale;
            if (width < d.min || drawn >= d.max) continue;
            frame(n, x, level, width, n === zoom && zoom > 0 ? " zoomed" : "");
            drawn++;
            if (level > depth) depth = level;
            var placed = [], offset = x;
            kids[n].filter(function (c) { return value(c) > 0; }).sort(function (a, b) {
              return value(b) - value(a) || (label(a) < label(b) ? -1 : label(a) > label(b) ? 1 : 0);
            }).forEach(function (c) { placed.push([c, offset, level + 1]); offset += value(c) * scale; });
            for (var j = placed.length - 1; j >= 0; j--) pending.push(placed[j]);
          }
          var height = (depth + 1) * d.row;
          svg.setAttribute("height", height);
          svg.setAttribute("viewBox", "0 0 " + d.width + " " + height);
          drawCrumbs(above.concat(zoom > 0 ? [zoom] : []));
          drawMatch();
          remember();
        }
        function drawCrumbs(path) {
          while (crumbs.firstChild) crumbs.removeChild(crumbs.firstChild);
          crumbs.hidden = path.length === 0;
          reset.disabled = path.length === 0;
          path.forEach(function (n, i) {
            if (i > 0) crumbs.appendChild(document.createTextNode(" \u203a "));
            var b = document.createElement("button");
            b.type = "button";
            b.setAttribute("data-i", n);
            var text = n === 0 ? "all" : label(n);
            b.textContent = text.length > 48 ? text.slice(0, 47) + "\u2026" : text;
            b.title = label(n);
            if (n === state.zoom) b.className = "here";
            crumbs.appendChild(b);
          });
        }
        function drawMatch() {
          if (!state.term) { info.textContent = ""; return; }
          var covered = new Array(N.length), frames = 0, sum = 0;
          covered[0] = false;
          for (var n = 1; n < N.length; n++) {
            var hit = matches(n);
            if (hit) frames++;
            if (hit && !covered[N[n][0]]) sum += value(n);
            covered[n] = hit || covered[N[n][0]];
          }
          info.textContent = frames === 0 ? "No frame matches." : "Matched " + frames + (frames === 1 ? " frame: " : " frames: ") +
            amount(sum, state.measure) + ", " + percent(sum, value(0)) + " of live " + state.measure +
            (d.diff ? " in the " + state.side + " profile" : "");
        }
        function remember() {
          var parts = [];
          if (state.zoom > 0) parts.push("zoom=" + state.zoom);
          if (state.term) parts.push("search=" + encodeURIComponent(search.value));
          if (state.measure !== d.measure) parts.push("measure=" + state.measure);
          if (state.side !== "new") parts.push("side=" + state.side);
          try { history.replaceState(null, "", parts.length ? "#" + parts.join("&") : location.pathname + location.search); } catch (e) { }
        }
        function zoomTo(n) { state.zoom = n >= 0 && n < N.length ? n : 0; draw(); }
        function find() { state.term = search.value.trim().toLowerCase(); draw(); }

        svg.addEventListener("click", function (event) {
          var g = event.target.closest ? event.target.closest("g.f") : null;
          if (g) zoomTo(Number(g.getAttribute("data-i")));
        });
        crumbs.addEventListener("click", function (event) {
          var b = event.target.closest ? event.target.closest("button") : null;
          if (b) zoomTo(Number(b.getAttribute("data-i")));
        });
        reset.addEventListener("click", function () { zoomTo(0); });
        search.addEventListener("input", find);
        if (measureBox) measureBox.addEventListener("change", function () { state.measure = measureBox.value; draw(); });
        if (sideBox) sideBox.addEventListener("change", function () { state.side = sideBox.value; draw(); });

        location.hash.replace(/^#/, "").split("&").forEach(function (part) {
          var at = part.indexOf("="), key = part.slice(0, at), raw = part.slice(at + 1), text;
          if (at < 0) return;
          try { text = decodeURIComponent(raw); } catch (e) { return; }
          if (key === "zoom" && /^\d+$/.test(text) && Number(text) < N.length) state.zoom = Number(text);
          if (key === "search") search.value = text;
          if (key === "measure" && measureBox && (text === "bytes" || text === "objects")) state.measure = measureBox.value = text;
          if (key === "side" && sideBox && (text === "new" || text === "old")) state.side = sideBox.value = text;
        });
        state.term = search.value.trim().toLowerCase();
        $("flame-controls").hidden = false;
        svg.setAttribute("data-script", "on");
        draw();
      })();
    JS

    CSS = <<~CSS
      .flame-controls { display: flex; flex-wrap: wrap; align-items: center; gap: 6px 18px; font-size: 13px; margin: 8px 0; }
      .flame-controls input, .flame-controls select, .flame-controls button { font: inherit; font-size: 13px; }
      .flame-controls input[type=search] { width: 18em; padding: 2px 6px; }
      .flame-controls .match-info { color: #6e2a8c; font-weight: 600; }
      nav.crumbs { font-size: 12px; margin: 4px 0 6px; overflow-wrap: anywhere; }
      nav.crumbs button { font: 12px ui-monospace, "DejaVu Sans Mono", Menlo, monospace; border: 1px solid #d0d7de;
        background: #f6f8fa; border-radius: 4px; padding: 1px 6px; cursor: pointer; }
      nav.crumbs button.here { background: #fff4d6; border-color: #d4a72c; }
      svg.flame[data-script] g.f { cursor: pointer; }
      svg.flame g.f.above rect { opacity: 0.5; }
      svg.flame g.f.match rect { fill: #c84fe0; }
      .legend span.swatch.k-app { background: hsl(28,85%,68%); }
      .legend span.swatch.k-gem { background: hsl(140,40%,68%); }
      .legend span.swatch.k-ruby { background: hsl(210,60%,68%); }
      .legend span.swatch.k-other { background: hsl(0,0%,68%); }
      .legend span.swatch.k-grew { background: hsl(0,80%,60%); }
      .legend span.swatch.k-shrank { background: hsl(215,75%,60%); }
      .legend span.swatch.k-same { background: hsl(0,0%,82%); }
      .legend span.swatch.k-match { background: #c84fe0; }
    CSS

    private

    def add(sample, old)
      bytes = sample.bytes.to_i
      objects = sample.objects.to_i
      # A crafted profile may hold negative values: they would make widths negative.
      return if bytes < 0 || objects < 0 || (bytes.zero? && objects.zero?)

      @stacks += 1 unless old || (@measure == :bytes ? bytes : objects).zero?
      node = @root
      grow(node, bytes, objects, old)
      sample.locations.reverse_each do |name, file, line|
        node = (node.children[[name, file, line]] ||= Node.new(name, file, line, 0, 0, {}, 0, 0))
        grow(node, bytes, objects, old)
      end
    end

    def grow(node, bytes, objects, old)
      if old
        node.old_bytes += bytes
        node.old_objects += objects
      else
        node.bytes += bytes
        node.objects += objects
      end
    end

    # The nodes the script gets, as [node, parent index], parents first: those holding at least
    # MIN_SHARE of a total (any measure, either side), the heaviest MAX_NODES of them.
    def kept(root)
      totals = [root.bytes, root.objects, root.old_bytes, root.old_objects].map { |t| t > 0 ? t.to_f : nil }
      share = ->(n) { [n.bytes, n.objects, n.old_bytes, n.old_objects].zip(totals).map { |v, t| t ? v / t : 0.0 }.max }
      candidates = []
      walk = [[root, nil, 0]]
      until walk.empty?
        node, parent, depth = walk.pop
        s = node.equal?(root) ? 1.0 : share.call(node)
        next if s < MIN_SHARE

        candidates << [node, parent, depth, s]
        node.children.each_value { |c| walk << [c, node, depth + 1] }
      end
      if candidates.size > MAX_NODES
        # A child holds no more than its parent, and comes after it at equal share (deeper).
        candidates = candidates.sort_by.with_index { |(_, _, depth, s), i| [-s, depth, i] }.first(MAX_NODES)
      end
      index = {}
      ordered = candidates.sort_by { |_, _, depth, _| depth }
      ordered.each_with_index.map do |(node, parent), i|
        index[node.object_id] = i
        [node, parent ? index.fetch(parent.object_id) : nil]
      end
    end

    def label(node)
      return "all: #{@measure == :bytes ? human(node.bytes) : "#{node.objects} objects"}" if node.equal?(@root)

      @paths.frame(node.name, node.file, node.line)
    end

    # The frame's file:line in full ("" for the root and frames without a file).
    def place(node)
      return "" if node.equal?(@root) || node.file.to_s.empty?

      Report::SafeText.escape(node.line.to_i > 0 ? "#{node.file}:#{node.line}" : node.file.to_s)
    end

    def frame(node, x, level, width)
      # Escaped for the terminal's sake first, so that the cut below counts what is shown.
      text = Report::SafeText.escape(label(node))
      y = level * ROW
      share = total > 0 ? 100.0 * node[@measure] / total : 0.0
      tip = [text]
      tip << (node.line.to_i > 0 ? "#{node.file}:#{node.line}" : node.file) unless node.equal?(@root) || node.file.to_s.empty?
      if @diff
        tip << "#{@measure}: #{amount(old_value(node))} -> #{amount(node[@measure])} (#{change_text(node)})"
        tip << "#{format("%.1f%%", share)} of live #{@measure} in the new profile"
      else
        tip << "#{human(node.bytes)}, #{node.objects} objects, #{format("%.1f%%", share)} of live #{@measure}"
      end
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

    def old_value(node)
      @measure == :bytes ? node.old_bytes : node.old_objects
    end

    def amount(value)
      @measure == :bytes ? human(value) : "#{value} objects"
    end

    def change_text(node)
      change = node[@measure] - old_value(node)
      change.negative? ? amount(change) : "+#{amount(change)}"
    end

    # The frame's colour: by kind of library; in a diff, by its change (as SCRIPT colours it).
    def color(node)
      return "hsl(0,0%,80%)" if node.equal?(@root)
      return diff_color(node) if @diff

      hue, sat = HUES.fetch(kind(node.file.to_s))
      light = 60 + (node.name.to_s.bytes.sum % 19)
      "hsl(#{hue},#{sat}%,#{light}%)"
    end

    def diff_color(node)
      change = node[@measure] - old_value(node)
      return "hsl(0,0%,82%)" if change.zero?

      whole = [@root[@measure], old_value(@root), 1].max
      strength = [change.abs.to_f / whole / FULL_CHANGE, 1.0].min
      light = (88 - 36 * strength).round
      change.positive? ? "hsl(0,80%,#{light}%)" : "hsl(215,75%,#{light}%)"
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
