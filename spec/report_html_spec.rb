# frozen_string_literal: true

require "fileutils"
require "json"
require "open3"
require "set"
require "stringio"
require "tmpdir"
require "zlib"
require "datadog_heap/cli"
require "datadog_heap/middleware"
require_relative "fixtures/profiles"

# `datadog-heap report --html` and the endpoint's ?html=1: one self-contained page with a flame
# graph, the top sites and classes, the profile's facts and notes, and the trend for a series.
# The page is rendered by a real headless browser (Debian's chromium; bin/setup --dev installs
# it), which must log no console error; a screenshot is kept in tmp/report-html.png.
RSpec.describe "datadog-heap report --html" do
  include ProfileFixtures

  REPORT_HTML_SCREENSHOT = File.expand_path("../tmp/report-html.png", __dir__)
  # The elements a page that fetches nothing is made of; its one script is FlameGraph::SCRIPT,
  # beside the flame graph's data block.
  REPORT_HTML_TAGS = %w[html head meta title style body h1 h2 h3 p section table thead tbody tr th td ul li div span
    svg g rect text line circle polyline footer nav label input select option button code br].freeze
  FLAME_DATA = %r{<script type="application/json" id="flame-data">[^<]*</script>}

  let(:dir) { Dir.mktmpdir("datadog-heap-html") }
  let(:keep) { [] }

  after { FileUtils.remove_entry(dir) }

  def profile_file(name, objects, **opts)
    keep.concat(objects)
    write_fixture(recorder_with(objects, **opts), dir, name)
  end

  # The page's markup that could run or fetch something: a tag outside REPORT_HTML_TAGS, an
  # attribute that is an event handler, a source or a link, a style that loads anything. Text
  # from a profile is escaped, so every `<` left starts a tag of the page's own.
  def active_markup(page)
    # The data block (every `<` in it escaped) and the script, as FlameGraph wrote it: once each.
    scripts = page.scan(%r{<script.*?</script>}m)
    known = ["<script>#{DatadogHeap::FlameGraph::SCRIPT}</script>"]
    unexpected = scripts.reject { |s| known.delete(s) || FLAME_DATA.match?(s) } + page.scan(FLAME_DATA).drop(1)
    page = page.gsub(%r{<script.*?</script>}m, "")
    # Attribute values emptied: a quote inside one is escaped (&quot;), so each ends at the next `"`.
    tags = page.scan(/<[^!\/][^>]*>/).map { |tag| tag.gsub(/"[^"]*"/, '""') }
    unexpected + tags.reject { |tag| REPORT_HTML_TAGS.include?(tag[/\A<([\w-]+)/, 1]) } +
      tags.grep(/\son\w+\s*=|\s(?:src|href|action|formaction)\s*=|javascript:/i) +
      page.scan(%r{<style>.*?</style>}m).grep(/url\(|@import/)
  end

  # The page's <section id="ID">.
  def section(page, id)
    page[%r{<section id="#{id}">.*?</section>}m] or raise "no section #{id} in:\n#{page}"
  end

  it "writes one self-contained page: facts, notes, flame graph, top sites with ± and samples, top classes" do
    path = profile_file("heap-4242-1.pb.gz", mixed_objects)
    page, err, code = cli_in_process("report", path, "--html", "--app-root", "/app")
    expect([err, code]).to eq(["", 0])
    expect(page).to start_with("<!DOCTYPE html>").and end_with("</html>\n")
    # Nothing to run, nothing to fetch: the only URL is SVG's namespace.
    expect(active_markup(page)).to eq([])
    expect(page.scan("<script").size).to eq(2)
    expect(page.scan(%r{https?://[^"\s]+}).uniq).to eq(["http://www.w3.org/2000/svg"])

    facts = section(page, "profile")
    expect(facts).to include("<th>File</th><td>#{path}</td>", "<th>Process</th><td>pid 4242</td>",
      "used 1 in 1024 allocations; asked the same", "heap-live-size (bytes)", "recorded: samples and ± per row")
    expect(facts).to match(/<th>Taken<\/th><td>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC/)
    expect(facts).to include("<li>datadog_heap: no full GC ran just before this profile")

    flame = section(page, "flame")
    expect(flame).to include("<h2>Live bytes by stack</h2>", '<svg class="flame"')
    titles = flame.scan(%r{<title>(.*?)</title>}m).flatten
    # The root, then one frame per distinct [frame, caller chain]: main.rb:3 holds the cache's
    # stack, whose width is its share of the live bytes.
    expect(titles.first).to match(/\Aall: [\d.]+ KiB\n[\d.]+ KiB, 87 objects, 100\.0% of live bytes\z/)
    remember = titles.find { |t| t.start_with?("LeakyCache#remember (leaky_cache.rb:17)") }
    expect(remember).to match(%r{\ALeakyCache#remember \(leaky_cache\.rb:17\)\n/app/leaky_cache\.rb:17\n39\.\d KiB, 4 objects, 8\d\.\d% of live bytes\z})
    expect(titles).to include(a_string_starting_with("JSON::Ext::Parser#parse (stdlib json/common.rb:216)\n"))
    rect = ->(name) { Float(flame[/<title>#{Regexp.escape(name)}.*?<rect x="[\d.]+" y="\d+" width="([\d.]+)"/m, 1]) }
    total = rect.call("all")
    expect(rect.call("LeakyCache#remember") / total).to be_within(0.01).of(39.2 * 1024 / (39.2 * 1024 + 6000 + 3200))

    sites = section(page, "sites")
    expect(sites).to include("<h2>Top 3 of 3 sites by live bytes</h2>")
    expect(sites).to include("<th>site</th>", "<th>called from</th>", '<th class="num">samples</th>', '<th class="num">±</th>')
    rows = sites.scan(%r{<tr[^>]*>(.*?)</tr>}m).flatten.drop(1).map { |r| r.scan(%r{<td[^>]*>(.*?)</td>}).flatten }
    expect(rows[0]).to eq([rows[0][0], "±0 B", "4", "4", rows[0][4], "String", rows[0][6],
      "leaky_cache.rb:17 in LeakyCache#remember", ""])
    expect(rows[1].last(2)).to eq(["stdlib json/common.rb:216 in JSON::Ext::Parser#parse", "api.rb:9 in Api#decode"])
    # The full path on hover.
    expect(sites).to include('title="/usr/lib/ruby/3.1.0/json/common.rb:216 in JSON::Ext::Parser#parse"')
    expect(rows[2].first(4)).to eq(["3.1 KiB", "±358 B", "80", "40"])

    classes = section(page, "classes")
    expect(classes).to include("<h2>Top 2 of 2 classes by live bytes</h2>", "<th>class</th>")
    expect(classes.scan(%r{<td[^>]*>([^<]*)</td></tr>}).flatten).to eq(["String", "Buffer::Chunk"])
  end

  it "marks rough rows, and ranks by objects when the profile has no sizes" do
    path = profile_file("heap.pb.gz", objects_at(ProfileFixtures::BUFFER_SITE, 2, weight: 300, class_name: "Chunk") +
      objects_at(ProfileFixtures::CACHE_SITE, 40), size_enabled: false)
    page, err, code = cli_in_process("report", path, "--html", "--app-root", "/app")
    expect([err, code]).to eq(["", 0])
    expect(section(page, "flame")).to include("<h2>Live objects by stack</h2>", "600 objects, 93.8% of live objects")
    sites = section(page, "sites")
    expect(sites).to include("<h2>Top 2 of 2 sites by live objects</h2>", '<tr class="rough">', "~600", "~ rough")
  end

  it "writes to --out, and refuses what does not make sense" do
    path = profile_file("heap.pb.gz", mixed_objects)
    html = File.join(dir, "report.html")
    out, err, code = cli_in_process("report", path, "--html", "--out", html)
    expect([out, err, code]).to eq(["wrote #{html}\n", "", 0])
    expect(File.read(html)).to include('<svg class="flame"')
    {["--out", html] => "--out PATH writes the HTML page: it needs --html",
     ["--html", "--why"] => "--why is for the text report",
     ["--html", "--out", ""] => "--out must not be empty"}.each do |args, message|
      out, err, code = cli_in_process("report", path, *args)
      expect([out, code]).to eq(["", 2]), args.join(" ")
      expect(err).to include(message)
    end
    expect(cli_in_process("report", "--help")[0]).to include("--html", "--out PATH", "--wide")
  end

  it "shows the latest of several profiles and the trend charts of all of them below its flame graph" do
    grow = []
    paths = (1..3).map do |i|
      grow.concat(strings_at(ProfileFixtures::CACHE_SITE, 40, weight: 4))
      sleep 0.01
      profile_file("heap-77-#{i}.pb.gz", grow + strings_at(ProfileFixtures::BUFFER_SITE, 50, weight: 4), sample_every: 4)
    end
    page, err, code = cli_in_process("report", *paths.reverse, "--html", "--app-root", "/app")
    expect([err, code]).to eq(["", 0])
    expect(section(page, "profile")).to include("3 profiles; the flame graph and tables are of the latest, #{paths.last}")
    expect(page.index('<section id="trend">')).to be > page.index('<section id="flame">')
    trend = section(page, "trend")
    expect(trend).to include("<h2>Trend over 3 profiles</h2>", "growing", 'class="trend"')
    expect(trend.scan("<svg").size).to eq(2)
    expect(trend).to include('<h3 title="/app/leaky_cache.rb:17 in LeakyCache#remember">leaky_cache.rb:17 in LeakyCache#remember')

    # Profiles that cannot make a trend (the same time) still give the page, saying why.
    page, err, code = cli_in_process("report", paths.first, paths.first, "--html")
    expect([err, code]).to eq(["", 0])
    expect(section(page, "trend")).to include("No trend over these 2 profiles:", "same time")
  end

  # A profile is data from anywhere: its names must reach the page as text, never as markup.
  describe "a profile whose names are markup or terminal controls" do
    evil = ["<script>alert(1)</script>", "\"><img src=x onerror=alert(1)>", "\e[2J"]

    # pprof's Profile message: string_table is field 6, comment (indexes into it) field 13.
    def varint(n)
      bytes = []
      loop do
        byte = n & 0x7f
        n >>= 7
        bytes << (n.zero? ? byte : byte | 0x80)
        break if n.zero?
      end
      bytes.pack("C*")
    end

    def strings_in(raw)
      pos = 0
      count = 0
      read = lambda do
        value = 0
        shift = 0
        loop do
          byte = raw.getbyte(pos)
          pos += 1
          value |= (byte & 0x7f) << shift
          shift += 7
          break if byte < 0x80
        end
        value
      end
      while pos < raw.bytesize
        key = read.call
        case key & 7
        when 0 then read.call
        when 1 then pos += 8
        when 2
          length = read.call # before `pos +=` reads pos
          pos += length
        when 5 then pos += 4
        end
        count += 1 if key >> 3 == 6
      end
      count
    end

    # The gzip pprof `bytes` with `comments` added (repeated fields may come in any order).
    def with_comments(bytes, comments)
      raw = Zlib.gunzip(bytes)
      first = strings_in(raw)
      added = comments.map { |c| varint(6 << 3 | 2) + varint(c.bytesize) + c.b }.join +
        comments.each_index.map { |i| varint(13 << 3) + varint(first + i) }.join
      Zlib.gzip(raw + added)
    end

    it "are escaped everywhere: frames, files, classes, comments and the file name, in text, titles and attributes" do
      name = evil.join(" ")
      site = [["Evil#{name}#run", "/app/#{name}.rb", 7], ["<main>", "/srv/gems/x-1.0/lib/#{name}.rb", 1]].freeze
      rec = recorder_with(keep.concat(Array.new(6) { [Object.new, site, 1, "Klass#{name}"] }))
      earlier = File.join(dir, "earlier.pb.gz")
      File.binwrite(earlier, with_comments(rec.profile, ["note #{name}"]))
      sleep 0.01
      path = File.join(dir, "#{evil[1]}.pb.gz")
      File.binwrite(path, with_comments(rec.profile, ["note #{name}"]))
      expect(DatadogHeap::Profile.load(path).comments).to include("note #{name}")

      # One profile; and two, whose trend charts name the site too.
      pages = [cli_in_process("report", path, "--html", "--app-root", "/app")[0], cli_in_process("report", earlier, path, "--html", "--wide")[0]]
      expect(section(pages[1], "trend")).to include('<svg class="trend"', "Evil&lt;script&gt;")
      pages.each do |page|
        expect(page).to include("</html>")
        evil.each { |text| expect(page).not_to include(text) }
        expect(active_markup(page)).to eq([])
        expect(page).not_to match(/[\u0000-\u0009\u000b-\u001f\u007f-\u009f]/)
        # Shown as text: in the facts, the notes, the sites and classes, the flame graph's labels and titles.
        expect(page).to include("&lt;script&gt;alert(1)&lt;/script&gt;", "&quot;&gt;&lt;img src=x onerror=alert(1)&gt;", "\\e[2J")
        expect(page).to include("<li>note &lt;script&gt;")
        expect(page).to include("Klass&lt;script&gt;", "Evil&lt;script&gt;")
      end
      expect(pages[0]).to include("title=\"/app/&lt;script&gt;", "x-1.0 &lt;script&gt;")
    end
  end

  describe "the endpoint's ?html=1" do
    let(:recorder) { DatadogHeap::Recorder.new(sample_every: 1) }
    let(:app) { ->(_env) { [200, {}, ["the app"]] } }

    after { recorder.stop }

    def request(query)
      env = {"REQUEST_METHOD" => "GET", "PATH_INFO" => "/debug/heap", "QUERY_STRING" => query,
             "REMOTE_ADDR" => "127.0.0.1", "SERVER_NAME" => "localhost", "SERVER_PORT" => "80"}
      status, headers, body = DatadogHeap::Middleware.new(app, recorder: recorder).call(env)
      [status, headers, body.to_a.join]
    end

    # Allocations the recorder saw during a request.
    def recorded_during
      before = recorder.stats[:lifetime_recordings_attempted]
      result = yield
      [recorder.stats[:lifetime_recordings_attempted] - before, result]
    end

    it "serves the page as text/html with a policy that allows only its own script and style, its work never sampled" do
      recorder.start
      40.times { keep << "kept #{keep.size}" * 3 }
      GC.start
      pprof, = recorded_during { request("") }
      html, (status, headers, body) = recorded_during { request("html=1&top=3") }
      expect(status).to eq(200), body
      # The page takes thousands of allocations; inside DatadogHeap.own_work, none is sampled.
      expect(html).to be < pprof + 10
      expect(headers).to include("content-type" => "text/html; charset=utf-8", "content-length" => body.bytesize.to_s,
        "x-content-type-options" => "nosniff")
      # The one inline style and the one inline script, by hash; nothing inline beside them.
      policy = headers["content-security-policy"]
      expect(policy.split("; ")).to eq(["default-src 'none'", "script-src 'sha256-#{Digest::SHA256.base64digest(DatadogHeap::FlameGraph::SCRIPT)}'",
        "style-src 'sha256-#{Digest::SHA256.base64digest(body[%r{<style>(.*?)</style>}m, 1])}'", "base-uri 'none'",
        "form-action 'none'", "frame-ancestors 'none'"])
      expect(body.scan(%r{<script>(.*?)</script>}m).flatten).to eq([DatadogHeap::FlameGraph::SCRIPT])
      expect(body).not_to match(/\sstyle=/)
      expect(body).to include('<svg class="flame"', "<h2>Top ", "<th>Process</th><td>pid #{Process.pid}</td>")
      expect(body).to include(File.basename(__FILE__))
      expect(active_markup(body)).to eq([])
      {"html=maybe" => 'html must be 1 or true, 0 or false, got "maybe"', "html=1&report=1" => "pick one",
       "html=1&wide=2" => 'wide must be 1 or true, 0 or false, got "2"', "workers=1" => "workers= shapes the report: it needs report=1 or html=1",
       "html=1&zoom=3" => 'unknown parameter "zoom"'}.each do |query, message|
        status, _, body = request(query)
        expect([status, body]).to match([400, a_string_including(message)]), query
      end
      expect(request("report=1&wide=1")[2]).to include(File.expand_path(__FILE__))
    end
  end

  it "renders in headless chromium without console errors, flame graph and tables in its DOM (screenshot in tmp/)" do
    skip "chromium is not installed (bin/setup --dev installs it; CI has it)" unless RecorderHelpers::CHROMIUM

    # A real profile: this process, recording every allocation while it builds a cache, parses
    # JSON and fills a Set; what stays alive is in it.
    recorder = DatadogHeap::Recorder.new(sample_every: 1)
    recorder.start
    kept = ReportHtmlSpecWork.run
    recorder.stop
    GC.start
    path = recorder.write_profile(File.join(dir, "heap-#{Process.pid}-1.pb.gz"))
    html = File.join(dir, "report.html")
    expect(cli_in_process("report", path, "--html", "--out", html)[2]).to eq(0)
    expect(kept.size).to eq(3)

    FileUtils.mkdir_p(File.dirname(REPORT_HTML_SCREENSHOT))
    FileUtils.rm_f(REPORT_HTML_SCREENSHOT)
    browser = [RecorderHelpers::CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
      "--disable-background-networking", "--disable-component-update", "--disable-sync",
      "--user-data-dir=#{Dir.mktmpdir("chromium", dir)}", "--enable-logging=stderr", "--v=0", "--window-size=1280,1800"]
    _, log, status = Open3.capture3(*browser, "--screenshot=#{REPORT_HTML_SCREENSHOT}", "file://#{html}")
    expect(status.success?).to be(true), log
    expect(File.size(REPORT_HTML_SCREENSHOT)).to be > 20_000
    puts "\n  report --html screenshot: #{REPORT_HTML_SCREENSHOT}"
    dom, log2, status = Open3.capture3(*browser, "--dump-dom", "file://#{html}")
    expect(status.success?).to be(true), log2
    # The browser parsed the flame graph (frames with their tooltips) and both tables.
    expect(dom).to include('<svg class="flame"', "<title>all: ")
    expect(dom.scan(/<g class="f" data-i="\d+">/).size).to be > 10
    expect(dom).to match(%r{<section id="sites">\s*<h2>Top 10 of \d+ sites by live bytes</h2>\s*<table class="rows">})
    expect(dom).to include("ReportHtmlSpecWork.cache", "<section id=\"classes\">")
    expect(dom).not_to match(/<img/)
    # The script ran and drew the graph again: the controls are shown.
    expect(dom).to include('<svg class="flame"', 'data-script="on"', '<div class="flame-controls" id="flame-controls">')
    # Console messages are logged as `CONSOLE(line)] "message"` (or "Uncaught ..."); none.
    console = (log + log2).lines.grep(/CONSOLE|Uncaught|SyntaxError/)
    expect(console).to eq([])
  end
end

# What the browser spec's profile records: a cache of strings, parsed JSON, a Set.
module ReportHtmlSpecWork
  module_function

  def run
    [cache, documents, names]
  end

  def cache
    Array.new(300) { |i| "entry #{i} " * 20 }
  end

  def documents
    text = JSON.generate(Array.new(40) { |i| {"id" => i, "name" => "item #{i}", "tags" => %w[a b c]} })
    Array.new(5) { JSON.parse(text) }
  end

  def names
    Set.new(Array.new(200) { |i| "name-#{i}" })
  end
end
