# frozen_string_literal: true

require "spec_helper"
require "open3"
require "shellwords"
require "tmpdir"

# README's first screen (its first 60 lines) is the leak hunt: the commands, an example of what
# they print, then the production path. Costs and tables come later. The quick start's commands
# are run as written, on examples/leaky_app.rb, and the example's columns are today's.
RSpec.describe "README's quick start" do
  root = File.expand_path("..", __dir__)
  readme = File.read(File.join(root, "README.md"))
  first_screen = readme.lines.first(60)
  # The first ```sh block of the first screen: the hunt's commands.
  commands = first_screen.join[/^```sh\n(.*?)^```$/m, 1].to_s.lines.map(&:strip)
    .select { |line| line.match?(/\A(DATADOG_HEAP_\w+=\S+ )*datadog-heap /) }

  it "shows the hunt's commands, the Rails line and the production path in the first 60 lines" do
    text = first_screen.join
    expect(commands.first).to match(/\A(DATADOG_HEAP_PRESET=leak_hunt datadog-heap run|datadog-heap run --preset leak_hunt) .*-- ruby app\.rb/)
    expect(commands.map { |c| c[/datadog-heap (\w+)/, 1] }).to eq(%w[run report why])
    expect(text).to include("config.datadog_heap.preset = :leak_hunt")
    expect(text).to include("config.datadog_heap.interval = ")
    expect(text).to match(/`datadog-heap trend [^`]+`/)
    expect(text).to match(/^```console\n\$ datadog-heap report .*^\$ datadog-heap why /m)
  end

  it "has no table, and no cost in µs, in the first 60 lines" do
    first_screen.each_with_index do |line, i|
      expect(line).not_to start_with("|"), "README.md:#{i + 1} is a table row: #{line}"
      expect(line).not_to match(/µs|\bus\b/), "README.md:#{i + 1} quotes a cost: #{line}"
    end
    # What moved down is still there.
    ["## What it costs", "## Datadog's profiler: the C ABI", "## Requirements and supported platforms"].each do |heading|
      expect(readme.lines.map(&:chomp)).to include(heading)
    end
    # The per-stage cost table lives in docs/performance.md, which README's costs section links.
    expect(File.read(File.join(root, "docs", "performance.md"))).to include("| stack capture / record |")
    expect(readme).to include("[docs/performance.md](docs/performance.md)")
    expect(readme).to include("](#what-it-costs)")
  end

  it "keeps the two fresh-machine commands true: bin/demo and bin/test exist and are executable" do
    %w[bin/demo bin/test].each do |script|
      expect(readme).to match(/^#{Regexp.escape(script)}\s+# /)
      expect(File.executable?(File.join(root, script))).to be(true), script
    end
    expect(readme).to include("`bin/demo`")
    expect(File).to exist(File.join(root, "examples", "leaky_app.rb"))
  end

  # :heavy: skipped under GC_STRESS, which the commands' processes do not run under.
  it "runs as written: the leak on top of the report, its holder named by why, the example's columns today's", :heavy do
    expect(commands.size).to eq(3), "the first ```sh block of README should hold run, report and why"
    Dir.mktmpdir("readme-quick-start-") do |dir|
      printed = commands.map do |command|
        # As a shell would run it: VAR=value prefixes, globs expanded; a comment dropped.
        words = Shellwords.split(command.sub(/\s+#.*\z/, ""))
        env = words.take_while { |w| w.match?(/\A\w+=/) }.to_h { |w| w.split("=", 2) }
        argv = words.drop(env.size).flat_map { |w| w.include?("*") ? Dir.glob(w, base: dir).sort : [w] }
        argv = argv.flat_map { |w| w == "app.rb" ? [File.join(root, "examples", "leaky_app.rb")] : [w] }
        expect(argv.first).to eq("datadog-heap")
        # A hung child fails the example instead of the run.
        out, status = Open3.capture2e(env, "timeout", "-s", "KILL", "120",
          RbConfig.ruby, File.join(root, "exe", "datadog-heap"), *argv.drop(1), chdir: dir)
        expect(status).to be_success, "`#{command}` failed (#{status}):\n#{out}"
        out
      end
      run, report, why = printed
      expect(Dir.glob(File.join(dir, "tmp", "heap", "heap-*-1.pb.gz")).size).to eq(1)
      [run, report].each do |out|
        expect(out.lines.grep(/^live bytes /).size).to eq(1), out
        first_row = out.lines.drop_while { |l| !l.start_with?("live bytes ") }[1]
        expect(first_row).to include("in LeakyCache#remember"), out
        expect(first_row).not_to match(/\A\s*~/), out # measured, not rough
      end
      expect(why).to match(/^1\. .*LeakyCache#remember.*\n\s+.*constant LeakyApp::CACHE \(LeakyCache\) -> @entries \(Hash\)/), why

      # The example's header row lists today's columns, in today's order.
      columns = ->(line) { line.strip.split(/\s{2,}/) }
      shown = first_screen.find { |l| l.start_with?("live bytes ") } or raise "no example report in the first 60 lines"
      today = report.lines.find { |l| l.start_with?("live bytes ") }
      expect(columns[today].first(columns[shown].size)).to eq(columns[shown])
    end
  end
end
