# frozen_string_literal: true

require "json"
require "open3"
require "rbconfig"
require "socket"
require "stringio"
require "tmpdir"
require "webrick"
require "datadog_heap/upload"
require "datadog_heap/cli"

# Uploads to real HTTP servers on 127.0.0.1: WEBrick decodes the multipart body (its own parser,
# not ours) the way the agent's intake reads it: the `event` part (event.json, application/json)
# and the `profile.pprof` part; the pprof must load in our reader and in `go tool pprof`.
RSpec.describe "uploading profiles" do
  # A WEBrick server answering every request with `status`, keeping what it read.
  class IntakeServer
    Request = Struct.new(:path, :query, :headers, :parts, keyword_init: true)

    attr_reader :url, :requests
    attr_accessor :status

    def initialize(status: 202)
      @status = status
      @requests = Queue.new
      @server = WEBrick::HTTPServer.new(BindAddress: "127.0.0.1", Port: 0, Logger: WEBrick::Log.new(File::NULL),
        AccessLog: [])
      @server.mount_proc("/") do |req, res|
        @requests << Request.new(path: req.path, query: WEBrick::HTTPUtils.parse_query(req.query_string.to_s),
          headers: req.header.transform_values(&:first), parts: req.query)
        res.status = @status
        res.body = "{}"
      end
      @thread = Thread.new { @server.start }
      @url = "http://127.0.0.1:#{@server.config[:Port]}"
    end

    def next_request(timeout = 10)
      @requests.pop(timeout: timeout) || raise("no request within #{timeout} s")
    end

    def all_requests
      out = []
      out << @requests.pop until @requests.empty?
      out
    end

    def stop
      @server.shutdown
      @thread.join
    end
  end

  # Accepts connections, reads, never answers.
  class HangingServer
    attr_reader :url

    def initialize
      @server = TCPServer.new("127.0.0.1", 0)
      @clients = []
      @thread = Thread.new do
        loop { @clients << @server.accept }
      rescue IOError
        nil
      end
      @url = "http://127.0.0.1:#{@server.addr[1]}"
    end

    def stop
      @server.close
      @thread.join
      @clients.each(&:close)
    end

    def connections
      @clients.size
    end
  end

  def dead_url
    server = TCPServer.new("127.0.0.1", 0)
    port = server.addr[1]
    server.close
    "http://127.0.0.1:#{port}"
  end

  let(:env) do
    {"DD_SERVICE" => "shop", "DD_ENV" => "test", "DD_VERSION" => "1.2.3", "DD_TAGS" => "team:heap,region:eu service:other"}
  end
  let(:dir) { Dir.mktmpdir("datadog-heap-upload") }

  after { FileUtils.remove_entry(dir) }

  def now_ns
    Process.clock_gettime(Process::CLOCK_REALTIME, :nanosecond)
  end

  # A recorder tracking a few strings that survived a GC.
  def recorder_with_live_objects
    rec = manual_recorder
    @kept = Array.new(5) { |i| "kept #{i}" }
    @kept.each { |s| record(rec, s) }
    rec.commit
    full_gc
    rec
  end

  def go_installed?
    ENV.fetch("PATH", "").split(File::PATH_SEPARATOR).any? { |d| File.executable?(File.join(d, "go")) }
  end

  def go_pprof_raw(bytes)
    path = File.join(dir, "uploaded-#{rand(1 << 30)}.pb.gz")
    File.binwrite(path, bytes)
    out, err, status = Open3.capture3({"HOME" => dir, "GOCACHE" => File.join(dir, "gocache")},
      "go", "tool", "pprof", "-raw", path)
    expect(status).to be_success, err
    out
  end

  describe "to a Datadog agent" do
    let(:server) { IntakeServer.new }

    after { server.stop }

    it "posts event.json and profile.pprof as the intake reads them, with the span and the tags" do
      upload = DatadogHeap::Upload.new(:agent, server.url, env)
      rec = recorder_with_live_objects
      before = now_ns
      expect(upload.push(rec)).to eq([1, nil, nil])
      after = now_ns

      request = server.next_request
      expect(request.path).to eq("/profiling/v1/input")
      expect(request.headers["dd-evp-origin"]).to eq("datadog_heap")
      expect(request.headers["dd-evp-origin-version"]).to eq(DatadogHeap::VERSION)
      expect(request.parts.keys).to contain_exactly("event", "profile.pprof")
      event_part = request.parts["event"]
      expect(event_part.filename).to eq("event.json")
      expect(event_part["content-type"]).to eq("application/json")
      event = JSON.parse(event_part.to_s)
      expect(event).to include("attachments" => ["profile.pprof"], "family" => "ruby", "version" => "4")
      start = Time.iso8601(event.fetch("start"))
      finish = Time.iso8601(event.fetch("end"))
      expect(start).to be <= finish
      expect(finish.to_r * 1_000_000_000).to be_between(before - 1_000_000_000, after + 1_000_000_000)

      tags = event.fetch("tags_profiler").split(",")
      expect(tags).to include("service:shop", "env:test", "version:1.2.3", "team:heap", "region:eu", "runtime:ruby",
        "language:ruby", "runtime_version:#{RUBY_VERSION}", "pid:#{Process.pid}", "profiler_version:#{DatadogHeap::VERSION}")
      expect(tags).not_to include("service:other") # DD_SERVICE wins over DD_TAGS
      expect(tags.grep(/\Aruntime_platform:/)).not_to be_empty # libdatadog's own

      pprof_part = request.parts["profile.pprof"]
      expect(pprof_part.filename).to eq("profile.pprof")
      profile = DatadogHeap::Profile.parse(pprof_part.to_s)
      expect(profile.sample_types).to eq([%w[heap-live-samples count], %w[heap-live-size bytes]])
      expect(profile.total_objects).to eq(5)
      info = profile.send(:info)
      expect(info[:time_nanos]).to eq((start.to_r * 1_000_000_000).to_i)
      expect(info[:time_nanos] + info[:duration_nanos]).to eq((finish.to_r * 1_000_000_000).to_i)

      # go is in bin/setup --dev's packages, not in the Ruby 3.3/3.4 chroots of .ci/run.
      skip "go is not installed (Debian: golang-go, which bin/setup --dev installs)" unless go_installed?
      raw = go_pprof_raw(pprof_part.to_s)
      expect(raw).to include("heap-live-samples/count heap-live-size/bytes")
      expect(raw).to match(/^Duration: /)
    end

    it "covers consecutive spans, each profile starting where the last ended" do
      upload = DatadogHeap::Upload.new(:agent, server.url, env)
      rec = recorder_with_live_objects
      2.times { upload.push(rec) }
      first, second = 2.times.map { JSON.parse(server.next_request.parts["event"].to_s) }
      expect(second["start"]).to eq(first["end"])
      expect(upload.stats).to include(upload_profiles_sent: 2, upload_queue_length: 0, upload_last_error: nil)
    end

    it "finds the agent from DD_AGENT_HOST and DD_TRACE_AGENT_PORT, or DD_TRACE_AGENT_URL" do
      port = URI(server.url).port
      expect(DatadogHeap::Upload.from_env({"DATADOG_HEAP_UPLOAD" => "agent", "DD_AGENT_HOST" => "127.0.0.1",
        "DD_TRACE_AGENT_PORT" => port.to_s}).url).to eq(server.url)
      upload = DatadogHeap::Upload.from_env({"DATADOG_HEAP_UPLOAD" => "agent", "DD_TRACE_AGENT_URL" => server.url,
        "DD_AGENT_HOST" => "elsewhere"})
      expect(upload.url).to eq(server.url)
      expect(upload.push(recorder_with_live_objects).first).to eq(1)
      expect(server.next_request.path).to eq("/profiling/v1/input")
    end

    it "sends from a forked child with the child's pid, on a client of the child's own" do
      upload = DatadogHeap::Upload.new(:agent, server.url, env)
      rec = recorder_with_live_objects
      upload.push(rec)
      parent_event = JSON.parse(server.next_request.parts["event"].to_s)
      exporter = upload.instance_variable_get(:@exporter)
      reader, writer = IO.pipe
      pid = fork do
        reader.close
        # The inherited exporter builds a client for this process; the Upload starts anew.
        exporter.enqueue("\x1f\x8b fake".b, start_ns: now_ns, end_ns: now_ns)
        inherited = exporter.flush
        upload.after_fork
        writer.write(Marshal.dump([inherited, upload.push(rec)]))
        writer.close
        exit!(0)
      end
      writer.close
      inherited, pushed = Marshal.load(reader.read)
      Process.wait(pid)
      expect(inherited).to eq([1, nil, nil])
      expect(pushed).to eq([1, nil, nil])
      child_events = server.all_requests.map { |r| JSON.parse(r.parts["event"].to_s) }
      expect(child_events.size).to eq(2)
      expect(child_events.last["tags_profiler"].split(",")).to include("pid:#{pid}")
      expect(parent_event["tags_profiler"].split(",")).to include("pid:#{Process.pid}")
    end
  end

  describe "in a child forked while another thread flushes" do
    it "uploads with state of the child's own, not the parent's flush that holds the locks" do
      hanging = HangingServer.new
      exporter = DatadogHeap::Exporter.new(backend: :agent, url: hanging.url, tags: ["service:shop"], timeout: 1)
      exporter.enqueue("\x1f\x8b parent".b, start_ns: now_ns, end_ns: now_ns)
      flusher = Thread.new { exporter.flush }
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 5
      sleep 0.01 until hanging.connections > 0 || Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
      expect(hanging.connections).to be > 0 # the parent's flush is in flight
      reader, writer = IO.pipe
      pid = fork do
        reader.close
        queued = exporter.stats[:upload_queue_length]
        exporter.enqueue("\x1f\x8b child".b, start_ns: now_ns, end_ns: now_ns)
        # Nobody answers the child either (the server's thread stayed in the parent): a timeout,
        # which is a real attempt, where the inherited state answered :busy forever.
        writer.write(Marshal.dump([queued, exporter.flush[0..1], exporter.stats[:upload_queue_length]]))
        writer.close
        exit!(0)
      end
      writer.close
      raise "the child did not answer within 20 s" unless reader.wait_readable(20)

      queued, flushed, left = Marshal.load(reader.read) # rubocop:disable Security/MarshalLoad
      Process.wait(pid)
      expect(queued).to eq(0) # the parent's profile stays the parent's
      expect(flushed).to eq([0, :timeout])
      expect(left).to eq(1)
      expect(flusher.value[0..1]).to eq([0, :timeout])
    ensure
      hanging&.stop
    end
  end

  describe "to Pyroscope" do
    let(:server) { IntakeServer.new(status: 200) }

    after { server.stop }

    it "posts the pprof to /ingest?format=pprof with the app name, labels and span" do
      upload = DatadogHeap::Upload.from_env(env.merge("DATADOG_HEAP_UPLOAD" => "pyroscope:#{server.url}",
        "PYROSCOPE_TENANT_ID" => "team-a"))
      expect(upload.backend).to eq(:pyroscope)
      expect(upload.push(recorder_with_live_objects)).to eq([1, nil, nil])
      request = server.next_request
      expect(request.path).to eq("/ingest")
      expect(request.query).to include("format" => "pprof", "spyName" => "datadog_heap",
        "name" => "shop{service=shop,env=test,version=1.2.3,team=heap,region=eu}")
      expect(Integer(request.query["until"])).to be >= Integer(request.query["from"])
      expect(request.headers["x-scope-orgid"]).to eq("team-a")
      expect(request.parts["profile"].filename).to eq("profile.pprof")
      expect(DatadogHeap::Profile.parse(request.parts["profile"].to_s).total_objects).to eq(5)
      config = JSON.parse(request.parts["sample_type_config"].to_s)
      expect(config.keys).to contain_exactly("heap-live-samples", "heap-live-size")
      expect(config["heap-live-size"]).to include("units" => "bytes", "aggregation" => "average")
    end
  end

  describe "when the endpoint fails" do
    # Runs `exporter.flush` on a thread while this one keeps running Ruby code: returns the flush
    # result, the seconds it took and how many loop turns this thread made meanwhile.
    def flush_beside_work(exporter)
      started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      flusher = Thread.new { exporter.flush }
      turns = 0
      turns += 1 while flusher.alive?
      [flusher.value, Process.clock_gettime(Process::CLOCK_MONOTONIC) - started, turns]
    end

    def exporter_with_profile(url, timeout: 10)
      exporter = DatadogHeap::Exporter.new(backend: :agent, url: url, tags: ["service:shop"], timeout: timeout)
      exporter.enqueue_profile(recorder_with_live_objects, since: now_ns)
      exporter
    end

    it "counts a dead port as a connection failure and keeps the profile" do
      exporter = exporter_with_profile(dead_url)
      result, = flush_beside_work(exporter)
      expect(result[0..1]).to eq([0, :connection])
      expect(exporter.stats).to include(upload_failures_connection: 1, upload_queue_length: 1)
      expect(exporter.stats[:upload_last_error]).to be_a(String)
    end

    it "gives up on a server that never answers after the timeout, without holding the GVL" do
      server = HangingServer.new
      exporter = exporter_with_profile(server.url, timeout: 0.5)
      result, seconds, turns = flush_beside_work(exporter)
      expect(result[0..1]).to eq([0, :timeout])
      expect(seconds).to be < 5
      expect(turns).to be > 1000 # this thread ran all along
      expect(exporter.stats).to include(upload_failures_timeout: 1, upload_queue_length: 1)
    ensure
      server&.stop
    end

    it "ends an upload in flight when its thread is killed" do
      server = HangingServer.new
      exporter = exporter_with_profile(server.url, timeout: 60)
      flusher = Thread.new { exporter.flush }
      sleep 0.2
      started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      flusher.kill
      expect(flusher.join(10)).to eq(flusher)
      expect(Process.clock_gettime(Process::CLOCK_MONOTONIC) - started).to be < 5
      expect(exporter.stats).to include(upload_failures_cancelled: 1, upload_queue_length: 1)
    ensure
      server&.stop
    end

    it "counts a 500 and drops the profile after three tries" do
      server = IntakeServer.new(status: 500)
      exporter = exporter_with_profile(server.url)
      3.times { expect(exporter.flush[0..1]).to eq([0, :http_status]) }
      expect(exporter.stats).to include(upload_failures_http_status: 3, upload_last_http_status: 500,
        upload_dropped_retries_exhausted: 1, upload_queue_length: 0)
    ensure
      server&.stop
    end

    it "warns once per run of failures, and once when uploads work again" do
      server = IntakeServer.new(status: 503)
      upload = DatadogHeap::Upload.new(:agent, server.url, env)
      rec = recorder_with_live_objects
      expect { 3.times { upload.push(rec) } }
        .to output(/\Adatadog_heap: could not upload heap profiles to #{Regexp.escape(server.url)} \(http_status\)[^\n]*\n\z/)
        .to_stderr
      # The oldest was tried three times and dropped; the two others wait.
      expect(upload.stats).to include(upload_failures_http_status: 3, upload_dropped_retries_exhausted: 1,
        upload_queue_length: 2)
      server.status = 202
      expect { expect(upload.push(rec)).to eq([3, nil, nil]) }
        .to output("datadog_heap: uploading heap profiles to #{server.url} again\n").to_stderr
      expect(upload.stats).to include(upload_profiles_sent: 3, upload_queue_length: 0, upload_last_error: nil)
    ensure
      server&.stop
    end

    it "keeps at most max_queue profiles, counting the ones dropped" do
      exporter = DatadogHeap::Exporter.new(backend: :agent, url: dead_url, max_queue: 2)
      rec = recorder_with_live_objects
      since = now_ns
      3.times { since = exporter.enqueue_profile(rec, since: since) }
      expect(exporter.stats).to include(upload_queue_length: 2, upload_dropped_queue_full: 1, upload_profiles_enqueued: 3)
    end
  end

  describe "configuration" do
    it "rejects bad arguments, naming them" do
      expect { DatadogHeap::Exporter.new(backend: :s3, url: "http://x") }.to raise_error(ArgumentError, /backend/)
      expect { DatadogHeap::Exporter.new(backend: :agent, url: "localhost:8126") }
        .to raise_error(ArgumentError, /agent url must be .* got localhost:8126/)
      expect { DatadogHeap::Exporter.new(backend: :agent, url: "http://x", tags: ["a:"]) }
        .to raise_error(ArgumentError, /tags must be .* got a:/)
      expect { DatadogHeap::Exporter.new(backend: :agent, url: "http://x", timeout: 0) }.to raise_error(ArgumentError, /timeout/)
      expect { DatadogHeap::Exporter.new(backend: :agent, url: "http://x", max_queue: 0) }.to raise_error(ArgumentError, /max_queue/)
      expect { DatadogHeap::Exporter.new(backend: :agent, url: 1) }.to raise_error(TypeError, /url/)
      expect { DatadogHeap::Exporter.new(backend: :pyroscope, url: "http://x") }.to raise_error(ArgumentError, /app_name/)
      expect { DatadogHeap::Exporter.allocate }.to raise_error(TypeError)
    end

    it "reads DATADOG_HEAP_UPLOAD's forms and warns about anything else" do
      target = ->(value, env = {}) { DatadogHeap::Upload.target(value, env) }
      expect(target.call("agent")).to eq([:agent, "http://localhost:8126"]) unless File.socket?(DatadogHeap::Upload::AGENT_SOCKET)
      expect(target.call("agent", {"DD_AGENT_HOST" => "::1"})).to eq([:agent, "http://[::1]:8126"])
      expect(target.call("unix:///run/apm.sock")).to eq([:agent, "unix:///run/apm.sock"])
      expect(target.call("pyroscope")).to eq([:pyroscope, "http://localhost:4040"])
      expect(target.call("pyroscope:https://p.example")).to eq([:pyroscope, "https://p.example"])
      expect(target.call("datadog")).to be_nil
      expect { expect(DatadogHeap::Upload.from_env({"DATADOG_HEAP_UPLOAD" => "s3://bucket"})).to be_nil }
        .to output(/ignoring DATADOG_HEAP_UPLOAD="s3:\/\/bucket"/).to_stderr
    end
  end

  # No message, warning or inspect may show a secret: URL credentials or the Pyroscope token.
  describe "secrets" do
    secret = "glc_SECRET"

    it "refuses a URL with credentials (never sent) without showing them, pointing at auth_token" do
      ["http://user:#{secret}@127.0.0.1:4040", "https://#{secret}@p.example", "http://u:p@ss:#{secret}@h.example/x"].each do |url|
        [{backend: :agent}, {backend: :pyroscope, app_name: "shop"}].each do |args|
          expect { DatadogHeap::Exporter.new(url: url, **args) }.to raise_error(ArgumentError) { |e|
            expect(e.message).to start_with("url must not carry credentials").and include("auth_token")
            expect(e.message).to include("[redacted]@")
            expect(e.message).not_to include(secret)
          }
        end
        expect { DatadogHeap::Upload.new(:agent, url, env) }.to raise_error(ArgumentError) { |e| expect(e.message).not_to include(secret) }
      end
      expect { DatadogHeap::Upload.from_env({"DATADOG_HEAP_UPLOAD" => "pyroscope:https://u:#{secret}@p.example"}) }
        .to raise_error(ArgumentError) { |e|
          expect(e.message).to include("https://[redacted]@p.example")
          expect(e.message).not_to include(secret)
        }
      expect { DatadogHeap::Upload.from_env({"DATADOG_HEAP_UPLOAD" => "s3://u:#{secret}@bucket"}) }
        .to output(%r{ignoring DATADOG_HEAP_UPLOAD="s3://\[redacted\]@bucket"}).to_stderr
      # A URL that only looks like it has an @ later on is fine.
      expect(DatadogHeap::Exporter.new(backend: :agent, url: "http://127.0.0.1:8126/a@b")).to be_a(DatadogHeap::Exporter)
    end

    it "never shows the auth token in an error" do
      pyroscope = {backend: :pyroscope, url: "http://127.0.0.1:4040", app_name: "shop"}
      expect { DatadogHeap::Exporter.new(**pyroscope, auth_token: "#{secret}\x01TOKEN") }
        .to raise_error(ArgumentError, /\Aauth_token must be printable ASCII/) { |e| expect(e.message).not_to include(secret) }
      expect { DatadogHeap::Exporter.new(**pyroscope, auth_token: "#{secret}\u00e9") }
        .to raise_error(ArgumentError) { |e| expect(e.message).not_to include(secret) }
      expect { DatadogHeap::Exporter.new(**pyroscope, auth_token: secret.to_sym) }
        .to raise_error(TypeError, /auth_token must be a String, got a Symbol/) { |e| expect(e.message).not_to include(secret) }
      expect { DatadogHeap::Exporter.new(backend: :agent, url: "http://127.0.0.1:8126", auth_token: secret) }
        .to raise_error(ArgumentError, /auth_token is for backend: :pyroscope only/) { |e| expect(e.message).not_to include(secret) }
      expect(DatadogHeap::Exporter.new(**pyroscope, auth_token: secret)).to be_a(DatadogHeap::Exporter)
    end

    it "keeps the token out of warnings and inspect" do
      secrets = env.merge("PYROSCOPE_AUTH_TOKEN" => secret, "DD_API_KEY" => "dd_#{secret}")
      url = dead_url
      upload = DatadogHeap::Upload.new(:pyroscope, url, secrets)
      expect(upload.inspect).to eq("#<DatadogHeap::Upload backend=:pyroscope url=#{url.inspect}>")
      expect(upload.instance_variable_get(:@exporter).inspect).not_to include(secret)
      expect { expect(upload.push(recorder_with_live_objects)[1]).to eq(:connection) }
        .to output(/could not upload heap profiles to #{Regexp.escape(url)} \(connection\)/).to_stderr
      expect(DatadogHeap::Redact.text("to http://u:#{secret}@h:1/x failed: #{secret}; unix:///run/apm.sock", secret))
        .to eq("to http://[redacted]@h:1/x failed: [redacted]; unix:///run/apm.sock")
    end

    it "refuses credentials in `datadog-heap run --upload` without showing them" do
      out, err = StringIO.new, StringIO.new
      code = DatadogHeap::CLI.new(out: out, err: err).run(["run", "--upload", "http://u:#{secret}@127.0.0.1:8126", "--", "true"])
      expect(code).to eq(2)
      expect(err.string).to include("--upload must not carry credentials").and include("[redacted]@127.0.0.1")
      expect(err.string).not_to include(secret)
      code = DatadogHeap::CLI.new(out: out, err: err).run(["run", "--upload", "s3://u:#{secret}@x", "--", "true"])
      expect(code).to eq(2)
      expect(err.string).not_to include(secret)
    end
  end

  describe "from datadog_heap/auto" do
    let(:lib) { File.expand_path("../lib", __dir__) }
    let(:script) do
      path = File.join(dir, "app.rb")
      File.write(path, <<~RUBY)
        require "json"
        kept = []
        deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + Float(ENV.fetch("APP_SECONDS", "1"))
        turns = 0
        while Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
          kept << "entry \#{turns} " * 10
          turns += 1
          sleep 0.001 if (turns % 500).zero?
        end
        puts JSON.generate({pid: Process.pid, turns: turns, stats: DatadogHeap::Auto.upload.stats})
      RUBY
      path
    end

    def auto_run(env)
      base = {"DATADOG_HEAP_OUTPUT" => nil, "DATADOG_HEAP_INTERVAL" => "0.2", "DATADOG_HEAP_SAMPLE_EVERY" => "64",
              "DD_TRACE_AGENT_URL" => nil, "DD_AGENT_HOST" => nil, "DD_TRACE_AGENT_PORT" => nil}
      # The recorder runs in the child; GC_STRESS here would only slow this process's test server
      # past the child's upload timeout.
      stress, GC.stress = GC.stress, false
      out, err, status = Open3.capture3(base.merge(self.env).merge(env), RbConfig.ruby, "-I", lib, "-rjson",
        "-rdatadog_heap/auto", script, chdir: dir)
      [out.empty? ? nil : JSON.parse(out), RecorderHelpers.without_incidental(err).lines, status.exitstatus]
    ensure
      GC.stress = stress unless stress.nil?
    end

    it "uploads every interval and at exit, and writes no file" do
      server = IntakeServer.new
      out, err, code = auto_run({"DATADOG_HEAP_UPLOAD" => server.url})
      expect([err, code]).to eq([[], 0])
      events = server.all_requests.map { |r| [JSON.parse(r.parts["event"].to_s), r.parts["profile.pprof"].to_s] }
      expect(events.size).to be >= 3 # every 0.2 s of a 1 s program, and the final one
      expect(events.map { |e, _| e["tags_profiler"].split(",") }).to all(include("pid:#{out["pid"]}", "service:shop"))
      expect(DatadogHeap::Profile.parse(events.last[1]).top(1).first.location).to start_with("#{script}:")
      expect(out["stats"]).to include("upload_failures_connection" => 0, "upload_dropped_queue_full" => 0)
      expect(Dir.children(dir)).to eq(["app.rb"])
    ensure
      server&.stop
    end

    it "uploads from `datadog-heap run --upload`, beside the files and the report" do
      server = IntakeServer.new
      exe = File.expand_path("../exe/datadog-heap", __dir__)
      out_dir = File.join(dir, "profiles")
      out, err, status = Open3.capture3(env.merge("DATADOG_HEAP_UPLOAD" => nil, "RUBYOPT" => nil), RbConfig.ruby, "-I", lib,
        exe, "run", "--out", out_dir, "--upload", server.url, "--", RbConfig.ruby, script, chdir: dir)
      expect(status.exitstatus).to eq(0), err
      expect(out).to include("1 profile in #{out_dir}")
      expect(server.all_requests.map(&:path)).to eq(["/profiling/v1/input"])

      _, err, status = Open3.capture3(RbConfig.ruby, "-I", lib, exe, "run", "--upload", "s3://x", "--", "true")
      expect(status.exitstatus).to eq(2)
      expect(err).to include("--upload must be agent")
    ensure
      server&.stop
    end

    {
      "a dead port" => [:dead, "upload_failures_connection", "connection"],
      "a server that hangs" => [:hang, "upload_failures_timeout", "timeout"],
      "a server answering 500" => [:error, "upload_failures_http_status", "http_status"]
    }.each do |what, (kind, counter, failure)|
      it "keeps the app running past #{what}, counts it and warns once" do
        server = {hang: -> { HangingServer.new }, error: -> { IntakeServer.new(status: 500) }}[kind]&.call
        url = server ? server.url : dead_url
        started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
        out, err, code = auto_run({"DATADOG_HEAP_UPLOAD" => url, "DATADOG_HEAP_UPLOAD_TIMEOUT" => "0.3"})
        took = Process.clock_gettime(Process::CLOCK_MONOTONIC) - started
        expect(code).to eq(0)
        expect(err.size).to eq(1), err.join
        expect(err.first).to include("could not upload heap profiles to #{url} (#{failure})")
        expect(out["stats"][counter]).to be >= 1
        expect(out["turns"]).to be > 1000
        # A 1 s program; the exit waits at most for the writer's upload and the final one.
        expect(took).to be < 10
      ensure
        server&.stop
      end
    end
  end
end
