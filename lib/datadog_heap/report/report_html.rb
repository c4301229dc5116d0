# frozen_string_literal: true

require "digest"
require_relative "html_text"
require_relative "flame_graph"
require_relative "trend_html"

module DatadogHeap
  # The page `datadog-heap report --html` writes and the endpoint's `?html=1` serves: one
  # self-contained HTML document (inline CSS and SVG, one inline script; nothing fetched) that
  # reads without a browser's help (the script only makes the flame graph navigable, see
  # FlameGraph): the profile's facts and notes, a flame graph of live bytes by stack
  # (FlameGraph), the report's top sites and top classes (the cells `datadog-heap report` prints)
  # and, for a series of profiles, the trend charts of TrendHtml.
  #
  # Every text that comes from a profile (frames, files, classes, comments, paths) goes through
  # `h`: HTML-escaped, control characters shown as Report::SafeText shows them.
  module ReportHtml
    extend HtmlText

    BUDGET_NOTE = /asked 1 in (\d+) allocations, sampled 1 in (\d+) \(up to 1 in (\d+)\)/
    PID_IN_NAME = /\A(?:heap-(?:rss-)?(\d+)-\d+\.pb(?:\.gz)?|heap of pid (\d+))\z/

    CSS = <<~CSS
      :root { color-scheme: light; }
      body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 24px auto; padding: 0 24px;
        max-width: 1400px; color: #1f2328; background: #f6f8fa; }
      h1 { font-size: 22px; margin: 0 0 4px; overflow-wrap: anywhere; }
      h2 { font-size: 17px; margin: 28px 0 8px; }
      section { background: #fff; border: 1px solid #d0d7de; border-radius: 8px; padding: 4px 18px 14px; margin: 16px 0; }
      p.lead { margin: 0 0 12px; color: #424a53; font-size: 15px; }
      p.help { color: #57606a; font-size: 13px; margin: 6px 0; }
      table { border-collapse: collapse; font-size: 13px; }
      th, td { padding: 4px 10px; text-align: left; vertical-align: top; }
      table.rows { width: 100%; }
      #classes table.rows { width: auto; min-width: 60%; }
      table.rows th { border-bottom: 2px solid #d0d7de; white-space: nowrap; background: #f6f8fa; }
      table.rows tr:nth-child(even) td { background: #f6f8fa; }
      table.rows td.num { text-align: right; white-space: nowrap; font-variant-numeric: tabular-nums; }
      table.rows th.num { text-align: right; }
      table.rows td.where { font-family: ui-monospace, "DejaVu Sans Mono", Menlo, monospace; font-size: 12px; overflow-wrap: anywhere; }
      table.rows tr.rough td { color: #8c6d1f; }
      table.facts th { color: #57606a; font-weight: 600; white-space: nowrap; padding-left: 0; }
      table.facts td { overflow-wrap: anywhere; }
      ul.notes { margin: 4px 0; padding-left: 20px; font-size: 13px; }
      ul.notes li { margin: 2px 0; }
      #retainers span.path, #retainers div.example { font-family: ui-monospace, "DejaVu Sans Mono", Menlo, monospace; font-size: 12px; overflow-wrap: anywhere; }
      #retainers div.example { color: #57606a; }
      .scroll { overflow-x: auto; }
      svg.flame { display: block; max-width: 100%; height: auto; }
      svg.flame text { font: 11px ui-monospace, "DejaVu Sans Mono", Menlo, monospace; fill: #1f2328; pointer-events: none; }
      svg.flame g.f:hover rect { stroke: #1f2328; stroke-width: 1.5; }
      .legend { font-size: 12px; color: #424a53; margin: 4px 0 8px; }
      .legend span.swatch { display: inline-block; width: 11px; height: 11px; border-radius: 2px; margin: 0 4px -1px 12px; }
      .legend span.swatch:first-child { margin-left: 0; }
      footer { color: #57606a; font-size: 12px; margin: 12px 0; }
    CSS

    module_function

    # The page for `profile`. `sites` and `classes` are report tables (Report::Text#site_table's
    # {headers:, rows:, aligns:, titles:, rough:} with count: and noun:, rows' cells not yet
    # escaped); `paths` a Report::Paths; `by` :size or :count; `series` nil, or
    # {profiles:, trends:} / {profiles:, error:} for several; `holders` nil, or what keeps each
    # top site alive (see #holders_section).
    def page(profile, sites:, classes:, paths:, by: :size, series: nil, holders: nil)
      flame = FlameGraph.new(profile, paths: paths, by: by)
      graph = flame.svg
      measure = flame.measure == :bytes ? "bytes" : "objects"
      <<~HTML
        #{head("datadog-heap report: #{name(profile)}")}
        </head>
        <body>
        <h1>Live heap: #{h(name(profile))}</h1>
        <p class="lead">#{h(headline(profile, sites[:count]))}</p>
        <section id="profile">
        <h2>Profile</h2>
        #{facts(profile, series)}
        #{notes(profile)}
        </section>
        <section id="flame">
        <h2>Live #{measure} by stack</h2>
        <p class="help">An icicle graph: the root (all live #{measure}) at the top, and under each frame the frames it
        called, as wide as the live #{measure} their stacks hold, heaviest first. Frames read "method (file:line)";
        hover over one for its bytes, objects and share. Click a frame to zoom into it (the breadcrumb above the graph
        leads back out); the search box marks the frames whose method or file contains its text and sums what they hold.#{flame.left_out > 0 ? " Frames too narrow to see are left out." : ""}</p>
        #{legend}
        #{flame.stacks.zero? ? "" : flame.controls}
        <div class="scroll">#{flame.stacks.zero? ? "<p>No live objects in this profile.</p>" : graph}</div>
        #{flame.stacks.zero? ? "" : script(flame)}
        </section>
        <section id="sites">
        #{rows_table(sites, by)}
        #{uncertainty_help(profile, sites)}
        </section>
        #{holders_section(holders)}
        <section id="classes">
        #{rows_table(classes, by)}
        </section>
        #{trend(series, paths)}
        <footer>Written by datadog-heap #{h(DatadogHeap::VERSION)}. Files shortened as `datadog-heap report` shows them
        (#{paths.wide? ? "here in full: --wide" : "--wide shows them in full"}); hover over a site for its full path.</footer>
        </body>
        </html>
      HTML
    end

    # The page's <!DOCTYPE> and <head> up to its one <style> element, for a page titled `title`
    # (escaped here); the report's and the diff's pages open with it.
    def head(title)
      <<~HTML.chomp
        <!DOCTYPE html>
        <html lang="en">
        <head>
        <meta charset="utf-8">
        <meta name="viewport" content="width=device-width, initial-scale=1">
        <title>#{h(title)}</title>
        <style>#{style}</style>
      HTML
    end

    # The text of the page's one <style> element, as the policy hashes it.
    def style
      "\n#{CSS}#{TrendHtml::CSS}#{FlameGraph::CSS}"
    end

    # The flame graph's data block (JSON, never run) and the page's one script (FlameGraph::SCRIPT).
    def script(flame)
      %(<script type="application/json" id="flame-data">#{flame.data}</script>\n<script>#{FlameGraph::SCRIPT}</script>)
    end

    # The Content-Security-Policy the endpoint serves the page with: the one inline style and the
    # one inline script, each by its sha256, and nothing else (no other script, no style
    # attribute, no request, no form, no frame).
    def content_security_policy
      @content_security_policy ||= "default-src 'none'; script-src #{sha256(FlameGraph::SCRIPT)}; style-src #{sha256(style)}; " \
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    end

    def sha256(text)
      "'sha256-#{Digest::SHA256.base64digest(text)}'"
    end

    def name(profile)
      return profile.path || "(profile)" if profile.count == 1

      "#{profile.count} profiles summed"
    end

    def headline(profile, site_count)
      bytes = profile.sizes? ? "#{human(profile.total_bytes)} in " : ""
      "#{bytes}#{profile.total_objects} live objects at #{site_count} #{site_count == 1 ? "site" : "sites"}"
    end

    # The facts table: files, process, time, sampling interval, sample types.
    def facts(profile, series)
      rows = []
      if series
        rows << ["Files", "#{series[:profiles].size} profiles; the flame graph and tables are of the latest, " \
          "#{profile.path || "(unnamed)"}; the trend below is of all of them"]
      else
        rows << [profile.count > 1 ? "Files" : "File", profile.count > 1 ? profile.paths.join(", ") : (profile.path || "(none: read from memory)")]
      end
      pid = pid_of(profile)
      rows << ["Process", pid ? "pid #{pid}" : "unknown (the file name does not say)"] if profile.count == 1
      rows << ["Taken", taken(profile)]
      rows << ["Sampling interval", interval(profile)]
      rows << ["Sample types", profile.sample_types.map { |type, unit| "#{type} (#{unit})" }.join(", ")]
      rows << ["Sampling error", profile.uncertainty? ? "recorded: samples and ± per row" :
        "not recorded in this profile (older datadog_heap or another profiler): ± and samples are n/a"]
      body = rows.map { |k, v| "<tr><th>#{h(k)}</th><td>#{h(v)}</td></tr>" }.join("\n")
      %(<table class="facts">\n#{body}\n</table>)
    end

    # The process id in an auto-mode or endpoint profile's name (heap-<pid>-<n>.pb.gz,
    # heap-rss-<pid>-<n>.pb.gz, "heap of pid N"), or nil.
    def pid_of(profile)
      match = PID_IN_NAME.match(File.basename(profile.path.to_s))
      match && (match[1] || match[2])
    end

    def taken(profile)
      return "unknown (the profile has no time)" if profile.time_nanos <= 0

      start = Time.at(profile.time_nanos / 1e9).utc
      finish = Time.at(profile.end_time).utc
      span = profile.duration_nanos / 1e9
      "#{finish.strftime("%Y-%m-%d %H:%M:%S UTC")} (the live heap then#{span > 0 ? "; covering #{format("%.1f", span)} s from #{start.strftime("%H:%M:%S")}" : ""})"
    end

    # The interval used (the period) and the one asked, which differ when the overhead budget
    # raised it (its note says so).
    def interval(profile)
      return "unknown (the profile has no period)" if profile.period.to_i <= 0

      unit = profile.period_type ? profile.period_type[0] : "events"
      used = profile.period == 1 ? "used 1 in 1 #{unit} (every one)" : "used 1 in #{profile.period} #{unit}"
      budget = profile.comments.lazy.map { |c| BUDGET_NOTE.match(c) }.find(&:itself)
      if budget
        "#{used}; asked 1 in #{budget[1]}: the overhead budget raised it (to 1 in #{budget[2]}, up to 1 in #{budget[3]}; see the notes)"
      else
        "#{used}; asked the same (no overhead-budget note)"
      end
    end

    def notes(profile)
      return %(<p class="help">No notes in this profile.</p>) if profile.comments.empty?

      items = profile.comments.map { |c| "<li>#{h(c)}</li>" }.join("\n")
      %(<h3>Notes</h3>\n<ul class="notes">\n#{items}\n</ul>)
    end

    def legend
      swatches = FlameGraph.legend.map do |name, css|
        %(<span class="swatch #{css}"></span>#{h(name)})
      end
      %(<div class="legend">#{swatches.join(" ")}</div>)
    end

    # A report table as HTML, headed "Top N of M nouns by live bytes".
    def rows_table(table, by)
      noun = table[:noun]
      plural = noun == "class" ? "classes" : "#{noun}s"
      title = "Top #{table[:rows].size} of #{table[:count]} #{table[:count] == 1 ? noun : plural} by live #{by == :size ? "bytes" : "objects"}"
      return %(<h2>Top #{h(plural)}</h2>\n<p>No live objects.</p>) if table[:rows].empty?

      aligns = table[:aligns]
      wheres = table[:headers].each_index.select { |i| %w[site location file called\ from].include?(table[:headers][i]) }
      head = table[:headers].each_with_index.map { |text, i| %(<th#{aligns[i] == "r" ? ' class="num"' : ""}>#{h(text)}</th>) }
      body = table[:rows].each_with_index.map do |row, r|
        cells = row.each_with_index.map do |cell, i|
          css = aligns[i] == "r" ? "num" : (wheres.include?(i) ? "where" : nil)
          full = table.dig(:titles, r, i)
          %(<td#{css ? %( class="#{css}") : ""}#{full ? %( title="#{h(full)}") : ""}>#{h(cell)}</td>)
        end
        %(<tr#{table.dig(:rough, r) ? ' class="rough"' : ""}>#{cells.join}</tr>)
      end
      %(<h2>#{h(title)}</h2>\n<table class="rows">\n<thead><tr>#{head.join}</tr></thead>\n<tbody>\n#{body.join("\n")}\n</tbody>\n</table>)
    end

    # "What keeps it alive": per top site with retainer paths ({site:, class_name:, found:, shapes:
    # [[counts, shape, example or nil], ...]}, from Report::RetainerShapes), its paths grouped by shape; "" for
    # nil (the profile has none).
    def holders_section(holders)
      return "" unless holders

      body = if holders.empty?
        "<p>No sampled object of these sites has a retainer path.</p>"
      else
        holders.map do |site|
          shapes = site[:shapes].map do |counts, shape, example|
            e = example ? %(<div class="example">e.g. #{h(example)}</div>) : ""
            %(<li>#{h(counts)}: <span class="path">#{h(shape)}</span>#{e}</li>)
          end
          %(<h3>#{h(site[:site])} (#{h(site[:class_name])})</h3>\n<ul class="notes">\n#{shapes.join("\n")}\n</ul>\n) +
            %(<p class="help">#{h(site[:found])}</p>)
        end.join("\n")
      end
      %(<section id="retainers">\n<h2>What keeps it alive</h2>\n<p class="help">Retainer paths from GC roots, grouped by ) +
        %(shape (Hash keys and Array indexes as *; keys shown by class and size), as datadog-heap why prints them.</p>\n) +
        %(#{body}\n</section>)
    end

    def uncertainty_help(profile, table)
      return "" if table[:rows].empty?
      unless profile.uncertainty?
        return %(<p class="help">This profile does not say how many samples each row rests on: ± and samples are n/a.</p>)
      end

      rough = table[:rough]&.any? ? " ~ rough (rows in brown): fewer than #{Profile::ROUGH_SAMPLES} samples, " \
        "the estimate may be off by as much as itself." : ""
      %(<p class="help">samples: live objects recorded, each standing for its weight of allocations; ± is one standard ) +
        %(deviation of the sampling error.#{h(rough)}</p>)
    end

    def trend(series, paths)
      return "" unless series

      if series[:error]
        return %(<section id="trend">\n<h2>Trend</h2>\n<p>No trend over these #{series[:profiles].size} profiles: ) +
          %(#{h(series[:error])}</p>\n</section>)
      end
      %(<section id="trend">\n<h2>Trend over #{series[:profiles].size} profiles</h2>\n) +
        TrendHtml.section(series[:profiles], series[:trends], top: 12, paths: paths, heading: "h3") +
        "\n</section>"
    end
  end
end
