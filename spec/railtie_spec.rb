# frozen_string_literal: true

require_relative "spec_helper"
require "json"
require "open3"
require "rbconfig"
require "tmpdir"

# DatadogHeap::Railtie against the installed Rails (Debian's ruby-rails, 6.1 on bookworm). Each
# case boots spec/fixtures/rails_app.rb in a child process: one Rails application per process,
# and Rails' boot stays out of this process (GC_STRESS runs stay fast: the children are not
# stressed, the Railtie and middleware code they run is Ruby the GC_STRESS runs of
# middleware_spec.rb already cover). The children run at once, before the examples.
RAILS_AVAILABLE = begin
  Gem::Specification.find_by_name("railties")
  true
rescue Gem::MissingSpecError
  false
end

RSpec.describe "DatadogHeap::Railtie (Rails #{RAILS_AVAILABLE ? Gem::Specification.find_by_name("railties").version : "missing"})" do
  before(:all) { skip "Rails is not installed (Debian: apt-get install ruby-rails, as bin/setup --dev does)" unless RAILS_AVAILABLE }

  RAILS_APP_SCRIPT = File.expand_path("fixtures/rails_app.rb", __dir__)
  LOOPBACK = {"REMOTE_ADDR" => "127.0.0.1"}.freeze
  REMOTE = {"REMOTE_ADDR" => "198.51.100.7"}.freeze

  def self.boot(settings, requests, fork: false)
    env = {"RAILS_SETTINGS" => JSON.generate(settings), "RAILS_REQUESTS" => JSON.generate(requests),
           "RAILS_FORK" => fork ? "1" : "0", "GC_STRESS" => nil}
    Thread.new do
      out, err, status = Open3.capture3(env, RbConfig.ruby, "-I", File.expand_path("../lib", __dir__), RAILS_APP_SCRIPT)
      raise "rails_app.rb failed (#{status}): #{err}#{out}" unless status.success?

      JSON.parse(out.lines.last, symbolize_names: true).merge(stderr: err)
    end
  end

  before(:all) do
    @output = Dir.mktmpdir("railtie_spec")
    @children = {
      enabled: self.class.boot({enabled: true, sample_every: 64, max_overhead: nil, endpoint: true, output: @output},
        [["/hello", LOOPBACK], ["/debug/heap", LOOPBACK], ["/debug/heap?report=1&top=5", LOOPBACK], ["/debug/heap", REMOTE],
          ["/debug/heap", LOOPBACK.merge("HTTP_HOST" => "attacker.example")], ["/debug/heap", LOOPBACK.merge("HTTP_VIA" => "1.1 nginx")],
          ["/debug/heap", LOOPBACK.merge("HTTP_HOST" => "localhost:3000")]]),
      token_after_fork: self.class.boot({enabled: true, endpoint: true, endpoint_path: "/_heap", endpoint_token: "t0ken",
                                         start_after_fork: true, output: File.join(@output, "after_fork"), interval: 3600},
        [["/_heap", REMOTE.merge("HTTP_AUTHORIZATION" => "Bearer t0ken")], ["/_heap", LOOPBACK.merge("HTTP_AUTHORIZATION" => "Bearer nope")],
          ["/_heap", LOOPBACK]], fork: true),
      default: self.class.boot({}, [["/debug/heap", LOOPBACK], ["/hello", LOOPBACK]]),
      invalid: self.class.boot({enabled: true, sample_every: 0}, []),
      invalid_token: self.class.boot({endpoint: true, endpoint_token: ""}, []),
      upload_credentials: self.class.boot({enabled: true, upload: "pyroscope:https://heap:glc_SECRET@p.example"}, []),
    }
  end

  after(:all) { FileUtils.rm_rf(@output) if @output }

  def child(name)
    @children.fetch(name).value
  end

  it "starts the process-wide recorder with config.datadog_heap's settings and serves GET /debug/heap to loopback clients" do
    result = child(:enabled)
    expect(result).to include(started: true, recording: true, sample_every: 64, middleware: true)
    hello, pprof, report, remote, rebound, proxied, localhost = result[:responses]
    expect(hello).to eq([200, "text/plain", "hello from rails"])
    expect(pprof).to eq([200, "application/octet-stream", "1f8b"]) # gzip magic
    expect(report[0]).to eq(200)
    expect(report[2]).to include("sampled 1 in 64 allocations").and include("rails_app.rb:")
    expect(remote).to eq([404, "text/plain; charset=utf-8", "Not Found\n"])
    # Ahead of Rails' HostAuthorization (config.hosts is open here): the middleware's own checks.
    expect(rebound[0..1]).to eq([403, "text/plain; charset=utf-8"])
    expect(rebound[2]).to include("DNS rebinding").and include("config.datadog_heap.endpoint_token")
    expect(proxied[0]).to eq(403)
    expect(proxied[2]).to include("forwarding header")
    expect(localhost[0..1]).to eq([200, "application/octet-stream"])
  end

  it "writes a profile into config.datadog_heap.output at exit" do
    child(:enabled)
    files = Dir[File.join(@output, "heap-*-1.pb.gz")]
    expect(files.size).to eq(1)
    expect(DatadogHeap::Profile.load(files.first).period).to eq(64)
  end

  it "guards the endpoint with a bearer token at endpoint_path, and with start_after_fork records in forked children only" do
    result = child(:token_after_fork)
    expect(result).to include(started: false, recording: false, middleware: true)
    token_ok, token_wrong, no_token = result[:responses]
    expect(token_ok[0]).to eq(503) # let through, but the master does not record
    expect(token_ok[2]).to include("not recording")
    expect(token_wrong).to eq([403, "text/plain; charset=utf-8", "Forbidden\n"])
    expect(no_token[0]).to eq(403)
    expect(result[:child]).to eq(started: true, recording: true, auto: true,
      grandchild: {started: false, recording: true})
    expect(result[:stderr]).not_to include("already profiles")
  end

  it "does nothing unless configured" do
    result = child(:default)
    expect(result).to include(started: false, recording: false, middleware: false)
    expect(result[:responses][0][0]).to eq(404) # Rails' own: no route
    expect(result[:responses][1][0]).to eq(200)
  end

  it "refuses invalid settings at boot, naming the setting and the value" do
    expect(child(:invalid)[:boot_error]).to eq("ArgumentError: config.datadog_heap.sample_every must be between 1 and 4294967295, got 0")
    expect(child(:invalid_token)[:boot_error]).to eq("ArgumentError: config.datadog_heap.endpoint_token: token must not be empty (nil: loopback clients only)")
    expect(child(:upload_credentials)[:boot_error]).to start_with("ArgumentError: config.datadog_heap.upload must not carry credentials")
      .and end_with("got https://[redacted]@p.example")
    expect(child(:upload_credentials)[:boot_error]).not_to include("glc_SECRET")
  end
end
