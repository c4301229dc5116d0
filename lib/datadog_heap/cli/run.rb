# frozen_string_literal: true

module DatadogHeap
  class CLI
    # `datadog-heap run -- CMD...`: runs a Ruby program with datadog_heap/auto loaded through
    # RUBYOPT, waits for it, then prints the report of the last profile each of its processes
    # wrote, summed.
    module RunCommand
      private

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
            require_relative "../upload"
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
    end
  end
end
