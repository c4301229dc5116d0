# frozen_string_literal: true

require "optparse"
require "fileutils"
require "rbconfig"
require "tmpdir"
require "datadog_heap"
require_relative "report/writer"
require_relative "cli/report"
require_relative "cli/diff"
require_relative "cli/run"
require_relative "cli/why"
require_relative "cli/trend"

module DatadogHeap
  # `datadog-heap`: reports on pprof heap profiles and profiles Ruby programs (exe/datadog-heap).
  #
  #   DatadogHeap::CLI.new.run(%w[report heap.pb.gz --top 5])  # => exit code
  #
  # Exit codes: 0 ok, 1 error (unreadable profile, command that cannot start...), 2 usage. `run`
  # exits with the status of the program it ran. Errors go to stderr, without a backtrace.
  # Nothing it prints holds a control character: names from a profile are shown escaped (see
  # SafeText), so a crafted profile cannot drive the terminal.
  #
  # This file parses the command line and hands it to a command (cli/report.rb, diff.rb, run.rb,
  # why.rb, trend.rb); what they print is written by DatadogHeap::Report (lib/datadog_heap/report/),
  # which the endpoint uses too.
  class CLI
    include Report::Text
    # write_report and write_html_report, to this CLI's `out`.
    include Report::Writing
    include ReportCommand
    include DiffCommand
    include RunCommand
    include Why
    include TrendCommand

    # The names these had when they lived here.
    SafeText = Report::SafeText
    Paths = Report::Paths
    Bytes = Report::Bytes

    EXIT_OK = 0
    EXIT_ERROR = 1
    EXIT_USAGE = 2
    DEFAULT_TOP = Report::DEFAULT_TOP
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

    # --wide: how files are shown (see Paths).
    def display_options(parser, options)
      parser.on("--wide", "full paths, and rows never cut to fit the terminal") { options[:wide] = true }
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
  end
end
