# frozen_string_literal: true

require "tmpdir"
require "open3"
require "fileutils"
require "datadog_heap/cli"
require_relative "fixtures/profiles"

# `datadog-heap trend --html`: the page is rendered by a real headless browser (Debian's chromium;
# bin/setup --dev installs it), which must log no console error, and a screenshot is kept in tmp/.
RSpec.describe "datadog-heap trend --html" do
  include ProfileFixtures

  TREND_HTML_SCREENSHOT = File.expand_path("../tmp/trend-html-screenshot.png", __dir__)

  # Three profiles: the cache site grows, the buffer site stays.
  def write_series(dir)
    keep = []
    (1..3).map do |i|
      keep.concat(strings_at(ProfileFixtures::CACHE_SITE, 40, weight: 4))
      rec = recorder_with(keep + strings_at(ProfileFixtures::BUFFER_SITE, 50, weight: 4), sample_every: 4)
      sleep 0.01
      rec.write_profile(File.join(dir, "heap-#{i}.pb.gz"))
    end
  end

  it "prints the growing site first with its slope, and writes a self-contained page" do
    Dir.mktmpdir do |dir|
      paths = write_series(dir)
      html = File.join(dir, "trend.html")
      out, err, code = cli_in_process("trend", *paths, "--all", "--app-root", "/app", "--html", html)
      expect([code, err]).to eq([0, ""])
      lines = out.lines
      expect(lines[0]).to start_with("3 profiles over ").and include("2 sites, 1 growing, 0 shrinking, 1 steady")
      rows = lines.grep(/LeakyCache|Buffer/)
      # Files under the app root are shown relative to it.
      expect(rows[0]).to match(%r{\Agrowing\s+\+[\d.]+ (B|KiB|MiB)/min\s+[\d.]+%.*  leaky_cache\.rb:17 in LeakyCache#remember$})
      expect(rows[1]).to match(%r{\Asteady\s.*  buffer\.rb:8 in Buffer#push$})
      expect(out).to include("wrote #{html}")
      page = File.read(html)
      expect(page.scan("<svg").size).to eq(2)
      expect(page).to include("LeakyCache#remember", "growing")
      # Self-contained: nothing to fetch, no script.
      expect(page).not_to match(/<script|<link|src=|url\(|@import/i)
      expect(page.scan(%r{https?://[^"\s]+}).uniq).to eq(["http://www.w3.org/2000/svg"])
    end
  end

  it "explains what it needs" do
    out, err, code = cli_in_process("trend", "only-one.pb.gz")
    expect(code).to eq(2)
    expect(out).to eq("")
    expect(err).to include("trend needs at least 2 profiles, got 1")
    expect(cli_in_process("trend", "--help")[0]).to include("--html OUT", "--all", "--group KIND")
    expect(cli_in_process("trend", "a", "b", "--html", "")[1]).to include("--html must not be empty")
  end

  it "renders in headless chromium without console errors (screenshot in tmp/)" do
    skip "chromium is not installed (bin/setup --dev installs it; CI has it)" unless RecorderHelpers::CHROMIUM

    Dir.mktmpdir do |dir|
      html = File.join(dir, "trend.html")
      expect(cli_in_process("trend", *write_series(dir), "--app-root", "/app", "--html", html)[2]).to eq(0)
      FileUtils.mkdir_p(File.dirname(TREND_HTML_SCREENSHOT))
      FileUtils.rm_f(TREND_HTML_SCREENSHOT)
      browser = [RecorderHelpers::CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--user-data-dir=#{dir}/chromium",
        "--enable-logging=stderr", "--v=0", "--window-size=1000,700"]
      _, log, status = Open3.capture3(*browser, "--screenshot=#{TREND_HTML_SCREENSHOT}", "file://#{html}")
      expect(status.success?).to be(true), log
      expect(File.size(TREND_HTML_SCREENSHOT)).to be > 10_000
      puts "\n  trend --html screenshot: #{TREND_HTML_SCREENSHOT}"
      dom, log2, status = Open3.capture3(*browser, "--dump-dom", "file://#{html}")
      expect(status.success?).to be(true), log2
      # The browser parsed both charts and the page's text.
      expect(dom.scan("<svg").size).to eq(2)
      expect(dom).to include("LeakyCache#remember")
      # Console messages are logged as `CONSOLE(line)] "message"` (or "Uncaught ..."); none.
      console = (log + log2).lines.grep(/CONSOLE|Uncaught|SyntaxError/)
      expect(console).to eq([])
    end
  end
end
