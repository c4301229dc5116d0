# frozen_string_literal: true

require_relative "html_text"
require_relative "flame_graph"
require_relative "report_html"

module DatadogHeap
  # The page `datadog-heap diff --html OLD NEW` writes: the two profiles' facts, a diff flame graph
  # (FlameGraph with `base:`: widths by the new profile, or the old one a switch away; frames red
  # where live bytes grew, blue where they shrank) and the sites that changed most, both ways.
  # Self-contained as ReportHtml's page is (the same style and script); every text from a
  # profile is escaped.
  module DiffHtml
    extend HtmlText

    module_function

    # The page for `old` and `new` (Profiles, each one file or a sum). `paths`: a Report::Paths;
    # `by`: :size or :count; `group`: {group:, app_root:} as for Profile#diff; `top`: rows per table.
    def page(old, new, paths:, by:, group:, top:)
      flame = FlameGraph.new(new, paths: paths, by: by, base: old)
      measure = flame.measure == :bytes ? "bytes" : "objects"
      title = "#{name(old)} -> #{name(new)}"
      diffs = old.diff(new, **group)
      change = measure == "bytes" ? :bytes_change : :objects_change
      grew = diffs.select { |d| d.public_send(change) > 0 }.sort_by { |d| -d.public_send(change) }
      shrank = diffs.select { |d| d.public_send(change) < 0 }.sort_by { |d| d.public_send(change) }
      graph = flame.stacks.zero? ? "<p>No live objects in the new profile.</p>" : flame.svg
      <<~HTML
        #{ReportHtml.head("datadog-heap diff: #{title}")}
        </head>
        <body>
        <h1>Live heap diff: #{h(title)}</h1>
        <p class="lead">#{h(headline(old, new, measure))}</p>
        <section id="profile">
        <h2>Profiles</h2>
        #{facts(old, new)}
        </section>
        <section id="flame">
        <h2>Change in live #{measure} by stack</h2>
        <p class="help">An icicle graph of the new profile: the root at the top, and under each frame the frames it called,
        as wide as the live #{measure} their stacks hold (switch to the old profile's widths to see what shrank away). Red
        frames grew, blue ones shrank, the deeper the colour the larger the change; hover over one for both sides. Click a
        frame to zoom into it; the search box marks frames whose method or file contains its text.</p>
        #{legend}
        #{flame.stacks.zero? ? "" : flame.controls}
        <div class="scroll">#{graph}</div>
        #{flame.stacks.zero? ? "" : ReportHtml.script(flame)}
        </section>
        <section id="grew">
        #{table("grew", grew.first(top), grew.size, measure, paths, group[:group])}
        </section>
        <section id="shrank">
        #{table("shrank", shrank.first(top), shrank.size, measure, paths, group[:group])}
        </section>
        <footer>Written by datadog-heap #{h(DatadogHeap::VERSION)}. `datadog-heap diff OLD NEW` prints the growing rows with
        their noise (± and significance).</footer>
        </body>
        </html>
      HTML
    end

    def name(profile)
      profile.count == 1 ? (profile.path || "(profile)") : "#{profile.count} profiles summed"
    end

    def headline(old, new, measure)
      if measure == "bytes"
        "live bytes #{human(old.total_bytes)} -> #{human(new.total_bytes)} (#{signed(new.total_bytes - old.total_bytes)})"
      else
        change = new.total_objects - old.total_objects
        "live objects #{old.total_objects} -> #{new.total_objects} (#{change.negative? ? change : "+#{change}"})"
      end
    end

    def signed(bytes)
      bytes.negative? ? human(bytes) : "+#{human(bytes)}"
    end

    def facts(old, new)
      rows = [["Old", old.paths.join(", ")], ["New", new.paths.join(", ")],
        ["Taken", "#{ReportHtml.taken(old)}; then #{ReportHtml.taken(new)}"]]
      body = rows.map { |k, v| "<tr><th>#{h(k)}</th><td>#{h(v)}</td></tr>" }.join("\n")
      %(<table class="facts">\n#{body}\n</table>)
    end

    def legend
      swatches = [["grew", "k-grew"], ["shrank", "k-shrank"], ["unchanged", "k-same"], ["search match", "k-match"]].map do |text, css|
        %(<span class="swatch #{css}"></span>#{h(text)})
      end
      %(<div class="legend">#{swatches.join(" ")}</div>)
    end

    # The sites that grew (or shrank) most: change, old, new, the site.
    def table(way, rows, count, measure, paths, kind)
      noun = kind.to_s
      plural = noun == "class" ? "classes" : "#{noun}s"
      return %(<h2>No #{h(noun)} #{way}</h2>) if rows.empty?

      amount = ->(v) { measure == "bytes" ? human(v) : v.to_s }
      body = rows.map do |d|
        old, new = measure == "bytes" ? [d.old_bytes, d.new_bytes] : [d.old_objects, d.new_objects]
        change = new - old
        cells = [measure == "bytes" ? signed(change) : format("%+d", change), old.zero? ? "new" : format("%+.1f%%", 100.0 * change / old),
          amount.call(old), amount.call(new)].map { |c| %(<td class="num">#{h(c)}</td>) }
        label = paths.label(d, kind)
        cells << %(<td class="where" title="#{h(d.label)}">#{h(label)}</td>)
        "<tr>#{cells.join}</tr>"
      end
      %(<h2>#{h("Top #{rows.size} of #{count} #{count == 1 ? noun : plural} that #{way}, by live #{measure}")}</h2>\n) +
        %(<table class="rows">\n<thead><tr><th class="num">change</th><th class="num">relative</th><th class="num">old</th>) +
        %(<th class="num">new</th><th>#{h(noun)}</th></tr></thead>\n<tbody>\n#{body.join("\n")}\n</tbody>\n</table>)
    end
  end
end
