# frozen_string_literal: true

require "open3"
require "rbconfig"
require "tmpdir"

# A library-heavy program profiled as a new user would: `datadog-heap run -- rdoc ...`, where all
# the work happens under Ruby's own lib directory, none in "app" code. The report must still name
# the sites inside rdoc. rdoc documents this gem's lib/: a few seconds.
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

# The API reference's coverage check (.ci/api_docs.rb, `rake doc:coverage` in CI), on a copy of
# lib/ with documentation taken out: each gap is reported by name.
RSpec.describe "the API reference check (.ci/api_docs.rb)" do
  root = File.expand_path("..", __dir__)
  script = File.join(root, ".ci", "api_docs.rb")

  let(:dir) { Dir.mktmpdir("datadog-heap-api-docs") }

  after { FileUtils.remove_entry(dir) }

  # Runs the check on `lib` (with the extension loaded unless `static`).
  define_method(:check) do |lib, static: false|
    out, err, status = Open3.capture3(RbConfig.ruby, script, "--lib", lib, *(static ? ["--static"] : []))
    [out, err, status.exitstatus]
  end

  # Replaces `pattern` in `file` (under `lib`), which must match.
  def edit(lib, file, pattern, replacement = "")
    path = File.join(lib, file)
    text = File.read(path)
    expect(text).to match(pattern)
    File.write(path, text.sub(pattern, replacement))
  end

  it "passes lib/ as it is: every public class, method and attribute of the API is documented" do
    out, err, code = check(File.join(root, "lib"))
    expect([err.lines.grep_v(/Rails is not installed/).join, code]).to eq(["", 0])
    expect(out).to include("public methods and attributes are documented")
  end

  it "names an undocumented method, native method, Railtie setting, row member, the Testing module's mark, a phantom" do
    lib = File.join(dir, "lib")
    FileUtils.cp_r(File.join(root, "lib"), lib)
    edit(lib, "datadog_heap/profile.rb", /^ *# The `n` sites holding.*?(?=^ *def top)/m)
    edit(lib, "datadog_heap/recorder.rb", /^ *##\n *# :method: stats\n(?: *#.*\n)*/)
    edit(lib, "datadog_heap/recorder.rb", /^ *##\n(?= *# :method: stop\n)/, "    ##\n    # :method: vanished\n    # Documented, not defined.\n\n    ##\n")
    edit(lib, "datadog_heap/railtie.rb", /^ *#   config\.datadog_heap\.interval = .*\n/)
    edit(lib, "datadog_heap.rb", "For this gem's own specs and benchmarks only, not part of its API", "Switches")
    edit(lib, "datadog_heap/profile.rb", "`median_gen_age` is", "its age is")

    _, err, code = check(lib, static: true)
    expect(code).to eq(1)
    expect(err).to include("DatadogHeap::Profile#top: no comment",
      "DatadogHeap::Railtie: setting config.datadog_heap.interval is not in the class comment",
      "DatadogHeap::Testing: the comment must say it is for tests only")
    # RDoc alone cannot see a method the extension defines, nor Site's members (the extension
    # lists them): the loaded gem can.
    expect(err).not_to include("Recorder#stats")
    _, err, code = check(lib)
    expect(code).to eq(1)
    expect(err).to include("DatadogHeap::Recorder#stats: defined by the extension, no RDoc comment",
      "DatadogHeap::Profile#top: defined at ", "DatadogHeap::Profile::Site: the comment does not describe median_gen_age",
      "DatadogHeap::Recorder#vanished: documented, but DatadogHeap::Recorder has no such public method")
  end
end
