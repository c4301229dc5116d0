# frozen_string_literal: true

require "io/console"
require "pty"
require "rbconfig"
require "stringio"
require "tmpdir"
require "datadog_heap/cli"
require_relative "fixtures/profiles"

# How reports show files: gems as `NAME-VERSION path`, Ruby's library as `stdlib path`, app code
# relative to the app root (Profile.short_path, the core's short_path), and tables cut with … to
# fit a terminal (CLI::Paths); --wide shows them as the profile holds them.
RSpec.describe "short paths in reports" do
  include ProfileFixtures

  let(:dir) { Dir.mktmpdir("datadog-heap-paths") }
  let(:keep) { [] }

  after { FileUtils.remove_entry(dir) }

  it "names this Ruby's own library and its gems as they are installed here" do
    short = ->(path) { DatadogHeap::Profile.short_path(path) }
    expect(short.call(File.join(RbConfig::CONFIG["rubylibdir"], "json/common.rb"))).to eq("stdlib json/common.rb")
    expect(short.call(File.join(RbConfig::CONFIG["archdir"], "etc.so"))).to eq("stdlib etc.so")
    if (vendor = RbConfig::CONFIG["vendordir"]) && !vendor.empty?
      expect(short.call(File.join(vendor, "rubygems/request_set.rb"))).to eq("vendor_ruby rubygems/request_set.rb")
    end
    spec = Gem.loaded_specs.fetch("rspec-core")
    expect(short.call(File.join(spec.full_gem_path, "lib/rspec/core/runner.rb"))).to eq("#{spec.full_name} rspec/core/runner.rb")
    # The default app root is the current directory.
    expect(short.call(File.join(Dir.pwd, "lib/datadog_heap.rb"))).to eq("lib/datadog_heap.rb")
    expect(DatadogHeap::Profile.short_path("/srv/app/models/user.rb", app_root: "/srv/app")).to eq("models/user.rb")
    expect(DatadogHeap::Profile.library_of("/srv/app/models/user.rb", app_root: ["/srv/app"])).to eq("app")
    expect(short.call("<internal:kernel>")).to eq("<internal:kernel>")
    expect { DatadogHeap::Profile.short_path(:x) }.to raise_error(TypeError, "path must be a String, got :x (Symbol)")
  end

  it "keeps the machine-readable fields whole: location, label, called_from, library" do
    rack = [["Rack::Utils#escape", "/srv/vendor/bundle/ruby/3.1.0/gems/rack-3.0.8/lib/rack/utils.rb", 40],
      ["Api#call", "/app/api.rb", 20]]
    path = write_fixture(recorder_with(keep.concat(strings_at(rack, 2))), dir, "heap.pb.gz")
    site = DatadogHeap::Profile.load(path).top(1, app_root: "/app").first
    expect(site).to have_attributes(location: "/srv/vendor/bundle/ruby/3.1.0/gems/rack-3.0.8/lib/rack/utils.rb:40",
      label: "/srv/vendor/bundle/ruby/3.1.0/gems/rack-3.0.8/lib/rack/utils.rb:40 in Rack::Utils#escape",
      called_from: "/app/api.rb:20 in Api#call", library: "rack")
    paths = DatadogHeap::CLI::Paths.new(app_root: "/app")
    expect(paths.label(site, :site)).to eq("rack-3.0.8 rack/utils.rb:40 in Rack::Utils#escape")
    expect(paths.called_from(site)).to eq("api.rb:20 in Api#call")
    expect(paths.frame("Api#call", "/app/api.rb", 20)).to eq("Api#call (api.rb:20)")
    wide = DatadogHeap::CLI::Paths.new(app_root: "/app", wide: true)
    expect([wide.label(site, :site), wide.called_from(site), wide.width]).to eq([site.label, site.called_from, nil])
  end

  it "cuts a site's end when its file:line fits, else its middle, never past the width" do
    cut = DatadogHeap::CLI::Paths.method(:cut)
    site = "rack-3.0.8 rack/utils.rb:40 in Rack::Utils#escape via String#*"
    expect(cut.call(site, 80)).to eq(site)
    expect(cut.call(site, 40)).to eq("rack-3.0.8 rack/utils.rb:40 in Rack::Ut…")
    long = "actionpack-7.1.3 action_dispatch/middleware/debug_exceptions.rb:28 in call"
    expect(cut.call(long, 30)).to eq("actionpack-7.1.….rb:28 in call")
    [1, 2, 3, 10, 29, 60].each { |w| expect(cut.call(long, w).size).to eq(w) }
  end

  it "fits the terminal's width when stdout is one, and cuts nothing otherwise" do
    deep = [["Deeply::Nested::Module::WithAVeryLongClassName#and_a_method_with_a_long_name_too",
      "/srv/vendor/bundle/ruby/3.1.0/gems/some-very-long-gem-name-1.2.3/lib/some/very/long/path/to/a/file.rb", 1234],
      ["Api#call", "/app/api.rb", 20]]
    path = write_fixture(recorder_with(keep.concat(strings_at(deep, 3) + strings_at(ProfileFixtures::CACHE_SITE, 2))), dir,
      "heap.pb.gz")
    exe = File.expand_path("../exe/datadog-heap", __dir__)
    out = +""
    PTY.open do |master, slave|
      slave.winsize = [24, 130]
      pid = Process.spawn(RbConfig.ruby, exe, "report", path, "--app-root", "/app", out: slave, err: slave)
      slave.close
      begin
        loop { out << master.readpartial(4096) }
      rescue EOFError, Errno::EIO
        nil # the child closed the terminal
      end
      Process.wait(pid)
    end
    lines = out.force_encoding(Encoding::UTF_8).split("\r\n")
    table = lines.drop(lines.index { |l| l.start_with?("live bytes") }).take_while { |l| !l.empty? }
    expect(table.map(&:size).max).to eq(130)
    # The site is cut (its file:line alone is too long to keep: the middle goes); its caller fits.
    expect(table[1]).to match(/  some-very-long-gem-\S*…\S*_long_name_too  api\.rb:20 in Api#call\z/)
    expect(table[2]).to end_with("  leaky_cache.rb:17 in LeakyCache#rememb…")

    cli = ->(*args) { StringIO.new.tap { |io| DatadogHeap::CLI.new(out: io).run(["report", path, "--app-root", "/app", *args]) }.string }
    rows = cli.call.lines.map(&:chomp).drop_while { |l| !l.start_with?("live bytes") }.take_while { |l| !l.empty? }
    # Not a terminal (a pipe, a file, the endpoint): short paths, nothing cut.
    expect(rows.join).not_to include("…")
    expect(rows[1]).to include("some-very-long-gem-name-1.2.3 some/very/long/path/to/a/file.rb:1234 in #{deep[0][0]}")
    expect(cli.call("--wide")).to include(deep[0][1], "#{deep[0][0]}  /app/api.rb:20 in Api#call")
  end
end
