# frozen_string_literal: true

require_relative "spec_helper"
require "json"
require "tmpdir"
require "datadog_heap/cli"
require "datadog_heap/report/report_html"
require_relative "fixtures/profiles"

# FlameGraph#data: the tree the page's script draws from (spec/flame_graph_browser_spec.rb uses
# it in a browser).
RSpec.describe DatadogHeap::FlameGraph do
  include ProfileFixtures

  let(:keep) { [] }
  let(:paths) { DatadogHeap::CLI::Paths.new(app_root: "/app", wide: false, width: nil) }

  def graph(objects, **opts)
    keep.concat(objects)
    profile = DatadogHeap::Profile.parse(recorder_with(objects).profile)
    described_class.new(profile, paths: paths, **opts)
  end

  def tree(flame)
    JSON.parse(flame.data)
  end

  # Stacks of `depth` frames under one root, each branching off at every level.
  def branching(count, depth)
    Array.new(count) do |i|
      site = Array.new(depth) { |d| ["M#{i % (d + 2)}#m#{d}", "/app/f#{d}.rb", i % (d + 3) + 1] }
      ["s" * (50 + i), site.freeze, 1, "String"]
    end
  end

  it "gives every node after its parent, with bytes and objects that sum up the tree" do
    data = tree(graph(mixed_objects))
    nodes = data["n"]
    expect(nodes.first[0]).to be_nil
    expect(data["s"][nodes.first[1]]).to start_with("all: ")
    nodes.each_with_index.drop(1).each { |n, i| expect(n[0]).to be < i }
    children = nodes.each_with_index.drop(1).group_by { |n, _| n[0] }
    children.each do |parent, kids|
      expect(kids.sum { |n, _| n[4] }).to be <= nodes[parent][4]
      expect(kids.sum { |n, _| n[5] }).to be <= nodes[parent][5]
    end
    expect(nodes.first[5]).to eq(4 + 80 + 3)
    labels = nodes.map { |n| data["s"][n[1]] }
    expect(labels).to include("LeakyCache#remember (leaky_cache.rb:17)", "Buffer#push (buffer.rb:8)")
    expect(data.values_at("measure", "sizes", "diff")).to eq(["bytes", true, false])
  end

  it "keeps the heaviest MAX_NODES nodes, each with its callers" do
    stub_const("DatadogHeap::FlameGraph::MAX_NODES", 40)
    data = tree(graph(branching(60, 6)))
    nodes = data["n"]
    expect(nodes.size).to eq(40)
    nodes.each_with_index.drop(1).each { |n, i| expect(n[0]).to be_between(0, i - 1) }
    # Nothing left out is heavier than what was kept (ties aside).
    stub_const("DatadogHeap::FlameGraph::MAX_NODES", 100_000)
    full = tree(graph(branching(60, 6)))["n"]
    expect(full.size).to be > 40
    expect(nodes.map { |n| n[4] }.min).to be >= full.map { |n| n[4] }.sort.reverse[39] - 1
  end

  it "cannot end its script block: every <, > and & is escaped, names included" do
    site = [["</script><script>alert(1)</script>", "/app/a&b.rb", 1]].freeze
    text = graph([["x" * 100, site, 1, "String"]]).data
    expect(text).not_to match(/[<>&]/)
    expect(JSON.parse(text)["s"]).to include("</script><script>alert(1)</script> (a&b.rb:1)")
  end

  it "carries both sides in a diff" do
    old = DatadogHeap::Profile.parse(recorder_with(keep.concat(strings_at(ProfileFixtures::CACHE_SITE, 2))).profile)
    flame = graph(strings_at(ProfileFixtures::CACHE_SITE, 6), base: old)
    root = tree(flame)["n"].first
    expect(root[5]).to eq(6)
    expect(root[7]).to eq(2)
    expect(root[4]).to be > root[6]
  end
end
