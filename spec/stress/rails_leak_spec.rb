# frozen_string_literal: true

require "spec_helper"

# The leak-hunt preset finds the leak in a Rails app served by puma: examples/rails_leak/app.rb
# (a class-level log every request adds to), the Railtie with preset :leak_hunt and the
# endpoint, 2,000 requests of orders, searches and health checks, then /debug/heap?report=1. The
# leak's site is the top row, after a full GC (the preset's), resting on many samples.
# bench/rails_leak.rb runs it ten times a variant, beside the defaults.
RSpec.describe "the leak-hunt preset in a Rails app under puma", :stress do
  # Whether Rails is installed, asked of the gem index: requiring it here would load
  # ActiveSupport into this process, whose fork tracking then changes how every later spec forks.
  before(:all) do
    rails = begin
      Gem::Specification.find_by_name("railties")
      true
    rescue Gem::MissingSpecError
      false
    end
    skip "Rails or puma is not installed (Debian: ruby-rails, puma; bin/setup --dev)" unless rails && system("command -v puma > /dev/null")
  end

  it "puts the leak on top of the report" do
    require_relative "../../examples/rails_leak/server"
    RailsLeak.with_server({enabled: true, endpoint: true, preset: "leak_hunt"}) do |http|
      2_000.times do |i|
        path = ["/orders/#{i}", "/orders/#{i}.json", "/search?q=blue+widget", "/health"][i % 4]
        expect(http.get(path).code).to eq("200"), path
      end
      report = http.get("/debug/heap?report=1&top=5").body
      rows = report.lines.grep(/\A\s*~?[\d.]+ (B|KiB|MiB|GiB)\s/)
      expect(rows.first).to match(/app\.rb:\d+ in ApplicationController#remember/), report
      expect(report).to include("a full GC ran just before this profile")
      expect(report).to match(/sampled 1 in 128 allocations/)
    end
  end
end
