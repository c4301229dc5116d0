# frozen_string_literal: true

require_relative "spec_helper"
require "zlib"
require "tmpdir"
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

  it "runs a full GC first with ?gc=1 (by default with the leak-hunt preset), and says whether one ran" do
    record_some
    middleware = described_class.new(app, recorder: recorder)
    gcs = GC.count
    _, _, with_gc = request(middleware, query: "report=1&gc=1")
    expect(GC.count).to be > gcs
    expect(with_gc).to include("Note: datadog_heap: a full GC ran just before this profile")
    _, _, plain = request(middleware, query: "report=1")
    expect(plain).to include("Note: datadog_heap: no full GC ran just before this profile")
    expect(request(middleware, query: "gc=maybe")[0]).to eq(400)
    hunt = DatadogHeap::Recorder.new(preset: :leak_hunt)
    _, _, hunted = request(described_class.new(app, recorder: hunt), query: "report=1")
    expect(hunted).to include("a full GC ran just before this profile")
  end

  it "sums this worker's heap and the latest profile of every other live worker with ?workers=1" do
    record_some
    Dir.mktmpdir do |dir|
      other = Process.spawn(RbConfig.ruby, "-e", "sleep 30")
      dead = Process.spawn(RbConfig.ruby, "-e", "exit")
      Process.wait(dead)
      bytes = recorder.profile
      %W[heap-#{other}-1 heap-#{other}-2 heap-#{dead}-5 other-#{other}-9].each { |name| File.binwrite(File.join(dir, "#{name}.pb.gz"), bytes) }
      middleware = described_class.new(app, recorder: recorder, workers_dir: dir)
      status, _, body = request(middleware, query: "report=1&workers=1")
      expect(status).to eq(200), body
      expect(body.lines.first).to include("2 profiles summed").and include("heap-#{other}-2.pb.gz")
      expect(body).not_to include("heap-#{dead}-5")
      expect(body).not_to include("heap-#{other}-1.pb.gz")
      expect(request(middleware, query: "workers=1")[0]).to eq(400)
      expect(request(described_class.new(app, recorder: recorder), query: "report=1&workers=1")[2]).to include("needs a directory")
    ensure
      if other
        Process.kill("KILL", other)
        Process.wait(other)
      end
    end
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

  it "answers 404 to a non-loopback client or one with no address, when there is no token" do
    middleware = described_class.new(app, recorder: recorder)
    ["10.0.0.1", "192.168.1.20", "2001:db8::1", "", "not an address"].each do |remote|
      status, _, body = request(middleware, remote: remote, headers: {"HTTP_HOST" => "localhost"})
      expect([status, body]).to eq([404, "Not Found\n"]), remote
    end
  end

  # A loopback client may still be a web page the developer opened (DNS rebinding: the page's
  # own name now resolves to 127.0.0.1) or any client behind a proxy on this host.
  describe "without a token, a loopback client" do
    let(:middleware) { described_class.new(app, recorder: recorder) }

    it "is served for a loopback Host with any port, or with no Host header" do
      ["localhost", "LocalHost:3000", "127.0.0.1", "127.0.0.1:9292", "127.1.2.3:80", "[::1]", "[::1]:8080", nil].each do |host|
        headers = host ? {"HTTP_HOST" => host} : {}
        expect(request(middleware, headers: headers).first).to eq(200), host.inspect
      end
      expect(request(middleware, remote: "::1", headers: {"HTTP_HOST" => "[::1]:9292"}).first).to eq(200)
    end

    it "gets 403 for any other Host (DNS rebinding), saying how to set a token and echoing nothing" do
      ["attacker.example", "attacker.example:9292", "localhost.attacker.example", "127.0.0.1.nip.io",
        "evil-localhost", "10.0.0.1:80", "[::2]", "[2001:db8::1]:80", "localhost:80:80", "localhost:x", ""].each do |host|
        status, headers, body = request(middleware, headers: {"HTTP_HOST" => host})
        expect(status).to eq(403), host.inspect
        expect(headers["content-type"]).to eq("text/plain; charset=utf-8")
        expect(body).to include("localhost, 127.0.0.1 or [::1]").and include("token").and include("Authorization: Bearer")
        expect(body).not_to include(host) unless host.empty? || "localhost, 127.0.0.1 or [::1]".include?(host)
      end
    end

    it "gets 403 when the request carries any proxy's forwarding header, whatever the Host" do
      %w[HTTP_FORWARDED HTTP_X_FORWARDED_FOR HTTP_X_FORWARDED_PROTO HTTP_X_FORWARDED_HOST HTTP_X_FORWARDED_PORT
        HTTP_X_FORWARDED_SERVER HTTP_X_FORWARDED HTTP_VIA HTTP_X_REAL_IP HTTP_CF_CONNECTING_IP HTTP_TRUE_CLIENT_IP
        HTTP_X_CLIENT_IP HTTP_X_ENVOY_EXTERNAL_ADDRESS].each do |header|
        [nil, "localhost:3000"].each do |host|
          headers = {header => "203.0.113.9-secret-marker"}
          headers["HTTP_HOST"] = host if host
          status, _, body = request(middleware, headers: headers)
          expect(status).to eq(403), "#{header} (Host #{host.inspect})"
          expect(body).to include("forwarding header").and include("Authorization: Bearer <token>")
          expect(body).not_to include("secret-marker")
        end
      end
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

    it "does not look at Host or proxy headers" do
      headers = {"HTTP_AUTHORIZATION" => "Bearer s3cret-token", "HTTP_HOST" => "heap.example:443",
                 "HTTP_X_FORWARDED_FOR" => "203.0.113.9", "HTTP_VIA" => "1.1 proxy"}
      expect(request(middleware, headers: headers).first).to eq(200)
      expect(request(middleware, headers: headers.merge("HTTP_AUTHORIZATION" => "Bearer wrong")).first).to eq(403)
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
