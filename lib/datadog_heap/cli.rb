# frozen_string_literal: true

require "optparse"
require "fileutils"
require "rbconfig"
require "tmpdir"
require "datadog_heap"

module DatadogHeap
  # `datadog-heap`: reports on pprof heap profiles and profiles Ruby programs (exe/datadog-heap).
  #
  #   DatadogHeap::CLI.new.run(%w[report heap.pb.gz --top 5])  # => exit code
  #
  # Exit codes: 0 ok, 1 error (unreadable profile, command that cannot start...), 2 usage. `run`
  # exits with the status of the program it ran. Errors go to stderr, without a backtrace.
  class CLI
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
      "run" => "run a Ruby program with datadog_heap/auto, then report its last profile",
      "help" => "help on a command",
    }.freeze

    def initialize(out: $stdout, err: $stderr, env: ENV)
      @out = out
      @err = err
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
      when "report", "diff", "run"
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
    rescue DatadogHeap::Error, SystemCallError, IOError => e
      @err.puts("datadog-heap: #{e.message}")
      EXIT_ERROR
    rescue Interrupt
      130
    rescue StandardError => e
      @err.puts("datadog-heap: internal error: #{e.class}: #{e.message}")
      EXIT_ERROR
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

    def top_option(parser, options)
      parser.on("--top N", Integer, "how many sites to show (default #{DEFAULT_TOP})") do |n|
        raise OptionParser::InvalidArgument, "--top must be at least 1, got #{n}" if n < 1

        options[:top] = n
      end
    end

    # --- report ------------------------------------------------------------------------------

    def report_parser(options)
      OptionParser.new do |p|
        p.banner = "Usage: datadog-heap report FILE [--top N] [--by size|count]"
        p.separator ""
        p.separator "The allocation sites holding the most live memory in the profile FILE: live bytes, live"
        p.separator "objects, share of the total, class, median age (GCs survived) and the file:line of the"
        p.separator "innermost frame of the application (not Ruby's or a gem's)."
        p.separator ""
        p.separator "Options:"
        top_option(p, options)
        p.on("--by KEY", %w[size count], "rank by live bytes (size, the default) or live objects (count)") do |key|
          options[:by] = key.to_sym
        end
        common_options(p, options)
      end
    end

    def report_command(argv)
      options = {top: DEFAULT_TOP, by: :size}
      return EXIT_OK if parse(report_parser(options), argv, options)
      raise UsageError, "report needs one profile FILE, got #{argv.size} arguments" unless argv.size == 1

      report(load_profile(argv.first), options[:top], options[:by])
      EXIT_OK
    end

    # A profile file named on the command line; a name that cannot be a path (empty, with a NUL)
    # is the user's mistake, so a usage error rather than an internal one.
    def load_profile(path)
      Profile.load(path)
    rescue ArgumentError => e
      raise UsageError, e.message
    end

    def report(profile, top, by)
      sites = profile.top(2**62 - 1, by: by)
      by = :count unless profile.sizes?
      @out.puts(profile_summary(profile, sites.size))
      if sites.empty?
        @out.puts("No live objects in this profile.")
        return
      end
      shown = sites.first(top)
      @out.puts("(this profile has no sizes: sites are ranked by live objects)") unless profile.sizes?
      @out.puts
      @out.puts("Top #{shown.size} of #{plural(sites.size, "site")} by live #{by == :size ? "bytes" : "objects"}:")
      @out.puts
      rows = shown.map do |s|
        [profile.sizes? ? human_bytes(s.live_bytes) : "-", s.live_objects.to_s, percent(s.share),
          s.class_name || "?", s.median_gen_age&.to_s || "-", s.location]
      end
      @out.puts(table(["live bytes", "live objects", "share", "class", "median age", "site"], rows, "rrrlrl"))
    end

    def profile_summary(profile, site_count)
      bytes = profile.sizes? ? "#{human_bytes(profile.total_bytes)} in " : ""
      period = profile.period_type && profile.period > 1 ? ", sampled 1 in #{profile.period} #{profile.period_type[0]}" : ""
      "#{profile.path}: #{bytes}#{profile.total_objects} live objects at #{plural(site_count, "site")}#{period}"
    end

    # --- diff --------------------------------------------------------------------------------

    def diff_parser(options)
      OptionParser.new do |p|
        p.banner = "Usage: datadog-heap diff OLD NEW [--top N]"
        p.separator ""
        p.separator "The allocation sites whose live size grew from the profile OLD to the profile NEW, the"
        p.separator "largest growth first, with the absolute and relative change: what to look at when memory"
        p.separator "keeps growing. Only growing sites are listed. Profiles without sizes are compared by live"
        p.separator "objects."
        p.separator ""
        p.separator "Options:"
        top_option(p, options)
        common_options(p, options)
      end
    end

    def diff_command(argv)
      options = {top: DEFAULT_TOP}
      return EXIT_OK if parse(diff_parser(options), argv, options)
      raise UsageError, "diff needs two profiles, OLD and NEW, got #{argv.size} arguments" unless argv.size == 2

      old, new = argv.map { |path| load_profile(path) }
      diff(old, new, options[:top])
      EXIT_OK
    end

    def diff(old, new, top)
      sizes = old.sizes? && new.sizes?
      diffs = old.diff(new)
      measure = sizes ? :bytes_change : :objects_change
      growing = diffs.select { |d| d.public_send(measure) > 0 }
      growing = growing.sort_by.with_index { |d, i| [-d.objects_change, i] } unless sizes
      totals = if sizes
        "live bytes #{human_bytes(old.total_bytes)} -> #{human_bytes(new.total_bytes)} " \
          "(#{signed_bytes(new.total_bytes - old.total_bytes)})"
      else
        "live objects #{old.total_objects} -> #{new.total_objects} (#{signed(new.total_objects - old.total_objects)})"
      end
      @out.puts("#{old.path} -> #{new.path}: #{totals}")
      @out.puts("(a profile has no sizes: sites are compared by live objects)") unless sizes
      if growing.empty?
        @out.puts("No site grew: live #{sizes ? "size" : "objects"} did not increase at any of the #{plural(diffs.size, "site")}.")
        return
      end
      shown = growing.first(top)
      largest = shown.size < growing.size ? "; the #{plural(shown.size, "largest growth")}" : ""
      @out.puts("#{growing.size} of #{plural(diffs.size, "site")} grew#{largest}:")
      @out.puts
      rows = shown.map do |d|
        if sizes
          [signed_bytes(d.bytes_change), relative(d.bytes_relative), human_bytes(d.old_bytes), human_bytes(d.new_bytes),
            signed(d.objects_change), d.class_name || "?", d.location]
        else
          [signed(d.objects_change), relative(d.objects_relative), d.old_objects.to_s, d.new_objects.to_s,
            d.class_name || "?", d.location]
        end
      end
      headers = if sizes
        ["growth", "relative", "old bytes", "new bytes", "objects +/-", "class", "site"]
      else
        ["growth", "relative", "old objects", "new objects", "class", "site"]
      end
      @out.puts(table(headers, rows, sizes ? "rrrrrll" : "rrrrll"))
    end

    # --- run ---------------------------------------------------------------------------------

    def run_parser(options)
      OptionParser.new do |p|
        p.banner = "Usage: datadog-heap run [--out DIR] [--interval S] [--sample-every N] [--top N] -- CMD..."
        p.separator ""
        p.separator "Runs CMD (a Ruby program, or a command that starts one) with datadog_heap/auto loaded"
        p.separator "through RUBYOPT, waits for it, then prints the report of the last profile written. Every"
        p.separator "Ruby process CMD starts writes DIR/heap-<pid>-<n>.pb.gz: every S seconds with --interval,"
        p.separator "and at exit. Exits with CMD's status."
        p.separator ""
        p.separator "Options:"
        p.on("--out DIR", "where profiles go (default: a new temporary directory, printed)") do |dir|
          options[:out] = dir
        end
        p.on("--interval S", Float, "also write a profile every S seconds (default: at exit only)") do |s|
          raise OptionParser::InvalidArgument, "--interval must be a number of seconds > 0, got #{s}" unless s.finite? && s > 0

          options[:interval] = s
        end
        p.on("--sample-every N", Integer, "mean allocations between samples (default #{Recorder::DEFAULTS[:sample_every]})") do |n|
          unless n.between?(1, Recorder::U32_MAX)
            raise OptionParser::InvalidArgument, "--sample-every must be between 1 and #{Recorder::U32_MAX}, got #{n}"
          end

          options[:sample_every] = n
        end
        top_option(p, options)
        common_options(p, options)
      end
    end

    def run_command(argv)
      options = {top: DEFAULT_TOP}
      # Options stop at the first argument that is not one (or at --), so CMD keeps its own.
      return EXIT_OK if parse(run_parser(options), argv, options, in_order: true)
      argv.shift if argv.first == "--"
      raise UsageError, "run needs a command to run after --" if argv.empty?

      temporary = options[:out].nil?
      out = File.expand_path(options[:out] || Dir.mktmpdir("datadog-heap-"))
      FileUtils.mkdir_p(out)
      before = profiles_in(out)
      status = spawn_and_wait(child_env(out, options), argv)
      code = status.exitstatus || (128 + (status.termsig || 0))
      written = profiles_in(out).reject { |path, mtime| before[path] == mtime }
      last = written.max_by { |path, mtime| [mtime, path[/-(\d+)\.pb\.gz\z/, 1].to_i] }&.first
      unless last
        @err.puts("datadog-heap: no profile was written to #{out}: is `#{argv.first}` a Ruby program " \
          "(datadog_heap/auto is loaded through RUBYOPT)?")
        return code.zero? ? EXIT_ERROR : code
      end
      @out.puts
      @out.puts("datadog-heap: `#{argv.join(" ")}` exited with status #{code}; #{plural(written.size, "profile")} in #{out}")
      report(Profile.load(last), options[:top], :size)
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
      env
    end

    # Runs the command to the end. Ctrl-C reaches the child from the terminal, so this process
    # ignores SIGINT meanwhile; SIGTERM and SIGHUP sent to this process are passed on.
    def spawn_and_wait(env, argv)
      pid = begin
        Process.spawn(env, *argv)
      rescue SystemCallError => e
        raise e.class, "cannot run `#{argv.first}`"
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

    # {path => mtime} of the profiles in `dir`.
    def profiles_in(dir)
      Dir.glob(File.join(dir, PROFILE_GLOB)).to_h { |path| [path, File.mtime(path)] }
    end

    # --- formatting --------------------------------------------------------------------------

    # Columns padded to their widest cell; `aligns` has one "l" or "r" per column. The last column
    # is not padded.
    def table(headers, rows, aligns)
      all = [headers, *rows]
      widths = headers.each_index.map { |i| all.map { |r| r[i].to_s.size }.max }
      all.map do |row|
        row.each_with_index.map do |cell, i|
          next cell.to_s if i == row.size - 1

          aligns[i] == "r" ? cell.to_s.rjust(widths[i]) : cell.to_s.ljust(widths[i])
        end.join("  ")
      end.join("\n")
    end

    UNITS = %w[B KiB MiB GiB TiB].freeze

    def human_bytes(bytes)
      return "-" if bytes.nil?

      value = bytes.abs.to_f
      unit = 0
      while value >= 1024 && unit < UNITS.size - 1
        value /= 1024
        unit += 1
      end
      text = unit.zero? ? "#{value.to_i} B" : format("%.1f %s", value, UNITS[unit])
      bytes.negative? ? "-#{text}" : text
    end

    def plural(count, noun)
      "#{count} #{noun}#{"s" unless count == 1}"
    end

    def signed_bytes(bytes)
      bytes.negative? ? human_bytes(bytes) : "+#{human_bytes(bytes)}"
    end

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
