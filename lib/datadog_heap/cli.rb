# frozen_string_literal: true

require "optparse"
require "fileutils"
require "rbconfig"
require "tmpdir"
require "datadog_heap"
require_relative "cli/safe_text"
require_relative "cli/paths"
require_relative "cli/report"
require_relative "cli/why"
require_relative "cli/trend"
require_relative "cli/diff_html"

module DatadogHeap
  # `datadog-heap`: reports on pprof heap profiles and profiles Ruby programs (exe/datadog-heap).
  #
  #   DatadogHeap::CLI.new.run(%w[report heap.pb.gz --top 5])  # => exit code
  #
  # Exit codes: 0 ok, 1 error (unreadable profile, command that cannot start...), 2 usage. `run`
  # exits with the status of the program it ran. Errors go to stderr, without a backtrace.
  # Nothing it prints holds a control character: names from a profile are shown escaped (see
  # SafeText), so a crafted profile cannot drive the terminal.
  class CLI
    include ReportCommand
    include Why
    include TrendCommand
    include DiffHtmlCommand

    EXIT_OK = 0
    EXIT_ERROR = 1
    EXIT_USAGE = 2
    DEFAULT_TOP = 10
    PROFILE_GLOB = "heap-*.pb.gz"
    LIB_DIR = File.expand_path("..", __dir__)

    # A command line that does not make sense; exits 2.
    class UsageError < StandardError; end

    COMMANDS = {
      "report" => "top allocation sites of a profile: live bytes, objects, class, age",
      "diff" => "sites whose live size grew between two profiles (leak hunting)",
      "trend" => "is it a leak? per site, the slope of live bytes over a series of profiles, and a verdict",
      "why" => "what keeps the top sites' objects alive: retainer paths from GC roots",
      "run" => "run a Ruby program with datadog_heap/auto, then report its last profile",
      "help" => "help on a command",
    }.freeze

    def initialize(out: $stdout, err: $stderr, env: ENV)
      @out = SafeText::Output.new(out)
      @err = SafeText::Output.new(err)
      @env = env
    end

    # Runs one command line; returns the exit code.
    def run(argv)
      argv = argv.dup
      command = argv.shift
      case command
      when nil
        @err.puts(main_help)
        EXIT_USAGE
      when "-h", "--help"
        @out.puts(main_help)
        EXIT_OK
      when "-v", "--version"
        @out.puts("datadog-heap #{DatadogHeap::VERSION}")
        EXIT_OK
      when "help"
        help(argv)
      when "report", "diff", "run", "why", "trend"
        send(:"#{command}_command", argv)
      else
        raise UsageError, "unknown command #{command.inspect}"
      end
    rescue UsageError, OptionParser::ParseError => e
      @err.puts("datadog-heap: #{e.message}")
      @err.puts("Run `datadog-heap #{COMMANDS.key?(command) ? "#{command} " : ""}--help` for usage.")
      EXIT_USAGE
    rescue Errno::EPIPE
      EXIT_OK
    rescue SystemCallError => e
      @err.puts("datadog-heap: #{CLI.plain_message(e)}")
      EXIT_ERROR
    rescue DatadogHeap::Error, IOError => e
      @err.puts("datadog-heap: #{e.message}")
      EXIT_ERROR
    rescue Interrupt
      130
    rescue StandardError => e
      @err.puts("datadog-heap: internal error: #{e.class}: #{e.message}")
      EXIT_ERROR
    end

    # Writes what `datadog-heap report` prints for `profile` (a Profile) to this CLI's `out`; the
    # options are the command's (by: :size or :count, group: a Profile::GROUPS member, wide: full
    # paths, uncut). Tables fit Paths.terminal_width of `out`.
    def write_report(profile, top: DEFAULT_TOP, by: :size, group: :site, app_root: Dir.pwd, wide: false)
      report(profile, {top: top, by: by, group: group, app_root: app_root, wide: wide})
      nil
    end

    # Writes the page `datadog-heap report --html` writes for `profile` to this CLI's `out`; the
    # options as for #write_report.
    def write_html_report(profile, top: DEFAULT_TOP, by: :size, group: :site, app_root: Dir.pwd, wide: false)
      @out.write(report_page(profile, {top: top, by: by, group: group, app_root: app_root, wide: wide}))
      nil
    end

    # The message of a failed system call as a reader wants it: the system's words and the path,
    # without Ruby's C function name (`No such file or directory @ rb_sysopen - x.pb.gz` reads
    # `x.pb.gz: No such file or directory`).
    def self.plain_message(error)
      reason = SystemCallError === error && error.errno ? SystemCallError.new(nil, error.errno).message : nil
      reason = reason&.sub(/\Aunknown error - /, "")
      text = error.message.sub(/(?: -)? @ \w+/, "")
      return text unless reason && text.start_with?(reason)

      rest = text.delete_prefix(reason).delete_prefix(" - ")
      rest.empty? ? reason : "#{rest}: #{reason}"
    end

    private

    def main_help
      width = COMMANDS.keys.map(&:size).max
      <<~HELP
        Usage: datadog-heap COMMAND [options]

        Reads the pprof heap profiles datadog_heap writes (and any other pprof heap profile).

        Commands:
        #{COMMANDS.map { |name, text| "  #{name.ljust(width)}  #{text}" }.join("\n")}

        Options:
          -h, --help     this help
          -v, --version  the version

        `datadog-heap COMMAND --help` describes each command.
      HELP
    end

    def help(argv)
      command = argv.first
      return run(["--help"]) if command.nil?
      raise UsageError, "unknown command #{command.inspect}" unless COMMANDS.key?(command)
      return run(["--help"]) if command == "help"

      @out.puts(send(:"#{command}_parser", {}).help)
      EXIT_OK
    end

    # Parses `argv` with `parser`; true when --help was asked (and printed).
    def parse(parser, argv, options, in_order: false)
      in_order ? parser.order!(argv) : parser.parse!(argv)
      return false unless options[:help]

      @out.puts(parser.help)
      true
    end

    def common_options(parser, options)
      parser.on("-h", "--help", "this help") { options[:help] = true }
    end

    # --group, --by-site and --app-root: what a row stands for and what is application code.
    def grouping_options(parser, options)
      parser.on("--group KIND", "what a row sums: site (the default), location (file:line), file, gem or class") do |kind|
        options[:group] = choice("--group", kind, Profile::GROUPS)
      end
      parser.on("--by-site", "a row per site (the default): --group site") { options[:group] = :site }
      parser.on("--app-root DIR", "the application's code (default: the current directory); repeatable") do |dir|
        raise UsageError, "--app-root must not be empty" if dir.empty?

        (options[:app_root] ||= []) << File.expand_path(dir)
      end
    end

    def grouping(options)
      {group: options.fetch(:group, :site), app_root: options.fetch(:app_root) { Dir.pwd }}
    end

    # --wide: how files are shown (see Paths).
    def display_options(parser, options)
      parser.on("--wide", "full paths, and rows never cut to fit the terminal") { options[:wide] = true }
    end

    # How this command shows files and how wide its tables may be.
    def paths(options)
      Paths.new(app_root: grouping(options)[:app_root], wide: options[:wide] == true, width: Paths.terminal_width(@out.io))
    end

    def top_option(parser, options)
      parser.on("--top N", "how many sites to show (default #{DEFAULT_TOP})") do |n|
        options[:top] = count_argument("--top", n, 1)
      end
    end

    # --by: what rows are ranked by.
    def by_option(parser, options)
      parser.on("--by KEY", "rank by live bytes (size, the default) or live objects (count)") do |key|
        options[:by] = choice("--by", key, Profile::SORT_KEYS)
      end
    end

    # `value` as a Symbol of `allowed`, else a usage error listing them.
    def choice(flag, value, allowed)
      found = allowed.find { |a| a.to_s == value }
      return found if found

      raise UsageError, "#{flag} must be one of #{allowed.join(", ")}, got #{value.inspect}"
    end

    # `text` as an Integer of at least `min`, else a usage error naming `flag` and the value.
    def count_argument(flag, text, min, max = nil)
      n = Integer(text, 10, exception: false)
      raise UsageError, "#{flag} must be a whole number, got #{text.inspect}" if n.nil?
      raise UsageError, "#{flag} must be at least #{min}, got #{n}" if n < min
      raise UsageError, "#{flag} must be at most #{max}, got #{n}" if max && n > max

      n
    end

    # Runs the block, which writes `path`; a failure to write it is an error naming the path in
    # plain words (`cannot write out/x.html: No such file or directory`).
    def writing(path)
      yield
    rescue SystemCallError => e
      raise DatadogHeap::Error, "cannot write #{SafeText.escape(path)}: #{CLI.plain_message(e).delete_prefix("#{path}: ")}"
    end

    # A profile file named on the command line; a name that cannot be a path (empty, with a NUL)
    # is the user's mistake, so a usage error rather than an internal one.
    def load_profile(path)
      Profile.load(path)
    rescue ArgumentError => e
      raise UsageError, e.message
    end

    # The profile at each path, summed when there are several.
    def load_profiles(paths)
      profiles = paths.map { |path| load_profile(path) }
      profiles.size == 1 ? profiles.first : Profile.merge(profiles)
    end

    def plural_noun(noun)
      noun == "class" ? "classes" : "#{noun}s"
    end

    def plural(count, noun)
      "#{count} #{count == 1 ? noun : plural_noun(noun)}"
    end

    # "PATH" for one profile; "N profiles summed (A, B, ...)" for several.
    def profile_name(profile)
      return SafeText.escape(profile.path || "(profile)") if profile.count == 1

      names = profile.paths.map { |name| SafeText.escape(name) }
      shown = names.size > 3 ? names.first(2) + ["... #{names.size - 2} more"] : names
      "#{profile.count} profiles summed (#{shown.join(", ")})"
    end

    def profile_summary(profile, site_count, noun = "site")
      bytes = profile.sizes? ? "#{human_bytes(profile.total_bytes)} in " : ""
      unit = profile.period_type && SafeText.escape(profile.period_type[0])
      period = unit && profile.period > 1 ? ", sampled 1 in #{profile.period} #{unit}" : ""
      "#{profile_name(profile)}: #{bytes}#{profile.total_objects} live objects at #{plural(site_count, noun)}#{period}"
    end

    # --- diff --------------------------------------------------------------------------------

    def diff_parser(options)
      OptionParser.new do |p|
        p.banner = "Usage: datadog-heap diff OLD NEW [--top N] [--group KIND] [--app-root DIR] [--wide]\n" \
          "       datadog-heap diff OLD... -- NEW... [options]"
        p.separator ""
        p.separator "The allocation sites whose live size grew from the profile OLD to the profile NEW, the"
        p.separator "largest growth first, with the absolute and relative change: what to look at when memory"
        p.separator "keeps growing. Only growing sites are listed. Profiles without sizes are compared by live"
        p.separator "objects. With --, the profiles before it are summed into OLD and the ones after it into"
        p.separator "NEW (one per forked worker, say: diff tmp/heap-*-1.pb.gz -- tmp/heap-*-9.pb.gz)."
        p.separator "Sites, --group, --app-root and --wide are as in `datadog-heap report`. With --html, a page"
        p.separator "with a diff flame graph (growth red, shrinkage blue) and the sites that grew and shrank most."
        p.separator ""
        p.separator "Options:"
        top_option(p, options)
        grouping_options(p, options)
        display_options(p, options)
        diff_html_options(p, options)
        common_options(p, options)
      end
    end

    def diff_command(argv)
      options = {top: DEFAULT_TOP}
      split = argv.index("--")
      parser = diff_parser(options)
      if split
        old_paths = argv[0...split]
        new_paths = argv[(split + 1)..]
        return EXIT_OK if parse(parser, old_paths, options) || parse(parser, new_paths, options)
        raise UsageError, "diff needs at least one OLD profile before --" if old_paths.empty?
        raise UsageError, "diff needs at least one NEW profile after --" if new_paths.empty?
      else
        return EXIT_OK if parse(parser, argv, options)
        unless argv.size == 2
          raise UsageError, "diff needs two profiles, OLD and NEW, got #{plural(argv.size, "argument")} " \
            "(to sum several on each side: diff OLD... -- NEW...)"
        end

        old_paths, new_paths = [argv[0]], [argv[1]]
      end
      diff_or_page(load_profiles(old_paths), load_profiles(new_paths), options)
      EXIT_OK
    end

    def diff(old, new, options)
      top = options.fetch(:top, DEFAULT_TOP)
      group = grouping(options)
      kind = group[:group]
      noun = kind.to_s
      sizes = old.sizes? && new.sizes?
      diffs = old.diff(new, **group)
      measure = sizes ? :bytes_change : :objects_change
      growing = diffs.select { |d| d.public_send(measure) > 0 }
      growing = growing.sort_by.with_index { |d, i| [-d.objects_change, i] } unless sizes
      totals = if sizes
        "live bytes #{human_bytes(old.total_bytes)} -> #{human_bytes(new.total_bytes)} " \
          "(#{signed_bytes(new.total_bytes - old.total_bytes)})"
      else
        "live objects #{old.total_objects} -> #{new.total_objects} (#{signed(new.total_objects - old.total_objects)})"
      end
      @out.puts("#{profile_name(old)} -> #{profile_name(new)}: #{totals}")
      @out.puts("(a profile has no sizes: #{plural_noun(noun)} are compared by live objects)") unless sizes
      if growing.empty?
        @out.puts("No #{noun} grew: live #{sizes ? "size" : "objects"} did not increase at any of the #{plural(diffs.size, noun)}.")
        return
      end
      shown = growing.first(top)
      largest = shown.size < growing.size ? "; the #{shown.size} largest growth#{"s" unless shown.size == 1}" : ""
      known = growing.reject { |d| d.significant.nil? }
      beyond = known.empty? ? "" : ", #{known.count(&:significant)} beyond #{growing.size == 1 ? "its" : "their"} noise " \
        "(|growth| > #{Profile::SIGNIFICANT_SDS.to_i} sd)"
      @out.puts("#{growing.size} of #{plural(diffs.size, noun)} grew#{beyond}#{largest}:")
      @out.puts
      callers = kind == :site && shown.any?(&:called_from)
      paths = paths(options)
      rows = shown.map do |d|
        row = if sizes
          [signed_bytes(d.bytes_change), spread(d.bytes_change_stddev) { |sd| human_bytes(sd.round) },
            relative(d.bytes_relative), human_bytes(d.old_bytes), human_bytes(d.new_bytes), signed(d.objects_change)]
        else
          [signed(d.objects_change), spread(d.objects_change_stddev) { |sd| sd.round.to_s },
            relative(d.objects_relative), d.old_objects.to_s, d.new_objects.to_s]
        end
        row += [samples_change(d), significance(d.significant)]
        row << (d.class_name || "?") if kind == :site
        row << paths.label(d, kind)
        row << (paths.called_from(d) || "") if callers
        row
      end
      headers = sizes ? ["growth", "±", "relative", "old bytes", "new bytes", "objects +/-"] : ["growth", "±", "relative", "old objects", "new objects"]
      headers += ["samples", "significant"]
      headers << "class" if kind == :site
      headers << noun
      headers << "called from" if callers
      cut = callers ? [headers.size - 2, headers.size - 1] : [headers.size - 1]
      @out.puts(table(headers, rows, "#{"r" * (sizes ? 7 : 6)}l#{"l" if kind == :site}ll", width: paths.width, cut: cut))
      @out.puts
      if known.empty?
        @out.puts("(a profile does not say how many samples its rows rest on: ± and significance are n/a)")
      else
        @out.puts("± is one standard deviation of the change's sampling error; significant: the growth exceeds " \
          "#{Profile::SIGNIFICANT_SDS.to_i} of them. ~ marks a side resting on fewer than #{Profile::ROUGH_SAMPLES} samples.")
      end
    end

    # "old -> new" sample counts, "~" before a side with fewer than ROUGH_SAMPLES; "n/a" if unknown.
    def samples_change(diff)
      sampled = diff.bytes_change_stddev.to_f > 0 || diff.objects_change_stddev.to_f > 0
      side = ->(n) { n.nil? ? "n/a" : "#{"~" if sampled && n < Profile::ROUGH_SAMPLES && n > 0}#{n}" }
      "#{side.call(diff.old_samples)} -> #{side.call(diff.new_samples)}"
    end

    def significance(flag)
      flag.nil? ? "n/a" : (flag ? "yes" : "no")
    end

    # --- run ---------------------------------------------------------------------------------

    def run_parser(options)
      OptionParser.new do |p|
        p.banner = "Usage: datadog-heap run [--out DIR] [--interval S] [--sample-every N] [--preset leak_hunt] " \
          "[--retainers [--values]] [--gc] [--upload TARGET] [--top N] [--group KIND] [--app-root DIR] [--wide] -- CMD..."
        p.separator ""
        p.separator "Runs CMD (a Ruby program, or a command that starts one) with datadog_heap/auto loaded"
        p.separator "through RUBYOPT, waits for it, then prints the report of the last profile each process"
        p.separator "wrote, summed. Every Ruby process CMD starts writes DIR/heap-<pid>-<n>.pb.gz: every S"
        p.separator "seconds with --interval, and at exit. Exits with CMD's status. --group, --app-root and"
        p.separator "--wide are as in `datadog-heap report`. The options reach CMD's processes through the"
        p.separator "environment (DATADOG_HEAP_OUTPUT, _INTERVAL, _SAMPLE_EVERY, _PRESET, _RETAINERS, _GC, _UPLOAD)."
        p.separator ""
        p.separator "Options:"
        p.on("--out DIR", "where profiles go (default: a new temporary directory, printed)") do |dir|
          options[:out] = dir
        end
        p.on("--interval S", Float, "also write a profile every S seconds (default: at exit only)") do |s|
          raise UsageError, "--interval must be a number of seconds > 0, got #{s}" unless s.finite? && s > 0

          options[:interval] = s
        end
        p.on("--sample-every N", Integer, "mean allocations between samples (default #{Recorder::SAMPLE_EVERY[:windowed]}; " \
          "below #{Recorder::WINDOWED_FROM} the countdown sampler is used)") do |n|
          unless n.between?(1, Recorder::U32_MAX)
            raise UsageError, "--sample-every must be between 1 and #{Recorder::U32_MAX}, got #{n}"
          end

          options[:sample_every] = n
        end
        p.on("--preset NAME", "a preset of the recorder (#{Recorder::PRESETS.keys.join(", ")}): leak_hunt samples 1 in " \
          "#{Recorder::PRESETS[:leak_hunt][:sample_every]} with no overhead budget, runs a full GC before each profile " \
          "and adds retainer paths (DATADOG_HEAP_PRESET)") do |name|
          options[:preset] = choice("--preset", name, Recorder::PRESETS.keys)
        end
        p.on("--retainers", "retainer paths in every profile (DATADOG_HEAP_RETAINERS=1; see `datadog-heap why`)") do
          options[:retainers] = true
        end
        p.on("--values", "with --retainers or --preset leak_hunt: Hash keys in the paths as they are, not by class " \
          "and size (DATADOG_HEAP_RETAINERS=values; they are the program's data)") do
          options[:values] = true
        end
        p.on("--gc", "a full GC before every profile, so garbage is not listed (DATADOG_HEAP_GC=1)") do
          options[:gc] = true
        end
        p.on("--upload TARGET", "also send each profile to TARGET: agent, an agent URL, or pyroscope:URL " \
          "(DATADOG_HEAP_UPLOAD; see the README)") do |target|
          require_relative "upload"
          _, url = Upload.target(target, @env)
          unless url
            raise UsageError, "--upload must be agent, an agent URL (http://, https://, unix://), " \
              "pyroscope or pyroscope:URL, got #{Redact.text(target)}"
          end
          begin
            Exporter.check_url("--upload", url)
          rescue ArgumentError => e
            raise UsageError, e.message
          end

          options[:upload] = target
        end
        top_option(p, options)
        grouping_options(p, options)
        display_options(p, options)
        common_options(p, options)
      end
    end

    def run_command(argv)
      options = {top: DEFAULT_TOP}
      # Options stop at the first argument that is not one (or at --), so CMD keeps its own.
      return EXIT_OK if parse(run_parser(options), argv, options, in_order: true)
      argv.shift if argv.first == "--"
      raise UsageError, "run needs a command to run after --" if argv.empty?
      if options[:values] && !options[:retainers] && options[:preset] != :leak_hunt
        raise UsageError, "--values shows keys in retainer paths: it needs --retainers or --preset leak_hunt"
      end

      temporary = options[:out].nil?
      out = File.expand_path(options[:out] || Dir.mktmpdir("datadog-heap-"))
      writing(out) { FileUtils.mkdir_p(out) }
      before = profiles_in(out)
      status = spawn_and_wait(child_env(out, options), argv)
      code = status.exitstatus || (128 + (status.termsig || 0))
      written = profiles_in(out).reject { |path, mtime| before[path] == mtime }
      last = last_of_each_process(written)
      if last.empty?
        @err.puts("datadog-heap: no profile was written to #{out}: is `#{shell_words(argv.first(1))}` a Ruby program " \
          "(datadog_heap/auto is loaded through RUBYOPT)?")
        return code.zero? ? EXIT_ERROR : code
      end
      @out.puts
      each = last.size > 1 ? "; the last of each of #{last.size} processes, summed:" : ""
      @out.puts("datadog-heap: `#{shell_words(argv)}` exited with status #{code}; #{plural(written.size, "profile")} in #{out}#{each}")
      report(load_profiles(last), options)
      code
    ensure
      # A temporary directory nothing was written to (CMD did not start, or is not Ruby) goes.
      Dir.rmdir(out) if temporary && out && Dir.exist?(out) && Dir.empty?(out)
    end

    def child_env(out, options)
      rubyopt = ["-rdatadog_heap/auto", @env["RUBYOPT"]].compact.join(" ")
      env = {"DATADOG_HEAP_OUTPUT" => File.join(out, "")}
      # RUBYOPT splits on spaces: a lib dir with one goes through RUBYLIB instead.
      if LIB_DIR.match?(/\s/)
        env["RUBYLIB"] = [LIB_DIR, @env["RUBYLIB"]].compact.join(File::PATH_SEPARATOR)
      else
        rubyopt = "-I#{LIB_DIR} #{rubyopt}"
      end
      env["RUBYOPT"] = rubyopt
      env["DATADOG_HEAP_INTERVAL"] = options[:interval]&.to_s
      env["DATADOG_HEAP_SAMPLE_EVERY"] = options[:sample_every]&.to_s
      env["DATADOG_HEAP_UPLOAD"] = options[:upload] if options[:upload]
      # Set when asked for; otherwise what CMD inherits stands (DATADOG_HEAP_PRESET=leak_hunt
      # datadog-heap run ... works too).
      env["DATADOG_HEAP_PRESET"] = options[:preset].to_s if options[:preset]
      env["DATADOG_HEAP_RETAINERS"] = options[:values] ? "values" : "1" if options[:retainers] || options[:values]
      env["DATADOG_HEAP_GC"] = "1" if options[:gc]
      env
    end

    # `argv` as one would type it in a shell: words with spaces or quotes in single quotes
    # (`ruby -e 'exit 3'`), so the line can be copied and run again.
    def shell_words(argv)
      argv.map do |word|
        word.match?(%r{\A[\w@%+=:,./-]+\z}) ? word : "'#{word.gsub("'") { %q('\\'') }}'"
      end.join(" ")
    end

    # Runs the command to the end. Ctrl-C reaches the child from the terminal, so this process
    # ignores SIGINT meanwhile; SIGTERM and SIGHUP sent to this process are passed on.
    def spawn_and_wait(env, argv)
      pid = begin
        Process.spawn(env, *argv)
      rescue SystemCallError => e
        raise e.class, "cannot run `#{shell_words(argv.first(1))}`"
      end
      previous = {}
      previous["INT"] = trap("INT", "IGNORE")
      %w[TERM HUP].each do |signal|
        previous[signal] = trap(signal) do
          Process.kill(signal, pid)
        rescue SystemCallError
          nil # already gone
        end
      end
      Process.wait2(pid).last
    ensure
      previous&.each { |signal, handler| trap(signal, handler || "DEFAULT") }
    end

    # The last profile each process wrote (heap-<pid>-<n>.pb.gz: the largest n, else the newest),
    # by pid. `written` is {path => mtime}.
    def last_of_each_process(written)
      written.group_by { |path, _| File.basename(path)[/\Aheap-(\d+)-/, 1] }.map do |_, files|
        files.max_by { |path, mtime| [path[/-(\d+)\.pb\.gz\z/, 1].to_i, mtime] }.first
      end.sort
    end

    # {path => mtime} of the profiles in `dir`.
    def profiles_in(dir)
      Dir.glob(File.join(dir, PROFILE_GLOB)).to_h { |path| [path, File.mtime(path)] }
    end

    # --- formatting --------------------------------------------------------------------------

    # Columns padded to their widest cell; `aligns` has one "l" or "r" per column. The last column
    # is not padded, and no line ends in spaces. Cells are shown escaped (SafeText.escape): one
    # line per row. With a `width` (nil: none), the columns listed in `cut` are narrowed, the
    # widest first and never below Paths::MIN_CUT_WIDTH or their header, until the lines fit, and
    # their cells shortened with "…" (Paths.cut).
    def table(headers, rows, aligns, width: nil, cut: [])
      all = [headers, *rows].map { |row| row.map { |cell| SafeText.escape(cell) } }
      widths = headers.each_index.map { |i| all.map { |r| r[i].size }.max }
      if width
        floors = cut.to_h { |i| [i, [Paths::MIN_CUT_WIDTH, headers[i].size].max] }
        excess = widths.sum + 2 * (widths.size - 1) - width
        while excess > 0
          i = cut.select { |j| widths[j] > floors[j] }.max_by { |j| widths[j] }
          break unless i

          widths[i] -= 1
          excess -= 1
        end
        all = all.each_with_index.map do |row, r|
          r.zero? ? row : row.each_with_index.map { |cell, i| floors.key?(i) ? Paths.cut(cell, widths[i]) : cell }
        end
      end
      all.map do |row|
        row.each_with_index.map do |cell, i|
          next cell if i == row.size - 1

          aligns[i] == "r" ? cell.rjust(widths[i]) : cell.ljust(widths[i])
        end.join("  ").rstrip
      end.join("\n")
    end

    # Byte counts as people read them ("1.5 MiB"), for the CLI's tables and `trend --html`.
    module Bytes
      UNITS = %w[B KiB MiB GiB TiB].freeze

      module_function

      def human_bytes(bytes)
        return "-" if bytes.nil?

        value = bytes.abs.to_f
        unit = 0
        while value >= 1024 && unit < UNITS.size - 1
          value /= 1024
          unit += 1
        end
        text = unit.zero? ? "#{value.round} B" : format("%.1f %s", value, UNITS[unit])
        bytes.negative? ? "-#{text}" : text
      end

      def signed_bytes(bytes)
        bytes.negative? ? human_bytes(bytes) : "+#{human_bytes(bytes)}"
      end
    end
    include Bytes

    def signed(n)
      n.negative? ? n.to_s : "+#{n}"
    end

    def percent(share)
      format("%.1f%%", 100.0 * share)
    end

    def relative(ratio)
      ratio.nil? ? "new" : format("%+.1f%%", 100.0 * ratio)
    end
  end
end
