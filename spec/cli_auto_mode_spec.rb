# frozen_string_literal: true

require "fileutils"
require "open3"
require "rbconfig"
require "socket"
require "timeout"
require "tmpdir"
require_relative "fixtures/profiles"
require "datadog_heap/auto_mode"

# The datadog-heap command in an environment that profiles every Ruby process: RUBYOPT carrying
# -rdatadog_heap/auto, as `datadog-heap run` gives its program (and so anything that program
# starts), or a shell that exports it. The command itself is not profiled, so it never waits at
# exit for a profile to be written or uploaded.
RSpec.describe "datadog-heap under RUBYOPT=-rdatadog_heap/auto" do
  let(:lib) { File.expand_path("../lib", __dir__) }
  let(:exe) { File.expand_path("../exe/datadog-heap", __dir__) }

  let(:dir) { Dir.mktmpdir("datadog-heap-cli-auto") }
  let(:keep) { [] }

  after { FileUtils.remove_entry(dir) }

  def profile_file(name, objects)
    keep.concat(objects)
    write_fixture(recorder_with(objects), dir, name)
    File.join(dir, name)
  end

  def two_profiles
    [profile_file("old.pb.gz", strings_at(ProfileFixtures::CACHE_SITE, 10)),
      profile_file("new.pb.gz", strings_at(ProfileFixtures::CACHE_SITE, 30))]
  end

  def auto_env(extra = {})
    {"RUBYOPT" => "-I#{lib} -rdatadog_heap/auto", "DATADOG_HEAP_MAX_PROFILE_BYTES" => nil}.merge(extra)
  end

  # Runs the command; [stdout, stderr, status, seconds]. Killed (and the example failed) past
  # `limit` seconds.
  def run_cli(env, *args, limit:)
    started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    out = err = status = nil
    Open3.popen3(env, RbConfig.ruby, exe, *args) do |stdin, stdout, stderr, wait|
      stdin.close
      readers = [Thread.new { stdout.read }, Thread.new { stderr.read }]
      unless wait.join(limit)
        Process.kill("KILL", wait.pid)
        wait.join
        raise "datadog-heap #{args.first} did not exit within #{limit} s"
      end
      out, err = readers.map(&:value)
      status = wait.value
    end
    [out, err, status, Process.clock_gettime(Process::CLOCK_MONOTONIC) - started]
  end

  it "writes no profile of itself where DATADOG_HEAP_OUTPUT points" do
    old, new = two_profiles
    output = File.join(dir, "profiles", "")
    out, err, status, = run_cli(auto_env("DATADOG_HEAP_OUTPUT" => output), "diff", old, new, limit: 60)
    expect(status).to be_success, err
    expect(out).to include("leaky_cache.rb:17")
    expect(Dir.glob(File.join(output, "*"))).to eq([])
  end

  it "exits without waiting on an upload to a backend that never answers" do
    old, new = two_profiles
    # Accepts connections and reads them, never answers: each upload waits for its timeout.
    server = TCPServer.new("127.0.0.1", 0)
    held = []
    acceptor = Thread.new { loop { held << server.accept } }
    env = auto_env("DATADOG_HEAP_UPLOAD" => "http://127.0.0.1:#{server.addr[1]}", "DATADOG_HEAP_UPLOAD_TIMEOUT" => "600")
    # Before, the exit handler sent the command's own profile and waited the upload's timeout
    # (600 s here, 10 s by default) at zero CPU.
    out, err, status, seconds = run_cli(env, "diff", old, new, limit: 30)
    expect(status).to be_success, err
    expect(out).to include("leaky_cache.rb:17")
    expect(seconds).to be < 15
    expect(held).to eq([])
  ensure
    acceptor&.kill
    held&.each(&:close)
    server&.close
  end

  it "gives a profiled program's final upload at most Auto::STOP_TIMEOUT at exit, whatever the upload's timeout" do
    server = TCPServer.new("127.0.0.1", 0)
    held = []
    acceptor = Thread.new { loop { held << server.accept } }
    script = File.join(dir, "app.rb")
    File.write(script, "keep = Array.new(1000) { |i| \"s\#{i}\" }\nputs keep.size\n")
    env = auto_env("DATADOG_HEAP_UPLOAD" => "http://127.0.0.1:#{server.addr[1]}", "DATADOG_HEAP_UPLOAD_TIMEOUT" => "600")
    started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    out, err, status = Open3.capture3(env, "timeout", "-s", "KILL", "60", RbConfig.ruby, script)
    seconds = Process.clock_gettime(Process::CLOCK_MONOTONIC) - started
    expect(status).to be_success, err
    expect(out).to eq("1000\n")
    # Before, it waited the upload's 600 s.
    expect(err).to include("datadog_heap/auto: gave up sending the final profile after #{DatadogHeap::Auto::STOP_TIMEOUT} s")
    expect(seconds).to be_between(DatadogHeap::Auto::STOP_TIMEOUT, DatadogHeap::Auto::STOP_TIMEOUT + 20)
    expect(held.size).to eq(1)
  ensure
    acceptor&.kill
    held&.each(&:close)
    server&.close
  end

  it "still profiles a Ruby program datadog-heap run starts" do
    script = File.join(dir, "app.rb")
    File.write(script, "keep = Array.new(20_000) { |i| \"s\#{i}\" }\nputs keep.size\n")
    out, err, status, = run_cli({"DATADOG_HEAP_MAX_PROFILE_BYTES" => nil}, "run", "--out", File.join(dir, "run"), "--",
      RbConfig.ruby, script, limit: 60)
    expect(status).to be_success, err
    expect(Dir.glob(File.join(dir, "run", "heap-*.pb.gz"))).not_to be_empty
    expect(out).to include("20000")
  end
end
