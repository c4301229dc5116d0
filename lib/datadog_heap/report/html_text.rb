# frozen_string_literal: true

require "cgi"
require_relative "safe_text"
require_relative "bytes"

module DatadogHeap
  # What the HTML pages (ReportHtml, TrendHtml, FlameGraph) write text and numbers with. Pages
  # that are modules `extend` it, classes `include` it.
  module HtmlText
    private

    # Text from a profile as HTML: escaped for element text and quoted attribute values alike,
    # control characters and stray bytes shown as Report::SafeText shows them.
    def h(text)
      CGI.escapeHTML(Report::SafeText.escape(text))
    end

    # A coordinate or length for SVG: one decimal.
    def f(number)
      format("%.1f", number)
    end

    def human(bytes)
      Report::Bytes.human_bytes(bytes)
    end
  end
end
