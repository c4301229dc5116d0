# frozen_string_literal: true

# Boots the example service (puma.rb, config.ru) as a puma cluster on a free loopback port and
# drives it with wrk (load.lua). Shared by bench/service.rb and spec/stress/service_spec.rb.
# Every wait here has a deadline, and every load run is bounded in time and in requests.

require "json"
require "net/http"
require "rbconfig"
require "socket"

module ServiceCluster
  DIR = __dir__
  LIB = File.expand_path("../../lib", DIR)
  PUMA_CONFIG = File.join(DIR, "puma.rb")
  LOAD_SCRIPT = File.join(DIR, "load.lua")
  APP = File.join(DIR, "app.rb")

  class Error < StandardError; end

  module_function

  # The environment that profiles a process with datadog_heap/auto from this checkout, writing
  # into the directory `out`; `interval` (seconds) and `sample_every` are auto mode's variables
  # (nil: auto's default).
  def profiler_env(out, interval: nil, sample_every: nil)
    {"RUBYOPT" => "-I#{LIB} -rdatadog_heap/auto", "DATADOG_HEAP_OUTPUT" => File.join(out, ""),
     "DATADOG_HEAP_INTERVAL" => interval&.to_s, "DATADOG_HEAP_SAMPLE_EVERY" => sample_every&.to_s}
  end

  # What this machine lacks to run the service: the puma and wrk executables, the sinatra library.
  def missing_tools(app = "sinatra")
    missing = %w[puma wrk].reject { |tool| executable(tool) }
    library, package = (app == "rails") ? ["rails", "ruby-rails"] : ["sinatra/base", "ruby-sinatra"]
    missing << "#{library} (#{package})" unless system(RbConfig.ruby, "-e", "require '#{library}'", out: File::NULL, err: File::NULL)
    missing
  end

  # The apps the benches can serve: the sinatra example service, and the Rails app of
  # examples/rails_leak (controllers, an ERB view, JSON, params; its leak off).
  APPS = %w[sinatra rails].freeze

  def executable(name)
    ENV.fetch("PATH", "").split(File::PATH_SEPARATOR).map { |d| File.join(d, name) }
       .find { |f| File.executable?(f) && !File.directory?(f) }
  end

  # "app.rb:LINE" of the line carrying `# <marker>` in the app.
  def site(marker)
    line = File.foreach(APP).with_index(1).find { |text, _| text.include?("# #{marker}") }&.last
    raise Error, "no `# #{marker}` line in #{APP}" unless line

    "#{APP}:#{line}"
  end

  def monotonic
    Process.clock_gettime(Process::CLOCK_MONOTONIC)
  end

  # A port on 127.0.0.1 nothing listens on (now).
  def free_port
    server = TCPServer.new("127.0.0.1", 0)
    server.addr[1]
  ensure
    server&.close
  end

  # Runs wrk with load.lua against `port` until it has `max_requests` responses (split over the
  # wrk threads) or `seconds` have passed, whichever comes first. Returns wrk's summary:
  # {requests:, duration_us:, errors:, latency_us: {p50:, p90:, p99:, max:, mean:},
  # requests_per_second:, capped:}; `capped` is true when the request bound ended the run.
  def wrk(port, seconds:, max_requests:, connections: 8, threads: 2, timeout: 5, app: "sinatra")
    per_thread = (max_requests.to_f / threads).ceil
    cmd = ["wrk", "-t#{threads}", "-c#{connections}", "-d#{seconds}s", "--timeout", "#{timeout}s",
      "-s", LOAD_SCRIPT, "http://127.0.0.1:#{port}", "--", per_thread.to_s]
    out = +""
    done = 0
    IO.popen({"LOAD_APP" => app}, cmd, err: [:child, :out]) do |io|
      io.each_line do |line|
        out << line
        next unless line.start_with?("WRK_THREAD_DONE")

        done += 1
        Process.kill("INT", io.pid) if done == threads
      end
    end
    raise Error, "#{cmd.join(" ")} failed (#{$?.inspect}):\n#{out}" unless $?.success?

    line = out.lines.grep(/\AWRK_JSON /).last or raise Error, "wrk printed no summary:\n#{out}"
    result = JSON.parse(line.delete_prefix("WRK_JSON "), symbolize_names: true)
    result[:requests_per_second] = result[:requests] / (result[:duration_us] / 1e6)
    result[:capped] = done == threads
    result
  end

  # A puma cluster of the example service, started with `env` added to this process's
  # environment, its output in `log`. Its own process group, so #kill_all reaches the workers.
  class Cluster
    BOOTED = /- Worker (\d+) \(PID: (\d+)\) booted/

    attr_reader :port, :pid, :log

    attr_reader :app

    def initialize(env: {}, log:, workers: 2, threads: 4, app: "sinatra")
      @port = ServiceCluster.free_port
      @log = log
      @workers = workers
      @app = app
      env = env.merge("PORT" => @port.to_s, "WORKERS" => workers.to_s, "THREADS" => threads.to_s, "SERVICE_APP" => app,
        "RAILS_ENV" => "production", "LEAKY_APP_LEAK" => env.fetch("LEAKY_APP_LEAK", "0"),
        "HEAP_SETTINGS" => env.fetch("HEAP_SETTINGS", '{"enabled": false}'))
      @pid = Process.spawn(env, "puma", "-C", PUMA_CONFIG, out: [log, "w"], err: [:child, :out], pgroup: true)
      @status = nil
    end

    # Every "Worker N (PID: P) booted" the log shows so far: [[index, pid], ...] in boot order.
    def boots
      File.read(@log).scan(BOOTED).map { |index, pid| [Integer(index), Integer(pid)] }
    end

    # Waits until `count` worker boots in all are in the log (the first boot of each worker by
    # default), then until the service answers. Raises with the log after `seconds`.
    def wait_booted(count = @workers, seconds: 60)
      deadline = ServiceCluster.monotonic + seconds
      until boots.size >= count
        raise Error, "puma exited (#{@status.inspect}) before #{count} worker boots:\n#{File.read(@log)}" if exited?
        raise Error, "fewer than #{count} worker boots after #{seconds}s:\n#{File.read(@log)}" if ServiceCluster.monotonic > deadline

        sleep 0.05
      end
      get("/health", deadline: deadline)
      self
    end

    # The body of GET `path`, retried until `deadline` while the port refuses connections.
    def get(path, deadline: ServiceCluster.monotonic + 10)
      begin
        response = Net::HTTP.start("127.0.0.1", @port, open_timeout: 2, read_timeout: 5) { |http| http.get(path) }
        raise Error, "GET #{path}: #{response.code}" unless response.code == "200"

        response.body
      rescue SystemCallError, Net::OpenTimeout, EOFError
        raise Error, "GET #{path}: no answer before the deadline" if ServiceCluster.monotonic > deadline

        sleep 0.05
        retry
      end
    end

    # The pids of the master's live child processes (its workers), from /proc.
    def worker_pids
      Dir["/proc/[0-9]*/stat"].filter_map do |stat|
        fields = File.read(stat).split(") ").last.split
        Integer(File.basename(File.dirname(stat))) if Integer(fields[1]) == @pid && fields[0] != "Z"
      rescue SystemCallError, ArgumentError
        nil
      end.sort
    end

    def signal(name, pid = @pid)
      Process.kill(name, pid)
    end

    def exited?
      @status ||= Process.wait2(@pid, Process::WNOHANG)&.last
      !@status.nil?
    end

    # SIGTERM to the master, then waits up to `seconds` for it to exit. Returns its
    # Process::Status, or nil when it (or a worker) was still running and got killed.
    def stop(seconds: 30)
      signal("TERM") unless exited?
      deadline = ServiceCluster.monotonic + seconds
      sleep 0.05 until exited? || ServiceCluster.monotonic > deadline
      return @status if exited? && group_gone?(deadline)

      kill_all
      nil
    end

    # SIGKILL to the whole process group; reaps the master.
    def kill_all
      Process.kill("KILL", -@pid)
    rescue Errno::ESRCH
      nil
    ensure
      begin
        @status ||= Process.wait2(@pid).last
      rescue Errno::ECHILD
        nil
      end
    end

    private

    # Whether the group's other processes (workers) are gone too, waiting until `deadline`.
    def group_gone?(deadline)
      loop do
        Process.kill(0, -@pid)
        return false if ServiceCluster.monotonic > deadline

        sleep 0.05
      end
    rescue Errno::ESRCH
      true
    end
  end
end
