# frozen_string_literal: true

require "open3"
require "rbconfig"
require "timeout"
require "tmpdir"
require_relative "stress_helper"

# DatadogHeap::Middleware served by puma (single mode, 127.0.0.1, an ephemeral port) and read with
# curl, as a user would: spec/fixtures/heap_endpoint.ru. Bounded: 400 app requests, then a
# handful of endpoint requests, each with curl's --max-time; puma is stopped with SIGTERM (SIGKILL
# after 10 s) whatever happens.
RSpec.describe "DatadogHeap::Middleware under puma, read with curl", :stress do
  TOKEN = "puma-spec-token"

  def which(name)
    ENV.fetch("PATH", "").split(File::PATH_SEPARATOR).map { |d| File.join(d, name) }.find { |f| File.executable?(f) }
  end

  before(:context) do
    missing = %w[puma curl].reject { |tool| which(tool) }
    unless missing.empty?
      skip "#{missing.join(", ")} not installed in this chroot" if ENV["RUBY_CHROOT"]
      raise "#{missing.join(", ")} not installed: run bin/setup --dev"
    end

    @dir = Dir.mktmpdir("middleware-puma-")
    @log = File.join(@dir, "puma.log")
    env = {"HEAP_TOKEN" => TOKEN, "RUBYOPT" => "-I#{File.expand_path("../../lib", __dir__)} #{ENV["RUBYOPT"]}".strip}
    @pid = Process.spawn(env, which("puma"), "--bind", "tcp://127.0.0.1:0", "--threads", "2:2",
      "--environment", "production", File.expand_path("../fixtures/heap_endpoint.ru", __dir__),
      out: @log, err: [:child, :out], pgroup: true)
    @port = Timeout.timeout(60) do
      loop do
        port = File.read(@log)[%r{Listening on (?:http|tcp)://127\.0\.0\.1:(\d+)}, 1]
        break Integer(port) if port
        raise "puma exited early:\n#{File.read(@log)}" if Process.wait(@pid, Process::WNOHANG)

        sleep 0.1
      end
    end
    # 400 kept Strings, about 25 sampled at 1 in 16: the app's site is a measured row (5 samples
    # or more) in all but about one run in a million (Poisson, mean 25: P(< 5) is 3e-7).
    400.times { |i| curl("/kept/#{i}") }
  end

  after(:context) do
    if @pid
      Process.kill("TERM", @pid)
      unless (Timeout.timeout(10) { Process.wait(@pid) } rescue nil)
        Process.kill("KILL", -@pid)
        Process.wait(@pid)
      end
    end
    FileUtils.rm_rf(@dir) if @dir
  end

  # [HTTP status, body] of GET `path` with curl.
  def curl(path, *args)
    body_file = File.join(@dir, "body")
    out, err, status = Open3.capture3("curl", "--silent", "--show-error", "--max-time", "30", "--output", body_file,
      "--write-out", "%{http_code}", *args, "http://127.0.0.1:#{@port}#{path}")
    raise "curl #{path} failed: #{err}" unless status.success?

    [Integer(out), File.binread(body_file)]
  end

  # With ?gc=1: a profile counts only objects that survived a GC, so without one the Strings kept
  # since the last GC are left out, and the app's site was sometimes too thin to rank (one run in
  # about 30).
  it "serves the live heap as gzip pprof to a loopback client" do
    status, body = curl("/debug/heap?gc=1")
    expect(status).to eq(200)
    expect(body.byteslice(0, 2).bytes).to eq([0x1f, 0x8b])
    profile = DatadogHeap::Profile.parse(body)
    expect(profile.period).to eq(16)
    expect(profile.top(5).map(&:label).join("\n")).to include("heap_endpoint.ru:")
  end

  it "serves the text report with ?report=1" do
    status, body = curl("/debug/heap?report=1&top=3&gc=1")
    expect(status).to eq(200)
    expect(body).to include("sampled 1 in 16 allocations").and include("heap_endpoint.ru:")
  end

  it "answers 403 to a wrong or missing token and 200 to the right one" do
    expect(curl("/debug/heap-token", "-H", "Authorization: Bearer wrong")).to eq([403, "Forbidden\n"])
    expect(curl("/debug/heap-token")).to eq([403, "Forbidden\n"])
    status, body = curl("/debug/heap-token", "-H", "Authorization: Bearer #{TOKEN}")
    expect(status).to eq(200)
    expect(body.byteslice(0, 2).bytes).to eq([0x1f, 0x8b])
  end

  it "answers 403 to a client that came through a proxy or asked for another Host, and passes other paths to the app" do
    status, body = curl("/debug/heap", "-H", "X-Forwarded-For: 203.0.113.9")
    expect([status, body]).to match([403, /forwarding header.*token/m])
    status, body = curl("/debug/heap", "-H", "Host: attacker.example")
    expect([status, body]).to match([403, /localhost, 127\.0\.0\.1 or \[::1\].*token/m])
    expect(curl("/debug/heap", "-H", "Host: localhost:#{@port}")[0]).to eq(200)
    status, body = curl("/other")
    expect([status, body]).to match([200, /\Akept \d+\n\z/])
  end
end
