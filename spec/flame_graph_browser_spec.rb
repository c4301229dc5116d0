# frozen_string_literal: true

require_relative "spec_helper"
require "fileutils"
require "socket"
require "tmpdir"
require "datadog_heap/cli"
require "datadog_heap/middleware"
require_relative "fixtures/profiles"
require_relative "devtools_pipe"

# The flame graph's script, used as a person would in a real browser (Debian's chromium, driven
# through DevTools over a pipe, see DevtoolsPipe): a click on a frame zooms into it and the
# breadcrumb leads back out, typing in the search box marks frames and sums what they hold, the
# switch redraws by live objects, a link's fragment opens the same view, and a diff's frames are
# coloured by their growth. The endpoint's page runs under the endpoint's own
# Content-Security-Policy with no violation (and a policy with another hash does block it, so the
# check can fail).
RSpec.describe "the navigable flame graph in headless chromium" do
  include ProfileFixtures

  # Recorded before the page's own scripts: every CSP violation and every uncaught error.
  WATCH_PAGE = "window.__violations = []; window.__errors = [];" \
    "document.addEventListener('securitypolicyviolation', function (e) { window.__violations.push(e.violatedDirective + ' ' + e.blockedURI); });" \
    "window.addEventListener('error', function (e) { window.__errors.push(String(e.message)); });"
  # [index, class, x, width, title] of every frame drawn.
  FRAMES = "Array.from(document.querySelectorAll('svg.flame g.f')).map(function (g) { var r = g.querySelector('rect');" \
    "return [Number(g.getAttribute('data-i')), g.getAttribute('class'), Number(r.getAttribute('x')), Number(r.getAttribute('width')), " \
    "g.querySelector('title').textContent, r.getAttribute('fill')]; })"

  let(:dir) { Dir.mktmpdir("flame-browser") }
  let(:keep) { [] }

  before { skip "chromium is not installed (bin/setup --dev installs it; CI has it)" unless RecorderHelpers::CHROMIUM }

  after do
    @browser&.close
    @server&.close
    FileUtils.remove_entry(dir)
  end

  def browser
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
      "--disable-component-update", "--disable-sync", "--window-size=1400,1000", "--user-data-dir=#{Dir.mktmpdir("chromium", dir)}"]
    @browser ||= DevtoolsPipe.new([RecorderHelpers::CHROMIUM, *flags], File.join(dir, "chromium.log"))
  end

  # Serves the endpoint on 127.0.0.1 (an ephemeral port) from a thread: each request's path and
  # query go to `middleware` as a loopback request for a loopback Host. /tampered serves the
  # HTML page with another script hash in its policy. Returns the port.
  def serve(middleware)
    @server = TCPServer.new("127.0.0.1", 0)
    Thread.new do
      loop do
        client = @server.accept
        line = client.gets.to_s
        nil until ["\r\n", "\n", nil].include?(client.gets)
        path, query = line.split(" ")[1].to_s.split("?", 2)
        tampered = path == "/tampered"
        env = {"REQUEST_METHOD" => "GET", "PATH_INFO" => tampered ? "/debug/heap" : path, "QUERY_STRING" => query.to_s,
               "REMOTE_ADDR" => "127.0.0.1", "HTTP_HOST" => "127.0.0.1:#{@server.addr[1]}"}
        status, headers, body = middleware.call(env)
        headers = headers.merge("content-security-policy" => headers["content-security-policy"].sub(/sha256-[^']+/, "sha256-#{"A" * 43}=")) if tampered
        client.write("HTTP/1.1 #{status} X\r\n#{headers.map { |k, v| "#{k}: #{v}\r\n" }.join}connection: close\r\n\r\n#{body.join}")
        client.close
      rescue IOError, SystemCallError
        break
      end
    end
    @server.addr[1]
  end

  def frames
    browser.eval(FRAMES)
  end

  # The frame whose tooltip starts with `name`.
  def frame(name, drawn = frames)
    drawn.find { |f| f[4].start_with?(name) }
  end

  # The middle of the element `selector` (scrolled into view), in the page's coordinates.
  def middle(selector)
    browser.eval("(function () { var e = #{selector}; e.scrollIntoView({block: 'center'}); var r = e.getBoundingClientRect();" \
      "return [r.x + r.width / 2, r.y + r.height / 2]; })()")
  end

  def frame_rect(name)
    "Array.from(document.querySelectorAll('svg.flame g.f')).find(function (g) { return g.querySelector('title').textContent" \
      ".indexOf(#{name.to_json}) === 0; }).querySelector('rect')"
  end

  it "runs under the endpoint's policy: a click zooms and the breadcrumb zooms out, search marks and sums, objects redraw" do
    rec = recorder_with(keep.concat(mixed_objects))
    port = serve(DatadogHeap::Middleware.new(->(_) { [404, {}, []] }, recorder: rec))
    browser.open("http://127.0.0.1:#{port}/debug/heap?html=1", before: WATCH_PAGE)
    expect(browser.eval("window.__violations")).to eq([])
    expect(browser.eval("window.__errors")).to eq([])
    expect(browser.eval("document.querySelector('svg.flame').getAttribute('data-script')")).to eq("on")

    # As drawn at first: the cache's frame, 81% of live bytes, beside the buffer's and the JSON site's.
    whole = frames
    leaky = frame("LeakyCache#remember", whole)
    expect(leaky[3]).to be_within(15).of(1200 * 39.2 * 1024 / (39.2 * 1024 + 6000 + 3200))
    expect(frame("Buffer#push", whole)).not_to be_nil
    expect(browser.eval("document.getElementById('flame-crumbs').hidden")).to be(true)

    # A click on the cache's frame: it takes the whole width, its callers stay above it, the rest goes.
    browser.click(*middle(frame_rect("LeakyCache#remember")))
    zoomed = frames
    expect(frame("LeakyCache#remember", zoomed).values_at(1, 2, 3)).to eq(["f zoomed", 0, 1200])
    expect(frame("Buffer#push", zoomed)).to be_nil
    expect(frame("JSON::Ext::Parser#parse", zoomed)).to be_nil
    above = zoomed.select { |f| f[1].include?("above") }
    expect(above.map { |f| f[4].lines.first.chomp }).to match([a_string_starting_with("all: "), a_string_starting_with("<main>"),
      a_string_starting_with("Server#handle")])
    expect(above.map { |f| f[3] }).to eq([1200, 1200, 1200])
    crumbs = browser.eval("Array.from(document.querySelectorAll('#flame-crumbs button')).map(function (b) { return b.textContent; })")
    expect(crumbs.size).to eq(4)
    expect(crumbs.first).to eq("all")
    expect(crumbs.last).to start_with("LeakyCache#remember")
    expect(browser.eval("location.hash")).to eq("#zoom=#{leaky[0]}")

    # The breadcrumb's first button zooms back out.
    browser.click(*middle("document.querySelector('#flame-crumbs button')"))
    expect(frames.map { |f| f[0..3] }).to eq(whole.map { |f| f[0..3] })
    expect(browser.eval("location.hash")).to eq("")

    # Typed in the search box: the buffer's frame is marked, and what it holds is summed.
    browser.click(*middle("document.getElementById('flame-search')"))
    browser.type("buffer")
    found = frames
    expect(found.select { |f| f[1].include?("match") }.map { |f| f[4].lines.first }).to eq([frame("Buffer#push", found)[4].lines.first])
    share = frame("Buffer#push", found)[4][/(\d+\.\d)% of live bytes/, 1]
    expect(browser.eval("document.getElementById('flame-match').textContent")).to match(/\AMatched 1 frame: [\d.]+ KiB, #{share}% of live bytes\z/)
    browser.eval("document.getElementById('flame-search').value = 'no such frame'; document.getElementById('flame-search').dispatchEvent(new Event('input')); 1")
    expect(browser.eval("document.getElementById('flame-match').textContent")).to eq("No frame matches.")
    expect(frames.none? { |f| f[1].include?("match") }).to be(true)

    # By live objects: the buffer's 80 objects take most of the width, the cache's 4 little of it.
    browser.eval("var s = document.getElementById('flame-measure'); s.value = 'objects'; s.dispatchEvent(new Event('change')); 1")
    counted = frames
    expect(frame("all", counted)[4]).to include("100.0% of live objects")
    expect(frame("Buffer#push", counted)[3]).to be_within(0.2).of(1200.0 * 80 / 87)
    expect(frame("LeakyCache#remember", counted)[3]).to be_within(0.2).of(1200.0 * 4 / 87)
    expect(browser.eval("location.hash")).to eq("#search=no%20such%20frame&measure=objects")
    expect(browser.eval("window.__violations")).to eq([])
    expect(browser.eval("window.__errors")).to eq([])

    # With another hash in the policy, the browser refuses the script (so the check above can fail).
    browser.open("http://127.0.0.1:#{port}/tampered?html=1", before: WATCH_PAGE)
    expect(browser.eval("window.__violations")).to include(a_string_starting_with("script-src"))
    expect(browser.eval("document.querySelector('svg.flame').getAttribute('data-script')")).to be_nil
  end

  it "opens the view a link's fragment names: zoom, search and measure, from a file" do
    path = write_fixture(recorder_with(keep.concat(mixed_objects)), dir, "heap-4242-1.pb.gz")
    html = File.join(dir, "report.html")
    expect(cli_in_process("report", path, "--html", "--app-root", "/app", "--out", html)[2]).to eq(0)
    data = JSON.parse(File.read(html)[%r{<script type="application/json" id="flame-data">(.*?)</script>}m, 1])
    server = data["n"].index { |n| data["s"][n[1]].start_with?("Server#handle") }
    browser.open("file://#{html}#zoom=#{server}&search=leaky&measure=objects", before: WATCH_PAGE)
    drawn = frames
    expect(frame("Server#handle", drawn).values_at(1, 3)).to eq(["f zoomed", 1200])
    expect(frame("LeakyCache#remember", drawn).values_at(1, 3)).to eq(["f match", 1200])
    expect(frame("Buffer#push", drawn)).to be_nil
    expect(browser.eval("document.getElementById('flame-search').value")).to eq("leaky")
    expect(browser.eval("document.getElementById('flame-match').textContent")).to eq("Matched 1 frame: 4 objects, 4.6% of live objects")
    expect(browser.eval("window.__errors")).to eq([])
  end

  it "draws a diff: growth red, shrinkage blue, widths of the new profile or the old one" do
    before = strings_at(ProfileFixtures::CACHE_SITE, 2, bytes: 10_000) + strings_at(ProfileFixtures::JSON_SITE, 10, bytes: 2_000)
    after = strings_at(ProfileFixtures::CACHE_SITE, 8, bytes: 10_000) + strings_at(ProfileFixtures::JSON_SITE, 2, bytes: 2_000)
    keep.concat(before, after)
    old_path = write_fixture(recorder_with(before), dir, "heap-1-1.pb.gz")
    new_path = write_fixture(recorder_with(after), dir, "heap-1-2.pb.gz")
    html = File.join(dir, "diff.html")
    out, err, code = cli_in_process("diff", old_path, new_path, "--html", "--app-root", "/app", "--out", html)
    expect([out, err, code]).to eq(["wrote #{html}\n", "", 0])
    browser.open("file://#{html}", before: WATCH_PAGE)
    drawn = frames
    grew = frame("LeakyCache#remember", drawn)
    shrank = frame("JSON::Ext::Parser#parse", drawn)
    expect(grew[5]).to start_with("hsl(0,80%,")
    expect(shrank[5]).to start_with("hsl(215,75%,")
    expect(grew[4]).to match(/^bytes: 19\.\d KiB -> 78\.\d KiB \(\+58\.\d KiB\)$/)
    expect(shrank[4]).to match(/^bytes: 19\.\d KiB -> [34]\.\d KiB \(-1[56]\.\d KiB\)$/)
    new_width = grew[3]
    browser.eval("var s = document.getElementById('flame-side'); s.value = 'old'; s.dispatchEvent(new Event('change')); 1")
    expect(frame("LeakyCache#remember")[3]).to be < new_width / 1.5
    expect(frame("JSON::Ext::Parser#parse")[3]).to be > shrank[3] * 2
    expect(browser.eval("window.__errors")).to eq([])
  end
end
