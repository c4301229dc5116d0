# frozen_string_literal: true

require "open3"
require "rbconfig"
require "tmpdir"

# A library-heavy program profiled as a new user would: `datadog-heap run -- rdoc ...`, where all
# the work happens under Ruby's own lib directory, none in "app" code. The report must still name
# the sites inside rdoc (issue 12). rdoc documents this gem's lib/: a few seconds.
RSpec.describe "datadog-heap on rdoc (a program whose work is all in the standard library)" do
  exe = File.expand_path("../exe/datadog-heap", __dir__)
  input = File.expand_path("../lib", __dir__)
  rdoc = ENV.fetch("PATH", "").split(File::PATH_SEPARATOR).map { |d| File.join(d, "rdoc") }.find { |f| File.executable?(f) }

  before do
    skip "rdoc is not installed (Debian: ruby, or ruby-rdoc)" unless rdoc
  end

  let(:dir) { Dir.mktmpdir("datadog-heap-rdoc") }

  after { FileUtils.remove_entry(dir) }

  # Where rdoc's own files are: the directory next to the rdoc.rb this Ruby loads.
  def rdoc_dir
    out, status = Open3.capture2(RbConfig.ruby, "-e", 'require "rdoc"; print $LOADED_FEATURES.find { |f| f.end_with?("/rdoc.rb") }')
    expect(status).to be_success
    out.delete_suffix(".rb") + "/"
  end

  # Runs the executable from `dir` (so the default app root holds nothing of rdoc's).
  define_method(:cli) do |*args|
    out, err, status = Open3.capture3(RbConfig.ruby, exe, *args, chdir: dir)
    [out, err, status.exitstatus]
  end

  # Column `index` of each row of the table headed by `header` (cells are two spaces apart and
  # have at most one inside).
  def column(out, header, index)
    lines = out.lines.map(&:chomp)
    start = lines.index { |l| l.lstrip.start_with?(header) }
    expect(start).not_to be_nil, "no table headed #{header.inspect} in:\n#{out}"
    lines.drop(start + 1).take_while { |l| !l.empty? }.map { |row| row.strip.split(/\s{2,}/)[index] }
  end

  it "reports at least 5 distinct sites inside rdoc's own files, each with its method" do
    profiles = File.join(dir, "prof")
    out, err, code = cli("run", "--out", profiles, "--sample-every", "64", "--interval", "0.5", "--top", "25", "--",
      rdoc, "-q", "--op", File.join(dir, "doc"), input)
    expect(out).to include("exited with status 0")
    expect(code).to eq(0), "exit #{code}\n#{out}\n#{err}"
    expect(File).to exist(File.join(dir, "doc", "index.html"))
    sites = column(out, "live bytes", 7)
    # rdoc's files are Ruby's library: shown as `stdlib rdoc/...` (see Profile.short_path).
    shown = DatadogHeap::Profile.short_path(rdoc_dir, app_root: dir)
    expect(shown).to eq("stdlib rdoc/")
    inside = sites.select { |site| site.start_with?(shown) }.uniq
    expect(inside.size).to be >= 5, "#{inside.size} sites in #{rdoc_dir}:\n#{out}"
    expect(inside).to all(match(%r{\A#{Regexp.escape(shown)}\S+\.rb:\d+ in \S}))
    # No site is the rdoc executable: the report names where the work happened.
    expect(sites.grep(/\A#{Regexp.escape(rdoc)}:/)).to be_empty

    # By gem, rdoc is there by name; and every profile of the run sums into one report.
    written = Dir.glob(File.join(profiles, "*.pb.gz"))
    expect(written.size).to be >= 1
    out, err, code = cli("report", "--group", "gem", "--top", "20", *written)
    expect([err, code]).to eq(["", 0])
    expect(out.lines.first).to start_with(written.size == 1 ? "#{written.first}: " : "#{written.size} profiles summed (")
    expect(column(out, "live bytes", 6)).to include(match(/\Ardoc( \(stdlib\))?\z/))

    # With rdoc's own directory as the app root, a site elsewhere says where rdoc called it from
    # (a path relative to that root; in full with --wide).
    out, err, code = cli("report", "--app-root", rdoc_dir, "--top", "50", "--wide", written.max)
    expect([err, code]).to eq(["", 0])
    callers = column(out, "live bytes", 8).compact
    expect(callers).not_to be_empty, out
    expect(callers).to all(start_with(rdoc_dir))
    out, = cli("report", "--app-root", rdoc_dir, "--top", "50", written.max)
    short = column(out, "live bytes", 8).compact
    expect(short.size).to eq(callers.size)
    short.zip(callers).each do |text, full|
      relative = full.delete_prefix(rdoc_dir)
      # Cut with … when the row is wider than 160 columns.
      expect(text.include?("…") ? relative.start_with?(text.split("…").first) : text == relative).to be(true), "#{text} / #{full}"
    end
  end
end
