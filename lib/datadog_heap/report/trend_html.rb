# frozen_string_literal: true

require_relative "html_text"

module DatadogHeap
  # `datadog-heap trend --html OUT.html`: one self-contained page (inline SVG and CSS, no script,
  # nothing fetched) with a small chart per top site: its live bytes in each profile with the
  # sampling error (±2σ), the fitted line, the slope, the confidence and the verdict.
  module TrendHtml
    extend HtmlText

    WIDTH = 360
    HEIGHT = 170
    PAD_LEFT = 64
    PAD_RIGHT = 12
    PAD_TOP = 14
    PAD_BOTTOM = 30
    COLORS = {growing: "#c62828", steady: "#546e7a", shrinking: "#2e7d32"}.freeze

    # The page's rules, also used by `report --html`'s page, which shows these charts below its
    # flame graph.
    CSS = <<~CSS
      p.summary { margin: 0 0 16px; color: #555; }
      .grid { display: flex; flex-wrap: wrap; gap: 16px; }
      .card { background: #fff; border: 1px solid #ddd; border-radius: 6px; padding: 10px 12px; width: #{WIDTH}px; }
      .card h2, .card h3 { font-size: 13px; font-weight: 600; margin: 0 0 2px; overflow-wrap: break-word; word-break: normal; }
      .meta { font-size: 12px; color: #555; margin: 0 0 4px; }
      .verdict { display: inline-block; color: #fff; border-radius: 3px; padding: 0 6px; font-size: 12px; font-weight: 600; }
      svg.trend text { font: 10px system-ui, sans-serif; fill: #555; }
    CSS

    module_function

    # Writes the page for `trends` (Profile.trend of `profiles`) to `path`; at most `top` charts,
    # growing sites first; files shown as `paths` (a Report::Paths) shows them (nil: as they are).
    # Returns the path.
    def write(path, profiles, trends, top: 12, paths: nil)
      path = Validate.path!(:path, path)
      File.write(path, page(profiles, trends, top: top, paths: paths))
      path
    end

    def page(profiles, trends, top: 12, paths: nil)
      <<~HTML
        <!DOCTYPE html>
        <html lang="en">
        <head>
        <meta charset="utf-8">
        <title>datadog-heap trend</title>
        <style>
        body { font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #212121; background: #fafafa; }
        h1 { font-size: 20px; margin: 0 0 4px; }
        #{CSS}
        </style>
        </head>
        <body>
        <h1>Live heap trend per site</h1>
        #{section(profiles, trends, top: top, paths: paths, heading: "h2")}
        </body>
        </html>
      HTML
    end

    # The summary line and the charts, without the page around them; card titles are `heading`s.
    def section(profiles, trends, top: 12, paths: nil, heading: "h2")
      shown = trends.first(top)
      counts = Trend::VERDICTS.map { |v| "#{trends.count { |t| t.verdict == v }} #{v}" }.join(", ")
      times = profiles.map(&:end_time).compact.sort
      <<~HTML.chomp
        <p class="summary">#{profiles.size} profiles from #{h(time_text(times.first))} to #{h(time_text(times.last))};
        #{trends.size} sites: #{h(counts)}. Showing #{shown.size}, growing first. Points: live #{trends.first&.unit || "bytes"}
        in each profile, bars ±2σ sampling error, dashed: the fitted line.</p>
        <div class="grid">
        #{shown.map { |t| card(t, paths, heading) }.join("\n")}
        </div>
      HTML
    end

    def card(trend, paths = nil, heading = "h2")
      color = COLORS.fetch(trend.verdict)
      slope = trend.unit == :bytes ? "#{signed_bytes(trend.slope.to_f)}/min" : format("%+.1f objects/min", trend.slope.to_f)
      # Whatever the group: only a label that starts with the site's file is shortened.
      label = paths ? paths.label(trend, :site) : trend.label
      <<~HTML.chomp
        <div class="card">
        <#{heading} title="#{h(trend.label)}">#{h(label)}#{trend.class_name ? " <span class=\"meta\">(#{h(trend.class_name)})</span>" : ""}</#{heading}>
        <p class="meta"><span class="verdict" style="background:#{color}">#{trend.verdict}</span>
        #{h(slope)}, confidence #{format("%.1f%%", trend.confidence * 100)},
        samples #{h("#{trend.samples.first} → #{trend.samples.last}")}#{trend.note ? " (#{h(trend.note)})" : ""}</p>
        #{chart(trend, color)}
        </div>
      HTML
    end

    # An SVG chart: y from 0 to the highest error bar, x from the first profile to the last.
    def chart(trend, color)
      times = trend.times
      # Live bytes are never negative: error bars stop at 0.
      lows = trend.bytes.zip(trend.stddevs).map { |y, s| [y - 2 * s, 0].max }
      highs = trend.bytes.zip(trend.stddevs).map { |y, s| y + 2 * s }
      ymax = [highs.max.to_f, 1.0].max
      ymin = 0.0
      tmax = [times.max.to_f, 1e-9].max
      x = ->(t) { PAD_LEFT + (WIDTH - PAD_LEFT - PAD_RIGHT) * t / tmax }
      y = ->(v) { PAD_TOP + (HEIGHT - PAD_TOP - PAD_BOTTOM) * (1 - (v - ymin) / (ymax - ymin)) }
      parts = []
      parts << %(<line x1="#{PAD_LEFT}" y1="#{f(y.call(ymin))}" x2="#{WIDTH - PAD_RIGHT}" y2="#{f(y.call(ymin))}" stroke="#999"/>)
      parts << %(<line x1="#{PAD_LEFT}" y1="#{PAD_TOP}" x2="#{PAD_LEFT}" y2="#{f(y.call(ymin))}" stroke="#999"/>)
      [ymin, (ymin + ymax) / 2, ymax].each do |v|
        parts << %(<text x="#{PAD_LEFT - 4}" y="#{f(y.call(v) + 3)}" text-anchor="end">#{h(axis_value(v, trend.unit))}</text>)
      end
      parts << %(<text x="#{PAD_LEFT}" y="#{HEIGHT - 8}">0</text>)
      parts << %(<text x="#{WIDTH - PAD_RIGHT}" y="#{HEIGHT - 8}" text-anchor="end">#{h(minutes(tmax))}</text>)
      if trend.slope
        per_second = trend.slope / 60.0
        fit_at = ->(t) { trend.intercept + per_second * t }
        parts << %(<line x1="#{f(x.call(0))}" y1="#{f(y.call(fit_at.call(0)))}" x2="#{f(x.call(tmax))}" ) +
          %(y2="#{f(y.call(fit_at.call(tmax)))}" stroke="#{color}" stroke-dasharray="4 3" stroke-width="1.5"/>)
      end
      points = times.zip(trend.bytes).map { |t, v| "#{f(x.call(t))},#{f(y.call(v))}" }
      parts << %(<polyline points="#{points.join(" ")}" fill="none" stroke="#90a4ae" stroke-width="1"/>)
      times.each_index do |i|
        cx = f(x.call(times[i]))
        parts << %(<line x1="#{cx}" y1="#{f(y.call(lows[i]))}" x2="#{cx}" y2="#{f(y.call(highs[i]))}" stroke="#{color}" stroke-opacity="0.5"/>)
        parts << %(<circle cx="#{cx}" cy="#{f(y.call(trend.bytes[i]))}" r="3" fill="#{color}"/>)
      end
      %(<svg class="trend" xmlns="http://www.w3.org/2000/svg" width="#{WIDTH}" height="#{HEIGHT}" viewBox="0 0 #{WIDTH} #{HEIGHT}" ) +
        %(role="img" aria-label="live #{trend.unit} over time">#{parts.join}</svg>)
    end

    def time_text(seconds)
      seconds ? Time.at(seconds).utc.strftime("%Y-%m-%d %H:%M:%S UTC") : "?"
    end

    def minutes(seconds)
      return format("%.2f s", seconds) if seconds < 10

      seconds < 120 ? format("%.0f s", seconds) : format("%.1f min", seconds / 60)
    end

    def axis_value(value, unit)
      unit == :bytes ? human(value) : value.round.to_s
    end

    def signed_bytes(bytes)
      Report::Bytes.signed_bytes(bytes)
    end
  end
end
