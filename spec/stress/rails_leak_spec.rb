# frozen_string_literal: true

require "spec_helper"
require "json"
require "net/http"
require "socket"

# The leak-hunt preset finds the leak in a Rails app served by puma: examples/rails_leak/app.rb
# (a class-level log every request adds to), the Railtie with preset :leak_hunt and the
# endpoint, 2,000 requests of orders, searches and health checks, then /debug/heap?report=1. The
# leak's site is the top row, after a full GC (the preset's), resting on many samples.
# bench/rails_leak.rb runs it ten times a variant, beside the defaults.
RSpec.describe "the leak-hunt preset in a Rails app under puma", :stress do
  APP = File.expand_path("../../examples/rails_leak/config.ru", __dir__)

  before(:all) do
    rails = begin
      require "rails"
      true
    rescue LoadError
      false
    end
    skip "Rails or puma is not installed (Debian: ruby-rails, puma; bin/setup --dev)" unless rails && system("command -v puma > /dev/null")
  end

  it "puts the leak on top of the report" do
    port = TCPServer.new("127.0.0.1", 0).then { |s| s.addr[1].tap { s.close } }
    env = {"HEAP_SETTINGS" => JSON.generate(enabled: true, endpoint: true, preset: "leak_hunt"),
           "RAILS_ENV" => "production", "RUBYLIB" => File.expand_path("../../lib", __dir__)}
    err = Tempfile.new("puma")
    pid = Process.spawn(env, "puma", "-b", "tcp://127.0.0.1:#{port}", "-t", "4:4", APP, out: File::NULL, err: err.path)
    http = Net::HTTP.new("127.0.0.1", port)
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 60
    begin
      http.start
    rescue Errno::ECONNREFUSED
      raise "puma did not start: #{File.read(err.path)[-2000..]}" if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline

      sleep 0.2
      retry
    end
    2_000.times do |i|
      path = ["/orders/#{i}", "/orders/#{i}.json", "/search?q=blue+widget", "/health"][i % 4]
      expect(http.get(path).code).to eq("200"), path
    end
    report = http.get("/debug/heap?report=1&top=5").body
    rows = report.lines.grep(/\A\s*[\d.]+ (B|KiB|MiB|GiB)\s/)
    expect(rows.first).to match(/app\.rb:\d+ in ApplicationController#remember/), report
    expect(report).to include("a full GC ran just before this profile")
    expect(report).to match(/sampled 1 in 128 allocations/)
  ensure
    http&.finish if http&.started?
    if pid
      Process.kill("TERM", pid)
      Process.wait(pid)
    end
    err&.close!
  end
end
