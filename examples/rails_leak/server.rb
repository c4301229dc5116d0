# frozen_string_literal: true

require "json"
require "net/http"
require "socket"

# Serves examples/rails_leak with puma (single mode, 4 threads) for bench/rails_leak.rb and
# spec/stress/rails_leak_spec.rb.
module RailsLeak
  APP = File.expand_path("config.ru", __dir__)
  LIB = File.expand_path("../../lib", __dir__)

  module_function

  # A TCP port nothing listens on now.
  def free_port
    server = TCPServer.new("127.0.0.1", 0)
    server.addr[1]
  ensure
    server&.close
  end

  # Starts puma with `settings` (config.datadog_heap), yields a started Net::HTTP session to it,
  # then stops it (SIGTERM: the writer's last profile is written). Raises with puma's stderr
  # when it does not answer within `timeout` seconds.
  def with_server(settings, timeout: 60)
    port = free_port
    env = {"HEAP_SETTINGS" => JSON.generate(settings), "RAILS_ENV" => "production", "RUBYLIB" => LIB}
    err = File.join(Dir.tmpdir, "rails_leak-puma-#{Process.pid}-#{port}.log")
    pid = Process.spawn(env, "puma", "-b", "tcp://127.0.0.1:#{port}", "-t", "4:4", "--quiet", APP, out: File::NULL, err: err)
    http = Net::HTTP.new("127.0.0.1", port)
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + timeout
    begin
      http.start
    rescue Errno::ECONNREFUSED
      raise "puma did not answer in #{timeout} s: #{File.read(err)[-2000..]}" if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline

      sleep 0.2
      retry
    end
    yield http
  ensure
    http.finish if http&.started?
    if pid
      Process.kill("TERM", pid)
      Process.wait(pid)
    end
    File.unlink(err) if err && File.exist?(err)
  end
end
