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

  describe "?workers=1" do
    # Processes that stand for other workers, killed after each example.
    let(:workers) { [] }

    def worker
      pid = Process.spawn(RbConfig.ruby, "-e", "sleep 30")
      workers << pid
      pid
    end

    def dead_pid
      pid = Process.spawn(RbConfig.ruby, "-e", "exit")
      Process.wait(pid)
      pid
    end

    # Writes `bytes` as `name` in `dir`, modified `age` seconds ago.
    def plant(dir, name, bytes, age: 0)
      path = File.join(dir, name)
      File.binwrite(path, bytes)
      at = Time.now - age
      File.utime(at, at, path)
      path
    end

    after do
      workers.each do |pid|
        Process.kill("KILL", pid)
        Process.wait(pid)
      end
    end

    it "sums this worker's heap now and the newest fresh file of each other live worker, listing what it took and skipped" do
      record_some
      Dir.mktmpdir do |dir|
        one, two = worker, worker
        dead = dead_pid
        # A profile far larger than this process's: summed in, it would be most of the total.
        big = DatadogHeap::Recorder.new(sample_every: 1)
        big.start
        kept.concat(Array.new(2000) { |i| "planted #{i}" * 20 })
        big.stop
        GC.start
        planted = big.profile
        # This heap as a file, after that GC: the heap read live below is then the same (a GC in
        # between could take an object from one and not the other; Ruby 3.3 did).
        bytes = recorder.profile
        # After a restart with a persistent directory: pid 1 (init, or the container's first
        # process) wrote this an hour ago, in an earlier run.
        plant(dir, "heap-1-999.pb.gz", planted, age: 3600)
        # A live worker's files: the higher number is older (its pid was reused by this run).
        plant(dir, "heap-#{one}-1.pb.gz", bytes, age: 5)
        plant(dir, "heap-#{one}-9.pb.gz", planted, age: 40)
        # A live pid whose newest file is stale: it stopped writing ten minutes ago.
        plant(dir, "heap-#{two}-3.pb.gz", planted, age: 600)
        plant(dir, "heap-#{dead}-5.pb.gz", planted)
        plant(dir, "heap-#{Process.pid}-2.pb.gz", planted)
        plant(dir, "other-#{one}-9.pb.gz", planted)
        middleware = described_class.new(app, recorder: recorder, workers_dir: dir, workers_max_age: 60)
        status, _, body = request(middleware, query: "report=1&workers=1")
        expect(status).to eq(200), body
        expect(body.lines.first).to include("2 profiles summed (heap of pid #{Process.pid}, #{dir}/heap-#{one}-1.pb.gz)")
        notes = body.lines.grep(/\ANote: datadog_heap: workers=1/).map { |line| line.chomp.sub("Note: datadog_heap: workers=1: ", "") }
        expect(notes.first).to eq("this process's heap (pid #{Process.pid}) now, plus the newest file of each other worker " \
          "written in the last 60 s in #{dir}: 1 taken, 5 skipped")
        expect(notes).to include("took heap-#{one}-1.pb.gz (pid #{one}, written 5 s ago)",
          "skipped heap-#{one}-9.pb.gz: pid #{one} wrote heap-#{one}-1.pb.gz after it (the newest file of a pid is taken)",
          a_string_starting_with("skipped heap-#{two}-3.pb.gz: written 10 min ago, more than 60 s"),
          "skipped heap-#{dead}-5.pb.gz: pid #{dead} is not running",
          "skipped heap-#{Process.pid}-2.pb.gz: this process's own file (its heap is read live instead)")
        # pid 1 is alive for root (then its file is an hour old) and another user's otherwise.
        expect(notes).to include(a_string_matching(/\Askipped heap-1-999\.pb\.gz: (written 60 min ago|pid 1 belongs to another user)/))
        expect(notes.join).not_to include("other-#{one}")
        # What was summed: twice this heap (this process now, and the file of the same bytes).
        own = DatadogHeap::Profile.parse(bytes).total_objects
        expect(body.lines.first).to include(" #{2 * own} live objects")

        # The same in the HTML page's notes.
        status, _, page = request(middleware, query: "html=1&workers=1")
        expect(status).to eq(200)
        expect(page).to include("<li>datadog_heap: workers=1: took heap-#{one}-1.pb.gz", "skipped heap-1-999.pb.gz: ")
      end
    end

    it "skips a file whose process kill(0) refuses with EPERM: another user's, not one of this app's workers" do
      record_some
      Dir.mktmpdir do |dir|
        foreign = worker
        plant(dir, "heap-#{foreign}-1.pb.gz", recorder.profile)
        allow(Process).to receive(:kill).and_call_original
        allow(Process).to receive(:kill).with(0, foreign).and_raise(Errno::EPERM)
        _, _, body = request(described_class.new(app, recorder: recorder, workers_dir: dir, workers_max_age: 60), query: "report=1&workers=1")
        expect(body.lines.first).to start_with("heap of pid #{Process.pid}:")
        expect(body).to include("skipped heap-#{foreign}-1.pb.gz: pid #{foreign} belongs to another user, so it is not one of this app's workers")
      end
    end

    it "names the first 20 files it skips, and counts the others by reason" do
      record_some
      Dir.mktmpdir do |dir|
        bytes = recorder.profile
        # Files of a persistent directory: many old runs' and one live worker that stopped writing.
        dead = dead_pid
        30.times { |n| plant(dir, "heap-#{dead}-#{n + 1}.pb.gz", bytes) }
        stopped = worker
        plant(dir, "heap-#{stopped}-1.pb.gz", bytes, age: 7200)
        _, _, body = request(described_class.new(app, recorder: recorder, workers_dir: dir, workers_max_age: 60), query: "report=1&workers=1")
        notes = body.lines.grep(/\ANote: datadog_heap: workers=1: /)
        expect(notes.grep(/: skipped /).size).to eq(20)
        expect(notes.last.chomp).to eq("Note: datadog_heap: workers=1: 11 more skipped: 10 of processes not running, 1 stale")
      end
    end

    it "needs report=1 or html=1, a directory and a maximum age" do
      Dir.mktmpdir do |dir|
        status, _, body = request(described_class.new(app, recorder: recorder, workers_dir: dir, workers_max_age: 60), query: "workers=1")
        expect([status, body]).to match([400, a_string_including("workers= shapes the report: it needs report=1 or html=1")])
        status, _, body = request(described_class.new(app, recorder: recorder), query: "report=1&workers=1")
        expect([status, body]).to match([400, a_string_including("needs a directory")])
        status, _, body = request(described_class.new(app, recorder: recorder, workers_dir: dir), query: "report=1&workers=1")
        expect([status, body]).to match([400, a_string_including("workers=1 needs to know how often the workers write", "workers_max_age:")])
      end
      expect { described_class.new(app, workers_max_age: 0) }.to raise_error(ArgumentError, /workers_max_age must be above 0 .*got 0/)
      expect { described_class.new(app, workers_max_age: "60") }.to raise_error(TypeError, /workers_max_age must be a number, got "60"/)
    end

    it "allows three writer intervals, at least 10 seconds (the Railtie passes config.datadog_heap.interval)" do
      expect(DatadogHeap::WorkersView.max_age_for(60)).to eq(180)
      expect(DatadogHeap::WorkersView.max_age_for(1)).to eq(10)
    end
  end

  # The query is strict: what the endpoint does not take is a 400 naming what it does take.
  describe "the query" do
    let(:middleware) { described_class.new(app, recorder: recorder) }

    def refused(query)
      status, _, body = request(middleware, query: query)
      expect(status).to eq(400), "#{query}: #{status} #{body[0, 200]}"
      body
    end

    it "refuses an unknown parameter, naming it and the accepted ones" do
      record_some
      ["foo=1", "report=1&foo=1", "Report=1", "html=1&colour=red", "report=1&top=3&groups=gem"].each do |query|
        name = query[/(?:\A|&)(foo|Report|colour|groups)=/, 1]
        expect(refused(query)).to eq("datadog_heap: unknown parameter \"#{name}\": the endpoint takes report, html, top, by, " \
          "group, wide, gc, retainers, workers (docs/http-endpoint.md)\n")
      end
    end

    it "refuses a parameter given twice" do
      expect(refused("report=1&report=1")).to include("report is given more than once")
      expect(refused("report=1&top=3&top=4")).to include("top is given more than once")
    end

    it "reads every flag the same way: 1 or true, 0 or false, nothing else" do
      record_some
      %w[report html wide gc retainers workers].each do |flag|
        ["yes", "no", "2", "on", "TRUE", "", "1 "].each do |value|
          query = "#{flag}=#{URI.encode_www_form_component(value)}"
          query = "report=1&#{query}" if %w[wide workers].include?(flag)
          expect(refused(query)).to include("#{flag} must be 1 or true, 0 or false, got #{value.inspect}")
        end
      end
      expect(request(middleware, query: "report=true")[1]["content-type"]).to start_with("text/plain")
      expect(request(middleware, query: "report=1&html=false")[1]["content-type"]).to start_with("text/plain")
      %w[report=0 report=false html=0].each do |query|
        expect(request(middleware, query: query)[1]["content-type"]).to eq("application/octet-stream"), query
      end
      expect(request(middleware, query: "report=1&gc=true")[2]).to include("a full GC ran just before this profile")
      expect(request(middleware, query: "report=1&gc=false")[2]).to include("no full GC ran just before this profile")
    end

    it "writes retainer paths with hash keys by class and size for retainers=1, and as they are only for retainers=values" do
      stub_const("MiddlewareSpecMemo", {})
      recorder.start
      40.times { |i| MiddlewareSpecMemo["secret-token-#{i}"] = "cached value #{i}" * 3 }
      recorder.stop
      GC.start
      paths = lambda do |query|
        status, _, body = request(middleware, query: query)
        expect(status).to eq(200), body
        DatadogHeap::Profile.parse(body).samples.filter_map(&:retained_by)
      end
      redacted = paths.call("retainers=1")
      expect(redacted.grep(/MiddlewareSpecMemo/)).not_to be_empty
      expect(redacted.grep(/secret-token/)).to be_empty
      expect(paths.call("retainers=values").grep(/MiddlewareSpecMemo.*secret-token-\d+/)).not_to be_empty
      expect(refused("retainers=value")).to include("retainers must be 1 or true, 0 or false, got \"value\" (or values")
    end

    it "refuses report options without a report: the pprof is the whole heap" do
      {"top=5" => "top=", "by=count" => "by=", "group=gem" => "group=", "wide=1" => "wide=", "report=0&top=3" => "top="}.each do |query, name|
        expect(refused(query)).to include("#{name} shapes the report: it needs report=1 or html=1"), query
      end
      # gc= and retainers= shape the pprof too.
      expect(request(middleware, query: "gc=1&retainers=0")[0]).to eq(200)
    end

    it "groups and ranks as `datadog-heap report --group/--by` do, and refuses what they refuse" do
      record_some
      {"group=class" => /^Top \d+ of \d+ class(es)? by live bytes/, "group=file" => /^Top \d+ of \d+ files? by live bytes/,
       "group=location" => /^Top \d+ of \d+ locations? by live bytes/, "group=gem" => /^Top \d+ of \d+ gems? by live bytes/,
       "group=site&by=count" => /^Top \d+ of \d+ sites? by live objects/, "by=size" => /^Top \d+ of \d+ sites? by live bytes/}.each do |query, header|
        status, _, body = request(middleware, query: "report=1&#{query}")
        expect(status).to eq(200), query
        expect(body).to match(header), "#{query}:\n#{body}"
      end
      classes = request(middleware, query: "report=1&group=class")[2]
      expect(classes).to match(/^ .*  String$/)
      expect(request(middleware, query: "html=1&group=file")[2]).to match(/<h2>Top \d+ of \d+ files? by live bytes<\/h2>/)
      expect(refused("report=1&group=frame")).to include('group must be site, location, file, gem or class (as `datadog-heap report --group`), got "frame"')
      expect(refused("report=1&by=bytes")).to include('by must be size or count (as `datadog-heap report --by`), got "bytes"')
      expect(refused("report=1&top=10000")).to include('top must be an Integer between 1 and 1000, got "10000"')
      expect(refused("report=1&top=1e3")).to include('got "1e3"')
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
    {"report=1&top=0" => 'top must be an Integer between 1 and 1000, got "0"', "report=1&top=x" => 'got "x"',
     "report=1&by=age" => 'by must be size or count (as `datadog-heap report --by`), got "age"',
     "report=maybe" => 'report must be 1 or true, 0 or false, got "maybe"'}.each do |query, message|
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
