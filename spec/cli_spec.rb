# frozen_string_literal: true

require "open3"
require "rbconfig"
require "stringio"
require "tmpdir"
require "zlib"
require "datadog_heap/cli"
require_relative "fixtures/profiles"

RSpec.describe "datadog-heap (exe/datadog-heap)" do
  exe = File.expand_path("../exe/datadog-heap", __dir__)
  script = File.expand_path("fixtures/leaky_script.rb", __dir__)
  leak_line = File.readlines(script).index { |l| l.include?("# the leak") } + 1
  # Where the script's cache makes the one Array that holds every leaked string.
  cache_line = File.readlines(script).index { |l| l.include?("@entries = []") } + 1

  # Runs the executable as a user would; returns [stdout, stderr, exit code].
  define_method(:cli) do |*args, env: {}|
    out, err, status = Open3.capture3(env, RbConfig.ruby, exe, *args)
    [out, RecorderHelpers.without_incidental(err), status.exitstatus]
  end

  # The same, in this process (faster, for the output checks).
  # The data rows of a table (the lines after its header).
  def rows(out, header)
    lines = out.lines.map(&:chomp)
    start = lines.index { |l| l.lstrip.start_with?(header) }
    expect(start).not_to be_nil, "no table headed #{header.inspect} in:\n#{out}"
    lines.drop(start + 1).take_while { |l| !l.empty? }
  end

  # Lines a Ruby backtrace would print.
  def backtrace_lines(text)
    text.lines.grep(/\.rb:\d+:in |^\s+from /)
  end

  let(:dir) { Dir.mktmpdir("datadog-heap-cli") }
  let(:keep) { [] }

  after { FileUtils.remove_entry(dir) }

  # A profile of `objects` (kept alive for the example) written to dir/name.
  def profile_file(name, objects, **opts)
    keep.concat(objects)
    write_fixture(recorder_with(objects, **opts), dir, name)
  end

  describe "--help" do
    it "describes the tool and every command, on stdout, with exit 0" do
      out, err, code = cli("--help")
      expect([err, code]).to eq(["", 0])
      expect(out).to start_with("Usage: datadog-heap COMMAND")
      expect(out).to include("report", "diff", "run")
      %w[report diff run].each do |command|
        out, err, code = cli(command, "--help")
        expect([err, code]).to eq(["", 0])
        expect(out).to start_with("Usage: datadog-heap #{command}")
        expect(out).to include("--top N")
        expect(cli_in_process("help", command)).to eq([out, "", 0])
      end
      expect(cli("report", "--help")[0]).to include("--by KEY", "--group KIND", "--by-site", "--app-root DIR", "FILE...")
      expect(cli("diff", "--help")[0]).to include("OLD... -- NEW...", "--group KIND", "--app-root DIR")
      expect(cli("run", "--help")[0]).to include("--out DIR", "--interval S", "--sample-every N", "-- CMD...")
      expect(cli_in_process("--version")).to eq(["datadog-heap #{DatadogHeap::VERSION}\n", "", 0])
    end
  end

  describe "usage errors" do
    it "exit 2 with a message on stderr and nothing on stdout" do
      {
        [] => /Usage: datadog-heap COMMAND/,
        ["frobnicate"] => /unknown command "frobnicate"/,
        ["help", "frobnicate"] => /unknown command "frobnicate"/,
        ["report"] => /report needs at least one profile FILE, got 0 arguments/,
        ["report", "--top", "3"] => /report needs at least one profile FILE, got 0 arguments/,
        ["report", "a", "--top", "0"] => /--top must be at least 1, got 0/,
        ["report", "a", "--top", "many"] => /--top must be a whole number, got "many"/,
        ["report", "a", "--by", "bytes"] => /--by must be one of size, count, got "bytes"/,
        ["report", "a", "--frob"] => /invalid option: --frob/,
        ["report", "a", "--group", "method"] => /--group must be one of site, location, file, gem, class, got "method"/,
        ["report", "a", "--app-root", ""] => /--app-root must not be empty/,
        ["diff", "a"] => /diff needs two profiles, OLD and NEW, got 1 argument \(to sum several on each side: diff OLD... -- NEW...\)/,
        ["diff", "a", "b", "c"] => /diff needs two profiles, OLD and NEW, got 3 arguments/,
        ["diff", "a", "b", "--"] => /diff needs at least one NEW profile after --/,
        ["diff", "--", "b"] => /diff needs at least one OLD profile before --/,
        ["diff", "a", "--", "b", "--group", "gems"] => /--group must be one of site, location, file, gem, class, got "gems"/,
        ["run", "--group", "x", "--", "ruby"] => /--group must be one of site, location, file, gem, class, got "x"/,
        ["run"] => /run needs a command to run after --/,
        ["run", "--interval", "0", "--", "ruby"] => /--interval must be a number of seconds > 0, got 0.0/,
        ["run", "--sample-every", "0", "--", "ruby"] => /--sample-every must be between 1 and/,
      }.each do |args, message|
        out, err, code = cli_in_process(*args)
        expect([out, code]).to eq(["", 2]), "datadog-heap #{args.join(" ")}: #{out}#{err}"
        expect(err).to match(message)
      end
      out, err, code = cli("report")
      expect([out, code]).to eq(["", 2])
      expect(err).to eq("datadog-heap: report needs at least one profile FILE, got 0 arguments\n" \
        "Run `datadog-heap report --help` for usage.\n")
    end
  end

  describe "report" do
    it "tables the top sites: live bytes, objects, share, class, median age, site, called from" do
      path = profile_file("heap.pb.gz", mixed_objects)
      out, err, code = cli("report", path, "--app-root", "/app/")
      expect([err, code]).to eq(["", 0])
      expect(out.lines.first).to match(%r{\A#{Regexp.escape(path)}: [\d.]+ KiB in 87 live objects at 3 sites, sampled 1 in 1024 allocations$})
      expect(out).to include("Top 3 of 3 sites by live bytes:")
      expect(out).to match(/^live bytes +± +live objects  samples  share  class +median age  site +called from$/)
      table = rows(out, "live bytes")
      expect(table.size).to eq(3)
      # Files under the app root are shown relative to it, Ruby's library as `stdlib PATH`.
      expect(table[0]).to match(%r{\A\s*39\.\d KiB\s+±0 B\s+4\s+4\s+\d\d\.\d%\s+String\s+\d+\s+leaky_cache\.rb:17 in LeakyCache#remember\z})
      # The json site is in the standard library: the app frame that called it is the second column.
      expect(table[1]).to match(%r{\A\s*[\d.]+ KiB\s+±0 B\s+3\s+3\s+\d+\.\d%\s+String\s+\d+\s+stdlib json/common\.rb:216 in JSON::Ext::Parser#parse\s+api\.rb:9 in Api#decode\z})
      expect(table[2]).to match(%r{\A\s*3\.1 KiB\s+±358 B\s+80\s+40\s+\d+\.\d%\s+Buffer::Chunk\s+\d+\s+buffer\.rb:8 in Buffer#push\z})

      # --wide: the paths as the profile holds them.
      out, err, code = cli_in_process("report", path, "--app-root", "/app/", "--wide")
      expect([err, code]).to eq(["", 0])
      wide = rows(out, "live bytes")
      expect(wide[0]).to end_with("  /app/leaky_cache.rb:17 in LeakyCache#remember")
      expect(wide[1]).to end_with("  /usr/lib/ruby/3.1.0/json/common.rb:216 in JSON::Ext::Parser#parse  /app/api.rb:9 in Api#decode")

      # The default app root is the current directory, which holds none of these files: no
      # called-from column at all.
      out, err, code = cli_in_process("report", path)
      expect([err, code]).to eq(["", 0])
      expect(out).not_to include("called from")
      expect(rows(out, "live bytes")[1]).to match(%r{String\s+\d+  stdlib json/common\.rb:216 in JSON::Ext::Parser#parse\z})
    end

    it "ranks by live objects with --by count, and shows --top N rows" do
      path = profile_file("heap.pb.gz", mixed_objects)
      out, err, code = cli_in_process("report", path, "--by", "count", "--top", "1")
      expect([err, code]).to eq(["", 0])
      expect(out).to include("Top 1 of 3 sites by live objects:")
      table = rows(out, "live bytes")
      expect(table.size).to eq(1)
      expect(table[0]).to match(%r{\A\s*3\.1 KiB\s+±358 B\s+80\s+40\s+92\.0%\s+Buffer::Chunk\s+\d+\s+/app/buffer\.rb:8 in Buffer#push\z})
    end

    it "groups by location, file, gem or class with --group, and back by site with --by-site" do
      path = profile_file("heap.pb.gz", mixed_objects +
        strings_at([["LeakyCache#remember", "/app/leaky_cache.rb", 18], ["<main>", "/app/main.rb", 3]], 1, bytes: 7_000) +
        strings_at([["Rack::Utils#escape", "/srv/vendor/bundle/ruby/3.1.0/gems/rack-3.0.8/lib/rack/utils.rb", 40],
          ["Api#call", "/app/api.rb", 20]], 2, bytes: 100))
      group = lambda do |*args|
        out, err, code = cli_in_process("report", path, "--app-root", "/app", *args)
        expect([err, code]).to eq(["", 0])
        [out, rows(out, "live bytes").map { |row| row.strip.split(/\s{2,}/).drop(2) }]
      end

      out, table = group.call("--group", "file")
      expect(out).to include("at 4 files", "Top 4 of 4 files by live bytes:")
      expect(out).to match(/^live bytes +± +live objects  samples  share  median age  file$/)
      expect(table.map(&:last)).to eq(["leaky_cache.rb", "stdlib json/common.rb", "buffer.rb", "rack-3.0.8 rack/utils.rb"])
      expect(table.map(&:first)).to eq(%w[5 3 80 2]) # live objects

      _, table = group.call("--group", "location", "--top", "2")
      expect(table.map(&:last)).to eq(["leaky_cache.rb:17 in LeakyCache#remember", "leaky_cache.rb:18 in LeakyCache#remember"])

      out, table = group.call("--group", "gem")
      expect(out).to include("at 3 gems")
      expect(table.map(&:last)).to eq(["app", "json (stdlib)", "rack"])
      expect(table.map { |row| row[0] }).to eq(%w[85 3 2]) # live objects

      out, table = group.call("--group", "class", "--by", "count")
      expect(out).to include("Top 2 of 2 classes by live objects:")
      expect(table.map(&:last)).to eq(["Buffer::Chunk", "String"])
      expect(table.map { |row| row[0] }).to eq(%w[80 10])

      out, table = group.call("--group", "gem", "--by-site")
      expect(out).to include("at 5 sites")
      expect(table.first[3]).to eq("String")
    end

    it "sums several profiles, saying how many" do
      one = profile_file("one.pb.gz", mixed_objects)
      two = profile_file("two.pb.gz", strings_at(ProfileFixtures::CACHE_SITE, 2, bytes: 10_000))
      three = profile_file("three.pb.gz", objects_at(ProfileFixtures::BUFFER_SITE, 3, class_name: "Buffer::Chunk"))
      out, err, code = cli("report", one, two, three)
      expect([err, code]).to eq(["", 0])
      expect(out.lines.first).to match(/\A3 profiles summed \(#{Regexp.escape(one)}, #{Regexp.escape(two)}, #{Regexp.escape(three)}\): [\d.]+ KiB in 92 live objects at 3 sites, sampled 1 in 1024 allocations$/)
      table = rows(out, "live bytes")
      expect(table[0]).to match(%r{\A\s*58\.\d KiB\s+±0 B\s+6\s.*String\s+\d+\s+/app/leaky_cache\.rb:17 in LeakyCache#remember\z})
      expect(table[2]).to match(%r{\A\s*[\d.]+ KiB\s+±[\d.]+ B\s+83\s.*Buffer::Chunk})

      four = profile_file("four.pb.gz", strings_at(ProfileFixtures::CACHE_SITE, 1))
      out, = cli_in_process("report", one, two, three, four)
      expect(out.lines.first).to start_with("4 profiles summed (#{one}, #{two}, ... 2 more): ")

      # A profile without sizes makes the sum one without sizes.
      sizeless = profile_file("sizeless.pb.gz", strings_at(ProfileFixtures::CACHE_SITE, 1), size_enabled: false)
      out, err, code = cli_in_process("report", one, sizeless)
      expect([err, code]).to eq(["", 0])
      expect(out).to include("2 profiles summed", ": 88 live objects at 3 sites",
        "(these profiles have no sizes: sites are ranked by live objects)")
    end

    it "says when a profile has no sizes, and ranks by objects" do
      path = profile_file("heap.pb.gz", mixed_objects, size_enabled: false)
      out, err, code = cli_in_process("report", path)
      expect([err, code]).to eq(["", 0])
      expect(out).to include("87 live objects at 3 sites", "(this profile has no sizes: sites are ranked by live objects)",
        "sites by live objects:")
      expect(rows(out, "live bytes")[0]).to match(%r{\A\s*-\s+±9\s+80\s+40\s+92\.0%\s+Buffer::Chunk\s+\d+\s+/app/buffer\.rb:8 in Buffer#push\z})
    end

    it "says when a profile holds nothing" do
      path = write_fixture(recorder_with([]), dir, "empty.pb.gz")
      out, err, code = cli_in_process("report", path)
      expect([err, code]).to eq(["", 0])
      expect(out).to include("0 B in 0 live objects at 0 sites", "No live objects in this profile.")
    end

    it "exits 1 with the path and the reason on stderr, without a backtrace, for a file that is not a profile" do
      garbage = File.join(dir, "garbage.pb.gz")
      File.write(garbage, "this is not a profile\n")
      out, err, code = cli("report", garbage)
      expect([out, code]).to eq(["", 1])
      expect(err).to start_with("datadog-heap: #{garbage} is not a readable pprof profile (22 bytes): ")
      expect(err.lines.size).to eq(1)
      expect(backtrace_lines(err)).to be_empty

      # A million empty samples ("\x12\x00": field 2, length 0), from a file of a few kB.
      bomb = File.join(dir, "bomb.pb.gz")
      File.binwrite(bomb, Zlib.gzip("\x12\x00".b * 1_000_000, level: Zlib::BEST_COMPRESSION))
      out, err, code = cli("report", bomb, env: {"DATADOG_HEAP_MAX_PROFILE_BYTES" => "50000000"})
      expect([out, code]).to eq(["", 1])
      expect(err).to start_with("datadog-heap: #{bomb} is not a readable pprof profile (#{File.size(bomb)} bytes): pprof: " \
        "reading this profile needs more memory than the limit of 50000000 bytes: its 1000000 samples, ")
      expect(err).to end_with("set the environment variable DATADOG_HEAP_MAX_PROFILE_BYTES to a larger number of bytes\n")
      expect(backtrace_lines(err)).to be_empty

      missing = File.join(dir, "missing.pb.gz")
      out, err, code = cli("report", missing)
      expect([out, err, code]).to eq(["", "datadog-heap: cannot read profile #{missing}: No such file or directory\n", 1])

      out, err, code = cli("report", "")
      expect([out, err, code]).to eq(["", "datadog-heap: path must not be empty\nRun `datadog-heap report --help` for usage.\n", 2])
    end
  end

  describe "diff" do
    let(:old_path) { profile_file("old.pb.gz", mixed_objects) }

    it "ranks the growing sites by live size growth, with absolute and relative change" do
      grown = mixed_objects.reject { |_, site, _, _| site == ProfileFixtures::BUFFER_SITE } +
        strings_at(ProfileFixtures::CACHE_SITE, 12, bytes: 10_000) +
        strings_at([["Fresh#site", "/app/fresh.rb", 1]], 2, bytes: 1_000)
      new_path = profile_file("new.pb.gz", grown)
      out, err, code = cli("diff", old_path, new_path)
      expect([err, code]).to eq(["", 0])
      expect(out.lines.first).to match(/\A#{Regexp.escape(old_path)} -> #{Regexp.escape(new_path)}: live bytes [\d.]+ KiB -> [\d.]+ KiB \(\+[\d.]+ KiB\)$/)
      expect(out).to include("2 of 4 sites grew, 2 beyond their noise (|growth| > 2 sd):")
      table = rows(out, "growth")
      expect(table.size).to eq(2) # the json site did not change, the buffer site vanished
      expect(table[0]).to match(%r{\A\+117\.\d KiB\s+±0 B\s+\+300\.0%\s+39\.\d KiB\s+156\.\d KiB\s+\+12\s+4 -> 16\s+yes\s+String\s+/app/leaky_cache\.rb:17 in LeakyCache#remember\z})
      expect(table[1]).to match(%r{\A\s*\+2\.\d KiB\s+±0 B\s+new\s+0 B\s+2\.\d KiB\s+\+2\s+0 -> 2\s+yes\s+String\s+/app/fresh\.rb:1 in Fresh#site\z})

      out, err, code = cli_in_process("diff", old_path, new_path, "--top", "1")
      expect([err, code]).to eq(["", 0])
      expect(out).to include("2 of 4 sites grew, 2 beyond their noise (|growth| > 2 sd); the 1 largest growth:")
      expect(rows(out, "growth").size).to eq(1)
    end

    it "says so when no site grew" do
      out, err, code = cli_in_process("diff", old_path, old_path)
      expect([err, code]).to eq(["", 0])
      expect(out).to include("No site grew: live size did not increase at any of the 3 sites.")
    end

    it "compares live objects when a profile has no sizes" do
      new_path = profile_file("new.pb.gz", mixed_objects + objects_at(ProfileFixtures::BUFFER_SITE, 5, class_name: "Buffer::Chunk"),
        size_enabled: false)
      out, err, code = cli_in_process("diff", old_path, new_path)
      expect([err, code]).to eq(["", 0])
      expect(out).to include("live objects 87 -> 92 (+5)", "(a profile has no sizes: sites are compared by live objects)",
        "1 of 3 sites grew, 0 beyond its noise (|growth| > 2 sd):")
      expect(rows(out, "growth")[0]).to match(%r{\A\s*\+5\s+±13\s+\+6\.[23]%\s+80\s+85\s+40 -> 45\s+no\s+Buffer::Chunk\s+/app/buffer\.rb:8 in Buffer#push\z})
    end

    it "sums the profiles before -- into OLD and the ones after it into NEW" do
      worker1 = profile_file("w1-old.pb.gz", strings_at(ProfileFixtures::CACHE_SITE, 2, bytes: 1_000))
      worker2 = profile_file("w2-old.pb.gz", strings_at(ProfileFixtures::CACHE_SITE, 1, bytes: 1_000))
      worker1_new = profile_file("w1-new.pb.gz", strings_at(ProfileFixtures::CACHE_SITE, 3, bytes: 1_000))
      worker2_new = profile_file("w2-new.pb.gz", strings_at(ProfileFixtures::CACHE_SITE, 4, bytes: 1_000) +
        strings_at(ProfileFixtures::JSON_SITE, 2, bytes: 500))
      out, err, code = cli("diff", worker1, worker2, "--top", "5", "--", worker1_new, worker2_new, "--app-root", "/app")
      expect([err, code]).to eq(["", 0])
      expect(out.lines.first).to start_with("2 profiles summed (#{worker1}, #{worker2}) -> " \
        "2 profiles summed (#{worker1_new}, #{worker2_new}): live bytes ")
      expect(out).to include("2 of 2 sites grew, 2 beyond their noise (|growth| > 2 sd):")
      table = rows(out, "growth")
      expect(table[0]).to match(%r{\A\s*\+[\d.]+ KiB\s+±0 B\s+\+13[23]\.\d%\s+[\d.]+ KiB\s+[\d.]+ KiB\s+\+4\s+3 -> 7\s+yes\s+String\s+leaky_cache\.rb:17 in LeakyCache#remember\z})
      # Wider than 160 columns, and not cut: stdout is not a terminal (short_paths_spec cuts on one).
      expect(table[1]).to match(%r{\A\s*\+[\d.]+ KiB\s+±0 B\s+new\s+0 B\s+[\d.]+ KiB\s+\+2\s+0 -> 2\s+yes\s+String\s+stdlib json/common\.rb:216 in JSON::Ext::Parser#parse  api\.rb:9 in Api#decode\z})
      expect(table[1].size).to be > 160

      out, err, code = cli_in_process("diff", worker1, "--", worker1_new, worker2_new, "--group", "gem")
      expect([err, code]).to eq(["", 0])
      expect(out.lines.first).to start_with("#{worker1} -> 2 profiles summed")
      expect(out).to include("2 of 2 gems grew, 2 beyond their noise (|growth| > 2 sd):")
      expect(rows(out, "growth").map { |row| row.split(/\s{2,}/).last }).to eq(["(other)", "json (stdlib)"])
    end

    it "exits 1 on an unreadable profile" do
      out, err, code = cli("diff", old_path, File.join(dir, "nope.pb.gz"))
      expect([out, code]).to eq(["", 1])
      expect(err).to match(/cannot read profile .*nope\.pb\.gz: No such file or directory/)
    end
  end

  # A profile is data from anywhere: names in it must not reach the terminal as control sequences.
  describe "names holding terminal control characters" do
    evil = "\e[2J\e]0;owned\a"
    shown = "\\e[2J\\e]0;owned\\x07"
    site = [["Evil#{evil}#run", "/app/evil#{evil}.rb", 7], ["<main>", "/app/main.rb", 1]].freeze
    klass = "Klass\u009b31m\x7f#{evil}"
    # Any C0 control but the newline, DEL, or a C1 control.
    raw_control = /[\u0000-\u0009\u000b-\u001f\u007f-\u009f]/

    it "are shown escaped by report, diff, trend, why and the endpoint's report, never raw" do
      stub_const("CliSpecEvilCache", Module.new)
      CliSpecEvilCache.const_set(:CACHE, Array.new(8) { Object.new })
      old = profile_file("old.pb.gz", CliSpecEvilCache::CACHE.first(2).map { |o| [o, site, 1, klass] })
      rec = recorder_with(CliSpecEvilCache::CACHE.map { |o| [o, site, 1, klass] })
      new = rec.write_profile(File.join(dir, "new.pb.gz"), retainers: true)

      # Cut to fit (the escaped names are long) and in full with --wide.
      [["report", new], ["report", new, "--why"], ["diff", old, new], ["trend", old, new], ["why", new]].each do |args|
        [args, args + ["--wide"]].each do |argv|
          out, err, code = cli_in_process(*argv)
          expect(code).to eq(0), "#{argv.first}: #{err}"
          expect(out + err).not_to match(raw_control), "#{argv.join(" ")} printed a control character:\n#{(out + err).inspect}"
          expect(out).to include("Klass\\u009B31m\\x7F#{shown}"), argv.join(" ")
          expect(out).to include("Evil#{shown}#run"), argv.join(" ") if argv.include?("--wide")
        end
      end
      expect(cli_in_process("why", new)[0]).to include("constant CliSpecEvilCache::CACHE (Array)")

      io = StringIO.new
      DatadogHeap::CLI.new(out: io).write_report(DatadogHeap::Profile.load(new), wide: true)
      expect(io.string).not_to match(raw_control)
      expect(io.string).to include("/app/evil#{shown}.rb:7")
    end

    it "escapes C0, DEL and C1 controls and stray bytes with one helper, and nothing else" do
      escape = DatadogHeap::CLI::SafeText.method(:escape)
      expect(escape.call(evil)).to eq(shown)
      expect(escape.call("a\tb\nc\rd\0e\x7f\u0085\u009f")).to eq('a\tb\nc\rd\x00e\x7F\u0085\u009F')
      expect(escape.call("caf\u00e9 \u65e5\u672c /app/x.rb:1 #<Class:0x1>")).to eq("caf\u00e9 \u65e5\u672c /app/x.rb:1 #<Class:0x1>")
      expect(escape.call("bad \xff\e".b)).to eq('bad \xFF\e')
      expect(DatadogHeap::CLI::SafeText.escape_lines("one\e\ntwo\a\n")).to eq("one\\e\ntwo\\x07\n")
    end
  end

  describe "messages" do
    it "name a bad option value once, with the choices there are" do
      _, err, code = cli_in_process("report", "a", "--top", "0")
      expect(code).to eq(2)
      expect(err).to start_with("datadog-heap: --top must be at least 1, got 0\n")
      expect(err).not_to include("--top --top")
      expect(cli_in_process("why", "a", "--by", "age")[1]).to start_with(%(datadog-heap: --by must be one of size, count, got "age"\n))
      expect(cli_in_process("report", "a", "--group", "foo")[1])
        .to start_with(%(datadog-heap: --group must be one of site, location, file, gem, class, got "foo"\n))
      expect(cli_in_process("diff", "a")[1]).to include("got 1 argument (to sum")
      expect(cli_in_process("diff", "a", "b", "c")[1]).to include("got 3 arguments")
    end

    it "say which file could not be written, in plain words" do
      profile = profile_file("heap.pb.gz", strings_at([["make", "/app/a.rb", 1]], 3))
      nowhere = File.join(dir, "no-such-dir", "page.html")
      out, err, code = cli("report", profile, "--html", "--out", nowhere)
      expect([out, err, code]).to eq(["", "datadog-heap: cannot write #{nowhere}: No such file or directory\n", 1])
      later = profile_file("later.pb.gz", strings_at([["make", "/app/a.rb", 1]], 4))
      out, err, code = cli("trend", profile, later, "--html", nowhere)
      expect(err).to end_with("datadog-heap: cannot write #{nowhere}: No such file or directory\n")
      expect(code).to eq(1), out
      expect(err).not_to include("rb_sysopen")
      error = begin
        File.open(nowhere)
      rescue SystemCallError => e
        e
      end
      expect(error.message).to include("@ rb_sysopen")
      expect(DatadogHeap::CLI.plain_message(error)).to eq("#{nowhere}: No such file or directory")
    end
  end

  describe "run" do
    it "profiles a Ruby program through datadog_heap/auto and reports its last profile, leak on top" do
      out, err, code = cli("run", "--out", dir, "--sample-every", "64", "--interval", "0.2", "--top", "3", "--",
        RbConfig.ruby, script, env: {"LEAK_SECONDS" => "0.5", "DATADOG_HEAP_MAX_OVERHEAD" => "none"})
      expect(code).to eq(0), "exit #{code}\n#{out}\n#{err}"
      expect(backtrace_lines(err)).to be_empty
      pid = out[/^pid (\d+) kept/, 1]
      profiles = Dir.children(dir).sort_by { |f| f[/-(\d+)\.pb\.gz/, 1].to_i }
      expect(profiles).to all(match(/\Aheap-#{pid}-\d+\.pb\.gz\z/))
      expect(profiles.size).to be >= 2 # periodic ones and the final one
      expect(out).to include("exited with status 0; #{profiles.size} profiles in #{dir}",
        "#{File.join(dir, profiles.last)}: ", "sampled 1 in 64 allocations")
      table = rows(out, "live bytes")
      expect(table.size).to be_between(1, 3)
      # The leak is on top by live bytes, save for one thing: the cache's Array, allocated once, is
      # sampled about 1 run in 64, and then stands for 64 Arrays as big as itself (8 bytes per kept
      # string, 64 times over: more than the strings). Only that one sampled Array may come first.
      # The script is under the current directory, the default app root: no called-from.
      # The script is under the current directory (the app root): shown relative to it.
      shown = Regexp.escape(script.delete_prefix("#{Dir.pwd}/"))
      leak_row = /\A\s*[\d.]+ [KM]iB\s+±[\d.]+ (?:[KM]i)?B\s+\d+\s+\d+\s+\d+\.\d%\s+String\s+\d+\s+#{shown}:#{leak_line} in LeakyCache#remember via String#\*\z/
      cache_row = /\A\s*~[\d.]+ [KM]iB\s+±[\d.]+ [KM]iB\s+64\s+1\s+\d+\.\d%\s+Array\s+\d+\s+#{shown}:#{cache_line} in initialize\z/
      leak_at = table.index { |row| row.match?(leak_row) }
      expect(leak_at).not_to be_nil, "the leak #{script}:#{leak_line} is not among the top sites:\n#{out}"
      expect(table.first(leak_at)).to all(match(cache_row)), "only the cache's Array may outrank the leak:\n#{out}"
      expect(leak_at).to be <= 1
      # By live objects, where one Array weighs 64, the leak is first, and stands for what the script kept.
      kept = Integer(out[/^pid \d+ kept (\d+)/, 1])
      by_count = DatadogHeap::Profile.load(File.join(dir, profiles.last)).top(1, by: :count).first
      expect(by_count).to have_attributes(class_name: "String", location: "#{script}:#{leak_line}")
      expect(by_count.live_objects).to be_between(kept / 2, kept * 3 / 2)
    end

    it "sums the last profile of each process when the program forks" do
      out, err, code = cli("run", "--out", dir, "--sample-every", "64", "--", RbConfig.ruby, script,
        env: {"LEAK_SECONDS" => "0.3", "FORK_CHILD" => "1"})
      expect(code).to eq(0), "exit #{code}\n#{out}\n#{err}"
      parent = Integer(out[/^pid (\d+) kept/, 1])
      child = Integer(out[/^child (\d+)/, 1])
      kept = Integer(out[/^pid \d+ kept (\d+)/, 1])
      expect(Dir.children(dir).sort).to eq(["heap-#{child}-1.pb.gz", "heap-#{parent}-1.pb.gz"].sort)
      expect(out).to include("; 2 profiles in #{dir}; the last of each of 2 processes, summed:", "2 profiles summed (")
      # The child inherited the parent's cache and added to it: the sum holds both.
      sum = DatadogHeap::Profile.merge(Dir.glob(File.join(dir, "*.pb.gz")).map { |f| DatadogHeap::Profile.load(f) })
      leak = sum.top(1, by: :count).first
      expect(leak).to have_attributes(location: "#{script}:#{leak_line}", function: "LeakyCache#remember")
      expect(leak.live_objects).to be > kept * 3 / 2
      expect(out).to match(/^2 profiles summed \(.*\): [\d.]+ MiB in #{sum.total_objects} live objects/)
    end

    it "exits with the program's status, and 1 when it cannot start the command" do
      out, err, code = cli("run", "--out", dir, "--", RbConfig.ruby, "-e", "exit 3")
      expect(code).to eq(3), err
      expect(out).to include("`#{RbConfig.ruby} -e 'exit 3'` exited with status 3; 1 profile in #{dir}",
        "No live objects in this profile.")

      tmp = Dir.mktmpdir("cli-tmp")
      out, err, code = cli("run", "--", File.join(dir, "no-such-command"), env: {"TMPDIR" => tmp})
      expect([out, code]).to eq(["", 1])
      expect(err).to match(/\Adatadog-heap: cannot run `.*no-such-command`: No such file or directory\n\z/)
      expect(Dir.children(tmp)).to be_empty # the temporary directory it made for profiles is gone
    ensure
      FileUtils.remove_entry(tmp) if tmp
    end

    it "passes --preset leak_hunt, --retainers, --values and --gc to the program through the environment" do
      show = "print ENV.values_at('DATADOG_HEAP_PRESET', 'DATADOG_HEAP_RETAINERS', 'DATADOG_HEAP_GC').inspect"
      out, err, code = cli("run", "--out", dir, "--preset", "leak_hunt", "--retainers", "--gc", "--", RbConfig.ruby, "-e", show)
      expect(code).to eq(0), err
      expect(out).to start_with(%(["leak_hunt", "1", "1"]))
      out, err, code = cli("run", "--out", dir, "--retainers", "--values", "--", RbConfig.ruby, "-e", show)
      expect(code).to eq(0), err
      expect(out).to start_with(%([nil, "values", nil]))
      expect(cli_in_process("run", "--preset", "fast", "--", "ruby")[1]).to include(%(--preset must be one of leak_hunt, got "fast"))
      expect(cli_in_process("run", "--values", "--", "ruby")[1]).to include("--values shows keys in retainer paths: it needs --retainers")
      expect(cli("run", "--help")[0]).to include("--preset NAME", "--retainers", "--gc", "--values")
    end

    it "writes each profile after a full GC with --gc, and with keys as they are with --retainers --values" do
      program = "$keep = {}; 20_000.times { |i| $keep['key-%d' % i] = 'v' * 60 }"
      out, err, code = cli("run", "--out", dir, "--sample-every", "64", "--gc", "--retainers", "--values", "--",
        RbConfig.ruby, "-e", program, env: {"DATADOG_HEAP_MAX_OVERHEAD" => "none"})
      expect(code).to eq(0), err
      profile = DatadogHeap::Profile.load(Dir.glob(File.join(dir, "heap-*.pb.gz")).max)
      expect(profile.comments).to include(a_string_including("a full GC ran just before this profile"))
      expect(profile.samples.filter_map(&:retained_by)).to include(a_string_matching(/\Aglobal \$keep \(Hash\) -> \["key-\d+"\] \(String\)\z/))
      expect(out).to include("What keeps them alive")

      FileUtils.rm_f(Dir.glob(File.join(dir, "heap-*.pb.gz")))
      _, err, code = cli("run", "--out", dir, "--sample-every", "64", "--retainers", "--", RbConfig.ruby, "-e", program,
        env: {"DATADOG_HEAP_MAX_OVERHEAD" => "none"})
      expect(code).to eq(0), err
      profile = DatadogHeap::Profile.load(Dir.glob(File.join(dir, "heap-*.pb.gz")).max)
      expect(profile.comments).to include(a_string_including("no full GC ran just before this profile"))
      labels = profile.samples.filter_map(&:retained_by)
      expect(labels).to include(a_string_matching(/\Aglobal \$keep \(Hash\) -> \[\(String, \d bytes\)\] \(String\)\z/))
      expect(labels.join).not_to include("key-")
    end

    it "writes profiles with retainer paths under --preset leak_hunt, which `why` reads" do
      program = "$keep = Array.new(20_000) { |i| 'kept %d' % i }"
      out, err, code = cli("run", "--out", dir, "--preset", "leak_hunt", "--", RbConfig.ruby, "-e", program)
      expect(code).to eq(0), err
      expect(out).to include("What keeps them alive")
      last = Dir.glob(File.join(dir, "heap-*.pb.gz")).max
      out, err, code = cli("why", last)
      expect(code).to eq(0), err
      expect(out).to include("global $keep (Array) -> [*] (String)")
    end

    it "says so when the command wrote no profile (not a Ruby program)" do
      out, err, code = cli("run", "--out", dir, "--", "true")
      expect([out, code]).to eq(["", 1])
      expect(err).to include("no profile was written to #{dir}: is `true` a Ruby program")
    end
  end
end
