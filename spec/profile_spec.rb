# frozen_string_literal: true

require "zlib"
require "tmpdir"

RSpec.describe "Recorder#profile" do
  before { @rec = manual_recorder }

  it "is a gzip pprof naming the sample types and the allocation site" do
    keep = Array.new(10) { "z" * 100 }
    keep.each { |s| record(@rec, s, locations: [["Cache#fill", "/app/cache.rb", 42]]) }
    @rec.commit
    GC.start
    gz = @rec.profile
    expect(gz.bytes.first(2)).to eq([0x1f, 0x8b])
    raw = Zlib.gunzip(gz)
    expect(raw).to include("heap-live-samples", "heap-live-size", "/app/cache.rb", "Cache#fill", "allocation class", "gc gen age")
    expect(DatadogHeap::Profile.parse(gz).samples.sum(&:objects)).to eq(keep.size)
  end

  it "has no size type when size is disabled" do
    r = manual_recorder(size_enabled: false)
    keep = Object.new
    record(r, keep)
    r.commit
    GC.start
    raw = Zlib.gunzip(r.profile)
    expect(raw).to include("heap-live-samples")
    expect(raw).not_to include("heap-live-size")
  end

  it "write_profile writes atomically and returns the path" do
    keep = Object.new
    record(@rec, keep)
    @rec.commit
    GC.start
    Dir.mktmpdir do |dir|
      path = File.join(dir, "heap.pb.gz")
      expect(@rec.write_profile(path)).to eq(path)
      expect(Zlib.gunzip(File.binread(path))).to include("/app/widget.rb")
      expect(Dir.children(dir)).to eq(["heap.pb.gz"])
    end
  end

  it "encodes without the GVL, so other threads run while a 200k-object profile is built", :heavy do
    keep = Array.new(200_000) { |i| Object.new.tap { |o| record(@rec, o, locations: [["s#{i % 500}", "/app/s.rb", i % 500]]) && (@rec.commit if (i % 250).zero?) } }
    @rec.commit
    GC.start
    expect(DatadogHeap::Testing._native_last_encode_released_gvl(@rec)).to be_nil
    counter = 0
    running = true
    ticker = Thread.new { counter += 1 while running }
    sleep 0.05
    before = counter
    gz = @rec.profile
    during = counter - before
    running = false
    ticker.join
    # The encoder ran with the GVL released (not with it held, after Ruby refused to let it go).
    expect(DatadogHeap::Testing._native_last_encode_released_gvl(@rec)).to be(true)
    expect(during).to be > 0
    profile = DatadogHeap::Profile.parse(gz)
    expect(profile.samples.sum(&:objects)).to eq(keep.size)
    expect(profile.top(1000).size).to eq(500)
  end
end
