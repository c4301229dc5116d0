# frozen_string_literal: true

require_relative "spec_helper"
require "zlib"
require "datadog_heap/middleware"

# DatadogHeap::Middleware through plain Rack env hashes (no rack gem needed); spec/stress/
# middleware_spec.rb serves it from puma and reads it with curl.
RSpec.describe DatadogHeap::Middleware do
  let(:app) { ->(_env) { [200, {"content-type" => "text/plain"}, ["the app"]] } }
  let(:recorder) { DatadogHeap::Recorder.new(sample_every: 1) }
  # Objects the recorder keeps: survivors of a GC, allocated at a line of this file.
  let(:kept) { [] }

  def request(middleware, path: "/debug/heap", query: "", method: "GET", remote: "127.0.0.1", headers: {})
    env = {"REQUEST_METHOD" => method, "PATH_INFO" => path, "QUERY_STRING" => query, "REMOTE_ADDR" => remote,
           "SCRIPT_NAME" => "", "SERVER_NAME" => "localhost", "SERVER_PORT" => "80"}.merge(headers)
    status, headers, body = middleware.call(env)
    [status, headers, body.to_a.join]
  end

  def record_some
    recorder.start
    50.times { kept << "kept #{kept.size}" * 3 }
    recorder.stop
    GC.start
  end

  after { recorder.stop }

  it "passes every other path to the app" do
    status, _, body = request(described_class.new(app, recorder: recorder), path: "/debug/heap/x", remote: "10.0.0.1")
    expect([status, body]).to eq([200, "the app"])
  end

  it "serves the recorder's live heap as gzip pprof to a loopback client" do
    record_some
    status, headers, body = request(described_class.new(app, recorder: recorder))
    expect(status).to eq(200)
    expect(headers["content-type"]).to eq("application/octet-stream")
    expect(headers["content-length"]).to eq(body.bytesize.to_s)
    expect(body.byteslice(0, 2).bytes).to eq([0x1f, 0x8b])
    profile = DatadogHeap::Profile.parse(body)
    expect(profile.sample_types.map(&:first)).to include("heap-live-samples")
    expect(profile.total_objects).to be >= kept.size
  end

  it "serves the text report with ?report=1, top and by" do
    record_some
    status, headers, body = request(described_class.new(app, recorder: recorder), query: "report=1&top=3&by=count")
    expect(status).to eq(200)
    expect(headers["content-type"]).to start_with("text/plain")
    expect(body).to include("live objects").and include("Top ").and include("by live objects")
    expect(body).to include(File.basename(__FILE__))
  end

  it "shows samples and ± per row in the text report" do
    record_some
    _, _, body = request(described_class.new(app, recorder: recorder), query: "report=1")
    expect(body).to match(/^ *live bytes +± +live objects +samples +share/)
  end

  it "serves IPv6 and IPv4-mapped loopback clients" do
    middleware = described_class.new(app, recorder: recorder)
    %w[::1 ::ffff:127.0.0.1 127.1.2.3].each do |remote|
      expect(request(middleware, remote: remote).first).to eq(200), remote
    end
  end

  it "answers 404 to a non-loopback client, a proxied one or one with no address, when there is no token" do
    middleware = described_class.new(app, recorder: recorder)
    ["10.0.0.1", "192.168.1.20", "2001:db8::1", "", "not an address"].each do |remote|
      status, _, body = request(middleware, remote: remote)
      expect([status, body]).to eq([404, "Not Found\n"]), remote
    end
    %w[HTTP_X_FORWARDED_FOR HTTP_FORWARDED HTTP_X_REAL_IP].each do |header|
      expect(request(middleware, headers: {header => "203.0.113.9"}).first).to eq(404), header
    end
  end

  context "with a token" do
    let(:middleware) { described_class.new(app, recorder: recorder, token: "s3cret-token") }

    it "serves any client sending the bearer token" do
      status, _, body = request(middleware, remote: "203.0.113.9", headers: {"HTTP_AUTHORIZATION" => "Bearer s3cret-token"})
      expect(status).to eq(200)
      expect(body.byteslice(0, 2).bytes).to eq([0x1f, 0x8b])
      expect(request(middleware, remote: "203.0.113.9", headers: {"HTTP_AUTHORIZATION" => "bearer  s3cret-token"}).first).to eq(200)
    end

    it "answers 403 to a missing, wrong or malformed token, loopback clients included" do
      [nil, "Bearer wrong", "Bearer s3cret-token2", "Bearer s3cret-toke", "s3cret-token", "Basic s3cret-token",
        "Bearer s3cret-token extra"].each do |auth|
        headers = auth ? {"HTTP_AUTHORIZATION" => auth} : {}
        status, _, body = request(middleware, headers: headers)
        expect([status, body]).to eq([403, "Forbidden\n"]), auth.inspect
      end
    end
  end

  it "answers 405 to other methods, 400 naming a bad query value, 503 without a recorder" do
    middleware = described_class.new(app, recorder: recorder)
    status, headers, = request(middleware, method: "POST")
    expect([status, headers["allow"]]).to eq([405, "GET"])
    {"top=0" => 'top must be an Integer between 1 and 1000, got "0"', "top=x" => 'got "x"',
     "by=age" => 'by must be size or count, got "age"', "report=maybe" => 'report must be 1 or 0, got "maybe"'}.each do |query, message|
      status, _, body = request(middleware, query: query)
      expect(status).to eq(400), query
      expect(body).to include(message)
    end
    allow(DatadogHeap).to receive(:recorder).and_return(nil)
    status, _, body = request(described_class.new(app))
    expect(status).to eq(503)
    expect(body).to include("not recording")
  end

  it "serves the process-wide recorder by default" do
    allow(DatadogHeap).to receive(:recorder).and_return(recorder)
    expect(recorder).to receive(:profile).and_call_original
    expect(request(described_class.new(app)).first).to eq(200)
  end

  it "answers 500 naming a failure instead of raising into the server" do
    allow(recorder).to receive(:profile).and_raise(NoMethodError, "boom")
    status, _, body = request(described_class.new(app, recorder: recorder))
    expect(status).to eq(500)
    expect(body).to include("NoMethodError: boom")
  end

  it "checks its options, naming the argument and the value (never the token's)" do
    expect { described_class.new(app, path: "debug") }.to raise_error(ArgumentError, /path must start with "\/".*"debug"/)
    expect { described_class.new(app, path: :x) }.to raise_error(TypeError, /path must be a String, got :x \(Symbol\)/)
    expect { described_class.new(app, token: "") }.to raise_error(ArgumentError, /token must not be empty/)
    expect { described_class.new(app, token: "two words") }.to raise_error(ArgumentError, /token must not contain whitespace/) { |e|
      expect(e.message).not_to include("two words")
    }
    expect { described_class.new(app, token: 12345) }.to raise_error(TypeError, /token must be a String or nil, got a Integer/)
    expect { described_class.new(app, token: 12345) }.to raise_error(TypeError) { |e| expect(e.message).not_to include("12345") }
    expect { described_class.new(app, recorder: "r") }.to raise_error(TypeError, /recorder must be a DatadogHeap::Recorder or nil, got "r"/)
  end

  it "compares tokens by value only" do
    expect(described_class.secure_compare("abc", "abc")).to be(true)
    expect(described_class.secure_compare("abc", "abd")).to be(false)
    expect(described_class.secure_compare("abc", "abcd")).to be(false)
    expect(described_class.secure_compare("", "a")).to be(false)
  end
end
