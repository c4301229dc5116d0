# frozen_string_literal: true

require "spec_helper"
require "open3"
require "tmpdir"

# bin/demo's promise (README, "Find a leak"): on every run the leak (examples/leaky_app.rb's
# LeakyCache#remember) is the top row of the hunt's report, measured (not rough) with a ± far from
# zero, `why` names the constant holding it, and one line says what the gem's defaults saw of the
# same run. bin/demo is examples/demo.rb after bin/setup and rake compile; this runs the script,
# once, in a child process (about 4 s here).
RSpec.describe "the demo (examples/demo.rb)" do
  root = File.expand_path("..", __dir__)
  demo = File.join(root, "examples", "demo.rb")

  # :heavy: skipped under GC_STRESS, which the child does not run under.
  it "puts the leak on top with a ± that excludes zero, names its holder, and shows the defaults' view", :heavy do
    Dir.mktmpdir("demo-spec-") do |dir|
      # A hung child fails the example instead of the run.
      out, status = Open3.capture2e("timeout", "-s", "KILL", "120", RbConfig.ruby, "-I", File.join(root, "lib"), demo,
        "--out", dir, chdir: root)
      expect(status).to be_success, "examples/demo.rb failed (#{status}):\n#{out}"

      profile = DatadogHeap::Profile.load(File.join(dir, "heap.pb.gz"))
      rough, measured = profile.top(2**62 - 1).partition(&:rough?)
      sites = measured + rough # the order `datadog-heap report` lists them in
      leak = sites.first
      expect(leak.function).to eq("LeakyCache#remember"), "top site: #{leak.label}\n#{out}"
      expect(leak).not_to be_rough
      # Far from zero: three standard deviations below the estimate is still above it.
      expect(leak.live_objects - 3 * leak.objects_stddev).to be > 0, out
      expect(leak.live_bytes - 3 * leak.bytes_stddev).to be > 0, out
      # And honest: the demo leaks exactly 15,000 Strings; an estimate 4 standard deviations
      # away would happen about once in 16,000 runs.
      expect((leak.live_objects - 15_000).abs).to be < 4 * leak.objects_stddev, out

      expect(out).to include("$ datadog-heap why ")
      why = out[/^\$ datadog-heap why .*?(?=^The defaults)/m]
      expect(why).to match(/^1\. .*LeakyCache#remember.*\n\s+.*constant LeakyApp::CACHE \(LeakyCache\) -> @entries \(Hash\)/), out
      expect(out).to match(/^The defaults \(windowed sampler, 1 in \d+, 1% budget\), same run: \d+ samples in all; /), out

      defaults = DatadogHeap::Profile.load(File.join(dir, "heap-defaults.pb.gz"))
      expect(defaults.period).to be >= DatadogHeap::Recorder::SAMPLE_EVERY.fetch(:windowed)
    end
  end

  it "names a bad argument and its value, without a backtrace" do
    out, status = Open3.capture2e("timeout", "-s", "KILL", "120", RbConfig.ruby, "-I", File.join(root, "lib"), demo, "many",
      chdir: root)
    expect(status.exitstatus).to eq(1)
    expect(out).to include('demo: REQUESTS must be a whole number >= 1, got "many"')
    expect(out).not_to match(/\.rb:\d+:in /)
  end
end
