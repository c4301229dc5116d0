# frozen_string_literal: true

require "datadog_heap/cli"
require "datadog_heap/report/trend_html"

# A chart's title is a site: a path and a method. It wraps at spaces, between words; only a
# single word wider than the card may be broken (`overflow-wrap: break-word`), never every word
# at the card's edge (`word-break: break-all`, which cut `LeakyCache#remember` in two).
RSpec.describe "trend chart titles" do
  html = DatadogHeap::TrendHtml

  it "wrap between words: no break-all in the card titles' rules" do
    rules = html::CSS[/^\.card h2, \.card h3 \{[^}]*\}/]
    expect(rules).not_to be_nil
    expect(rules).not_to include("break-all")
    expect(rules).to include("overflow-wrap: break-word", "word-break: normal")
    expect(html::CSS).not_to include("break-all")
  end

  it "keep the title as text, the full label in its tooltip" do
    label = "app/models/quote_cache.rb:12 in QuoteCache#fetch_remote_quotes via String#*"
    fields = {class_name: "String", location: label[/\A\S+/], label: label, times: [0.0, 60.0, 120.0],
              bytes: [100, 200, 300], objects: [1, 2, 3], stddevs: [0.0, 0.0, 0.0], slope: 100.0, stderr: 1.0,
              confidence: 0.99, relative: 1.0, verdict: :growing, unit: :bytes, intercept: 100.0, samples: [1, 2, 3]}
    trend = DatadogHeap::Profile::SiteTrend.new(*DatadogHeap::Profile::SiteTrend.members.map { |m| fields[m] })
    expect(html.card(trend)).to include(%(<h2 title="#{label}">#{label} <span class="meta">(String)</span></h2>))
  end
end
