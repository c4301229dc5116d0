# frozen_string_literal: true

require "tmpdir"
require "timeout"
require_relative "stress_helper"
require_relative "../../examples/service/cluster"

# The example service as a puma cluster without preload_app!, the gem required by the app itself
# (config.ru, HEAP_AUTO_IN_APP=1) and so first required in each forked worker: the case where,
# before Ruby 3.3, the window timer's probe looked for the worker's own kernel id in a thread
# struct that still held the master's, found nothing, and the workers' windows came from a Ruby
# thread at about 10 a second, with no word said. Each worker must profile with the native timer
# (no note about a Ruby timer or a countdown fallback in its profile) and find the leak.
RSpec.describe "the example puma service without preload_app!, the gem required after the fork", :stress do
  PROFILE_FILE = /heap-(\d+)-(\d+)\.pb\.gz\z/

  before(:context) do
    require_service_tools

    @dir = Dir.mktmpdir("service-no-preload-")
    out = File.join(@dir, "profiles")
    env = ServiceCluster.profiler_env(out, interval: 1, sample_every: 1024)
      .merge("RUBYOPT" => "-I#{ServiceCluster::LIB}", "HEAP_AUTO_IN_APP" => "1", "PRELOAD" => "0")
    Timeout.timeout(120) do
      @cluster = ServiceCluster::Cluster.new(env: env, log: File.join(@dir, "puma.log"))
      @cluster.wait_booted(2)
      @workers = @cluster.boots.map(&:last)
      result = ServiceCluster.wrk(@cluster.port, seconds: 6, max_requests: 120_000)
      raise "failed requests: #{result.inspect}" unless result[:errors].values.sum.zero?

      @status = @cluster.stop(seconds: 30)
    end
    @log = File.read(@cluster.log)
    @profiles = Dir[File.join(out, "*.pb.gz")].group_by { |path| Integer(path[PROFILE_FILE, 1]) }
    @profiles.each_value { |paths| paths.sort_by! { |p| Integer(p[PROFILE_FILE, 2]) } }
  end

  after(:context) do
    @cluster&.kill_all unless @cluster.nil? || @cluster.exited?
    FileUtils.rm_rf(@dir) if @dir
  end

  it "profiles each worker with the native window timer, the leak first among its measured sites" do
    expect(@log).not_to match(/\[BUG\]|Segmentation fault/)
    expect(@profiles.keys).to include(*@workers), "profiles of #{@profiles.keys} for workers #{@workers}:\n#{@log}"
    # Each worker says which timer its recorder's windows come from (config.ru, at load).
    @workers.each do |pid|
      expect(@log).to include("datadog_heap window timer in #{pid}: \"native\""), @log
    end
    leak_site = ServiceCluster.site("leak site")
    @workers.each do |pid|
      profile = DatadogHeap::Profile.load(@profiles[pid].last)
      expect(profile.comments.grep(/opened by a Ruby thread|default sampler is the countdown/)).to eq([]),
        "worker #{pid}: #{profile.comments.inspect}"
      measured = profile.top(10).reject { |s| s.class_name == "Thread" }.reject(&:rough?)
      expect(measured.first&.location).to eq(leak_site),
        "worker #{pid}: #{measured.map { |s| [s.location, s.class_name, s.live_bytes] }.inspect}"
    end
  end
end
