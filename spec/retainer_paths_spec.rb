# frozen_string_literal: true

require "stringio"
require "tmpdir"
require "datadog_heap/cli"

# What the specs below keep their objects alive through.
module RetainerPathsSpec
  QUOTES = {}
  MEMO = {}
end

# Retainer paths as `why`, `report` and the HTML page show them: keys by class and size unless
# asked for their values, grouped by shape, with the share of the site's samples each holds.
RSpec.describe "retainer paths: redaction and shapes" do
  before { @rec = manual_recorder }

  after do
    RetainerPathsSpec::QUOTES.clear
    RetainerPathsSpec::MEMO.clear
  end

  let(:dir) { Dir.mktmpdir("retainer-paths") }

  after { FileUtils.remove_entry(dir) }

  def site(line)
    [["quote", "/spec/quoter.rb", line]]
  end

  # A cache keyed by the data it serves: an Array of currency, currency, amount, timestamp.
  def keep_keyed_by_data(count = 1, line: 1)
    count.times do |i|
      key = ["CHF", "GBP", "214.1#{i}", "170000000011#{i}"]
      RetainerPathsSpec::QUOTES[key] = value = "quote #{i} " * 10
      record(@rec, value, locations: site(line))
    end
    nil
  end

  # Objects that are themselves keys: the path ends in `key ...`.
  def keep_as_keys
    3.times do |i|
      RetainerPathsSpec::MEMO["session-token-#{i}-secret"] = i
    end
    RetainerPathsSpec::MEMO.each_key { |key| record(@rec, key, locations: site(2)) }
    nil
  end

  def commit_and_age
    @rec.commit
    GC.start
  end

  def run_cli(*args)
    out = StringIO.new
    err = StringIO.new
    code = DatadogHeap::CLI.new(out: out, err: err).run(args)
    [out.string, err.string, code]
  end

  describe "Recorder#retainers" do
    it "shows a Hash key by its class and size, not its value, unless values: true" do
      keep_keyed_by_data
      keep_as_keys
      commit_and_age
      paths = @rec.retainers(top: 10, per_site: 5).objects.select(&:alive?).map(&:path)
      expect(paths).to include("constant RetainerPathsSpec::QUOTES (Hash) -> [(Array of 4)] (String)")
      expect(paths).to include("constant RetainerPathsSpec::MEMO (Hash) -> key (String, 22 bytes) (String)")
      expect(paths.join("\n")).not_to include("GBP", "token")

      shown = @rec.retainers(top: 10, per_site: 5, values: true).objects.select(&:alive?).map(&:path)
      expect(shown).to include(%(constant RetainerPathsSpec::QUOTES (Hash) -> [["CHF", "GBP", "214.10", "1700000000110"]] (String)))
      expect(shown).to include(%(constant RetainerPathsSpec::MEMO (Hash) -> key "session-token-0-secret" (String)))
      expect { @rec.retainers(values: 1) }.to raise_error(TypeError, /values must be true or false, got 1/)
    end

    it "shows Symbols, small Integers, nil and module names as they are: the program's own identifiers" do
      namer = DatadogHeap::Retainers::Namer
      expect([:entry, 12, -1024, 1024, nil, true, String].map { |k| namer.key_text(k) })
        .to eq([":entry", "12", "-1024", "1024", "nil", "true", "String"])
      expect([1025, 1_700_000_000_114, 1.5, "ab", {a: 1}, Time.at(0)].map { |k| namer.key_text(k) })
        .to eq(["(Integer)", "(Integer)", "(Float)", "(String, 2 bytes)", "(Hash of 1)", "(Time)"])
    end

    it "writes redacted paths into the profile by default, and values only when asked" do
      keep_keyed_by_data
      commit_and_age
      plain = DatadogHeap::Profile.parse(@rec.profile(retainers: true)).samples.filter_map(&:retained_by)
      expect(plain).to eq(["constant RetainerPathsSpec::QUOTES (Hash) -> [(Array of 4)] (String)"])
      valued = DatadogHeap::Profile.parse(@rec.profile(retainers: {values: true})).samples.filter_map(&:retained_by)
      expect(valued.first).to include(%("GBP"))
    end
  end

  describe "Retainers::PathText" do
    let(:text) { DatadogHeap::Retainers::PathText }
    let(:valued) { %(constant QUOTER (Quoter) -> @memo (Hash) -> key ["CHF", "GBP", "214.14", "1700000000114"] (Array) -> [3] (String)) }

    it "reads a path's shape: keys and indexes as *" do
      expect(text.shape(valued)).to eq("constant QUOTER (Quoter) -> @memo (Hash) -> key * (Array) -> [*] (String)")
      expect(text.shape("global $x (Array) -> [12] (String)")).to eq("global $x (Array) -> [*] (String)")
      expect(text.shape("constant A (Hash) -> [(String, 5 bytes)] (Array)")).to eq("constant A (Hash) -> [*] (Array)")
      expect(text.shape("class Foo ivar @all (Array)")).to eq("class Foo ivar @all (Array)")
      expect(text.shape("the VM")).to eq("the VM")
    end

    it "redacts the keys of a path written with their values, keeping Array indexes and identifiers" do
      expect(text.redact(valued)).to eq("constant QUOTER (Quoter) -> @memo (Hash) -> key (Array) (Array) -> [3] (String)")
      expect(text.redact(%(constant C (Hash) -> ["token -> x"] (String)))).to eq("constant C (Hash) -> [(String, 10 bytes)] (String)")
      expect(text.redact("constant C (Hash) -> [1700000000114] (String)")).to eq("constant C (Hash) -> [(Integer)] (String)")
      expect(text.redact("global $x (Array) -> [5000] (String)")).to eq("global $x (Array) -> [5000] (String)")
      expect(text.redact("constant C (Hash) -> [:entry] (String)")).to eq("constant C (Hash) -> [:entry] (String)")
      expect(text.redact("constant C (Hash) -> [(Array of 4)] (String)")).to eq("constant C (Hash) -> [(Array of 4)] (String)")
      # A key whose text looks like the end of a step is still one key.
      tricky = %(constant C (Hash) -> ["a (String) -> b"] (String) -> @x (Foo))
      expect(text.redact(tricky)).to eq("constant C (Hash) -> [(String, 15 bytes)] (String) -> @x (Foo)")
      expect(text.shape(tricky)).to eq("constant C (Hash) -> [*] (String) -> @x (Foo)")
      expect(text.redact(%(constant C (Hash) -> [["q\\" (String) -> ", 1]] (Array) -> [0] (String))))
        .to eq("constant C (Hash) -> [(Array)] (Array) -> [0] (String)")
    end
  end

  describe "datadog-heap why" do
    it "groups paths by shape, with the share of the site's sampled objects each holds, and hides keys unless --values" do
      keep_keyed_by_data(4)
      commit_and_age
      path = File.join(dir, "heap.pb.gz")
      @rec.write_profile(path, retainers: {values: true, per_site: 3})
      out, err, code = run_cli("why", path)
      expect(code).to eq(0), err
      expect(out).to include("paths found for 3 of the site's 4 sampled objects (75%; 3 of its 4 live objects)\n")
      # The site's line, then its main shape (what a reader looks for first), then the rest.
      expect(out).to match(%r{^1\. .*/spec/quoter.rb:1 in quote\n   3 of 3 sampled \(100%\), 3 objects, \d+ B: constant RetainerPathsSpec::QUOTES})
      expect(out).to include("3 of 3 sampled (100%), 3 objects, ")
      expect(out).to include(": constant RetainerPathsSpec::QUOTES (Hash) -> [*] (String)")
      expect(out).to include("e.g. constant RetainerPathsSpec::QUOTES (Hash) -> [(Array)] (String)")
      expect(out.scan("RetainerPathsSpec::QUOTES").size).to eq(2) # one shape and its example, not three paths
      # The heading counts the sites it shows: "the top site's" for one, never "top 1 site'".
      one, = run_cli("why", path, "--top", "1")
      expect(one).to include("What keeps the top site's sampled objects alive")
      expect(one).not_to include("top 1 site'")
      expect(out).not_to include("GBP")

      out, err, code = run_cli("why", path, "--values")
      expect(code).to eq(0), err
      expect(out).to include(%(e.g. constant RetainerPathsSpec::QUOTES (Hash) -> [["CHF", "GBP"))
    end

    it "suggests the leak-hunt preset and DATADOG_HEAP_RETAINERS when a profile has no paths" do
      keep_keyed_by_data
      commit_and_age
      path = @rec.write_profile(File.join(dir, "plain.pb.gz"))
      out, err, code = run_cli("why", path)
      expect([out, code]).to eq(["", 1])
      expect(err).to include("has no retainer paths", "datadog-heap run --preset leak_hunt", "DATADOG_HEAP_PRESET=leak_hunt",
        "DATADOG_HEAP_RETAINERS=1")
    end
  end

  describe "datadog-heap report" do
    it "shows each top site's main holder in one line, and a section of them in the HTML page" do
      keep_keyed_by_data(3)
      commit_and_age
      path = File.join(dir, "heap.pb.gz")
      @rec.write_profile(path, retainers: {per_site: 3})
      out, err, code = run_cli("report", path)
      expect(code).to eq(0), err
      expect(out).to include("What keeps them alive (each site's main retainer path shape; `datadog-heap why` for all):")
      expect(out.lines).to include("  /spec/quoter.rb:1 in quote (String): constant RetainerPathsSpec::QUOTES (Hash) -> [*] (String) " \
        "(3 of 3 sampled objects with a path; 3 of 3 live objects)\n")

      plain = @rec.write_profile(File.join(dir, "plain.pb.gz"))
      expect(run_cli("report", plain)[0]).not_to include("What keeps them alive")

      # The endpoint's ?report=1 renders through CLI#write_report: the same line.
      io = StringIO.new
      DatadogHeap::CLI.new(out: io).write_report(DatadogHeap::Profile.load(path), app_root: "/app")
      expect(io.string).to include("What keeps them alive", ": constant RetainerPathsSpec::QUOTES (Hash) -> [*] (String) (3 of 3")

      page, err, code = run_cli("report", path, "--html")
      expect(code).to eq(0), err
      section = page[%r{<section id="retainers">.*?</section>}m]
      expect(section).to include("<h2>What keeps it alive</h2>", "<h3>/spec/quoter.rb:1 in quote (String)</h3>",
        %(3 of 3 sampled (100%), 3 objects, ), %(<span class="path">constant RetainerPathsSpec::QUOTES (Hash) -&gt; [*] (String)</span>),
        %(<div class="example">e.g. constant RetainerPathsSpec::QUOTES (Hash) -&gt; [(Array of 4)] (String)</div>),
        "paths found for 3 of the site&#39;s 3 sampled objects (100%; 3 of its 3 live objects)")
      # Only the page's plain tags, nothing that runs or fetches.
      expect(section.scan(/<([a-z0-9]+)/).flatten.uniq - %w[section h2 h3 p ul li span div]).to eq([])
      expect(run_cli("report", plain, "--html")[0]).not_to include(%(<section id="retainers">))
    end

    it "says when the top rows rest on few samples, and how many samples the leak-hunt preset would give" do
      helper = lambda do
        2.times { |i| RetainerPathsSpec::MEMO[i] = (s = "x" * 40) and record(@rec, s, weight: 4096, locations: site(5)) }
        nil
      end
      helper.call
      helper = nil
      commit_and_age
      path = @rec.write_profile(File.join(dir, "rough.pb.gz"))
      out, err, code = run_cli("report", path)
      expect(code).to eq(0), err
      expect(out).to include("Not conclusive: the top row rests on fewer than 5 samples.")
      expect(out).to include("`datadog-heap run --preset leak_hunt`", "would record about 64 samples for it " \
        "(8192 live objects / 128; 2 now)", "`datadog-heap trend`")
    end

    it "says nothing more when the leading rows are measured, and counts the rough ones when they lead" do
      keep = ->(line, count, weight) { count.times { RetainerPathsSpec::MEMO[[line, _1]] = (s = "y" * 40) and record(@rec, s, weight: weight, locations: site(line)) } }
      helper = lambda do
        (10..12).each { |line| keep.call(line, 8, 64) } # three measured sites: 8 samples each
        keep.call(13, 2, 8192) # one rough site, heavier than any of them
        nil
      end
      helper.call
      helper = nil
      commit_and_age
      out, err, code = run_cli("report", @rec.write_profile(File.join(dir, "measured.pb.gz")))
      expect(code).to eq(0), err
      expect(out).to include("~ rough: fewer than 5 samples")
      expect(out).not_to include("Not conclusive")

      RetainerPathsSpec::MEMO.delete_if { |(line, i), _| line == 11 || (line == 12 && i > 0) }
      helper = lambda do
        keep.call(14, 3, 4096) # a second rough site
        nil
      end
      helper.call
      helper = nil
      commit_and_age
      out, err, code = run_cli("report", @rec.write_profile(File.join(dir, "rough.pb.gz")), "--top", "3")
      expect(code).to eq(0), err
      expect(out).to include("Not conclusive: 2 of the top 3 rows rest on fewer than 5 samples.",
        "would record about 128 samples for the first of them (16384 live objects / 128; 2 now)")
    end
  end
end
