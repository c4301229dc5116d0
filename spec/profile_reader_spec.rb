# frozen_string_literal: true

require "open3"
require "pathname"
require "tmpdir"
require "zlib"
require_relative "fixtures/profiles"

RSpec.describe DatadogHeap::Profile do
  # Keeps the recorded objects alive for the example.
  let(:objects) { mixed_objects }

  before { @rec = recorder_with(objects) }

  # GC off while two snapshots are taken, so both see the same gen ages (GC_STRESS=1 too).
  def without_gc
    GC.disable
    yield
  ensure
    GC.enable
  end

  it "decodes a profile to the samples each_live_object reports: stacks, classes, ages, counts, sizes" do
    profile = live = nil
    without_gc do
      profile = described_class.parse(@rec.profile)
      live = @rec.each_live_object.to_a
    end
    expected = Hash.new { |h, k| h[k] = [0, 0] }
    live.each do |o|
      sums = expected[[o.locations, o.class_name, o.gen_age]]
      sums[0] += o.weight
      sums[1] += o.weight * o.size
    end
    got = profile.samples.to_h { |s| [[s.locations, s.class_name, s.gen_age], [s.objects, s.bytes]] }
    expect(got).to eq(expected)
    expect(profile.samples.map { |s| s.values.first(2) }).to eq(profile.samples.map { |s| [s.objects, s.bytes] })
    expect(live.map(&:weight).sum).to eq(4 + 80 + 3)
    expect(profile.total_objects).to eq(87)
    expect(profile.total_bytes).to eq(live.sum { |o| o.weight * o.size })
    expect(live.find { |o| o.locations == ProfileFixtures::CACHE_SITE }.size).to be >= 10_000
    expect(objects.size).to eq(47)
  end

  it "names its sample types and period" do
    profile = described_class.parse(@rec.profile)
    expect(profile.sample_types).to eq([%w[heap-live-samples count], %w[heap-live-size bytes], %w[heap-live-records count],
      %w[heap-live-samples-variance count^2], %w[heap-live-size-variance bytes^2]])
    expect(profile.period_type).to eq(%w[allocations count])
    expect(profile.period).to eq(1024)
    expect(profile.sizes?).to be(true)
    expect(profile.path).to be_nil
    expect(profile.inspect).to include("samples=3", "heap-live-samples/count,heap-live-size/bytes,heap-live-records/count")
  end

  it "has no size type when the recorder does not measure sizes, and ranks by count then" do
    keep = mixed_objects
    profile = described_class.parse(recorder_with(keep, size_enabled: false).profile)
    expect(profile.sample_types).to eq([%w[heap-live-samples count], %w[heap-live-records count],
      %w[heap-live-samples-variance count^2]])
    expect(profile.sizes?).to be(false)
    expect(profile.total_bytes).to be_nil
    expect(profile.samples.map(&:bytes)).to all(be_nil)
    expect(profile.top(3, by: :size)).to eq(profile.top(3, by: :count))
    expect(profile.top(1).first.location).to eq("/app/buffer.rb:8")
    expect(profile.top(1).first.share).to eq(80.0 / 87)
  end

  it "loads a file and names it" do
    Dir.mktmpdir do |dir|
      path = write_fixture(@rec, dir, "heap.pb.gz")
      profile = described_class.load(path)
      expect(profile.path).to eq(path)
      expect(profile.samples.size).to eq(3)
      expect(profile.inspect).to include(path)
      expect(described_class.load(Pathname(path)).path).to eq(path) # what File.open takes, Pathname included
      expect(described_class.parse(@rec.profile, path: Pathname(path)).path).to eq(path)
    end
  end

  it "reads a raw (uncompressed) pprof the same as the gzip one" do
    gz = @rec.profile
    expect(described_class.parse(Zlib.gunzip(gz)).samples).to eq(described_class.parse(gz).samples)
  end

  it "ranks sites by live bytes or by live objects, with shares, classes, ages and the app frame" do
    profile = described_class.parse(@rec.profile)
    by_size = profile.top(10, app_root: "/app")
    expect(by_size.map(&:location)).to eq(["/app/leaky_cache.rb:17", "/usr/lib/ruby/3.1.0/json/common.rb:216", "/app/buffer.rb:8"])
    cache, json, = by_size
    expect(cache).to have_attributes(class_name: "String", live_objects: 4, locations: ProfileFixtures::CACHE_SITE,
      label: "/app/leaky_cache.rb:17 in LeakyCache#remember", function: "LeakyCache#remember", callee: nil,
      called_from: nil, library: "app", stacks: 1)
    expect(json).to have_attributes(function: "JSON::Ext::Parser#parse", called_from: "/app/api.rb:9 in Api#decode",
      library: "json (stdlib)", locations: ProfileFixtures::JSON_SITE)
    expect(profile.top(10).map(&:called_from)).to all(be_nil) # the default app root, the current directory, has none of them
    expect(cache.median_gen_age).to be >= 1 # 1 GC since the recording, more under GC_STRESS=1
    expect(cache.live_bytes).to be >= 40_000
    expect(by_size.sum(&:share)).to be_within(1e-9).of(1.0)
    expect(cache.share).to eq(cache.live_bytes.to_f / profile.total_bytes)

    by_count = profile.top(2, by: :count)
    expect(by_count.map(&:location)).to eq(["/app/buffer.rb:8", "/app/leaky_cache.rb:17"])
    expect(by_count.first).to have_attributes(class_name: "Buffer::Chunk", live_objects: 80)
    expect(by_count.first.share).to eq(80.0 / 87)
  end

  it "shares one frozen locations array between the samples of a stack" do
    keep = strings_at(ProfileFixtures::CACHE_SITE, 2) + objects_at(ProfileFixtures::CACHE_SITE, 2, weight: 3)
    samples = described_class.parse(recorder_with(keep).profile).samples
    expect(samples.map(&:class_name)).to contain_exactly("String", "Object")
    expect(samples[0].locations).to equal(samples[1].locations)
    expect(samples[0].locations).to be_frozen
    expect(samples[0].locations).to all(be_frozen)
    expect(samples).to be_frozen
  end

  it "diffs two profiles: growth first, relative change, new sites, shrunk sites last" do
    old = described_class.parse(@rec.profile)
    grown = mixed_objects.reject { |_, site, _, _| site == ProfileFixtures::BUFFER_SITE } +
      strings_at(ProfileFixtures::CACHE_SITE, 4, bytes: 10_000) +
      objects_at([["Fresh#site", "/app/fresh.rb", 1]], 5)
    new = described_class.parse(recorder_with(grown).profile)
    diffs = old.diff(new)
    expect(diffs.map(&:location)).to eq(["/app/leaky_cache.rb:17", "/app/fresh.rb:1", "/usr/lib/ruby/3.1.0/json/common.rb:216", "/app/buffer.rb:8"])
    expect(diffs.map(&:called_from)).to eq([nil, nil, nil, nil])
    expect(old.diff(new, app_root: ["/nowhere", "/app"])[2]).to have_attributes(called_from: "/app/api.rb:9 in Api#decode",
      label: "/usr/lib/ruby/3.1.0/json/common.rb:216 in JSON::Ext::Parser#parse", library: "json (stdlib)")
    cache, fresh, json, buffer = diffs
    expect(cache).to have_attributes(old_objects: 4, new_objects: 8, objects_change: 4, objects_relative: 1.0)
    expect(cache.bytes_change).to eq(cache.new_bytes - cache.old_bytes)
    expect(cache.bytes_relative).to be_within(0.01).of(1.0)
    expect(fresh).to have_attributes(old_bytes: 0, old_objects: 0, new_objects: 5, bytes_relative: nil, objects_relative: nil)
    expect(json.bytes_change).to eq(0)
    expect(buffer).to have_attributes(new_objects: 0, objects_change: -80, objects_relative: -1.0)
    expect(buffer.bytes_change).to be < 0
    expect(old.diff(old).map(&:bytes_change)).to all(eq(0))
    expect(grown.size).to be > 0
  end

  it "fills Site and SiteDiff by field name from the field lists the extension exports" do
    site_fields, diff_fields, place = described_class::SITE_FIELDS, described_class::SITE_DIFF_FIELDS,
      described_class::PLACE_FIELDS
    expect([site_fields, diff_fields, place]).to all(be_frozen)
    expect(described_class::Site.members).to eq(site_fields)
    expect(described_class::SiteDiff.members).to eq(diff_fields)
    expect(described_class::SiteTrend.members.first(place.size)).to eq(place)
    expect([site_fields & place, diff_fields & place]).to all(eq(place))
    # The members keep the order they had when the Structs spelled them (to_a, deconstruct).
    expect(site_fields.values_at(0..6, -4..-1)).to eq(%i[locations class_name location live_bytes live_objects share
      median_gen_age stacks samples objects_stddev bytes_stddev])
    expect(diff_fields.values_at(3..10, -5..-1)).to eq(%i[old_bytes new_bytes old_objects new_objects bytes_change
      objects_change bytes_relative objects_relative old_samples new_samples bytes_change_stddev objects_change_stddev
      significant])

    profile = described_class.parse(@rec.profile)
    rows = profile.send(:_native_top, 10, ["size", "site", ["/app"]])
    expect(rows.map(&:keys)).to all(eq(site_fields))
    expect(profile.send(:_native_diff, profile, ["size", "site", []]).map(&:keys)).to all(eq(diff_fields))
    # Each member comes from its own key, whatever the order of the extension's Hash.
    allow(profile).to receive(:_native_top).and_return(rows.map { |row| row.to_a.reverse.to_h })
    expect(profile.top(10, app_root: "/app").map(&:to_h)).to eq(rows)
    expect(profile.top(10, app_root: "/app").first.label).to eq("/app/leaky_cache.rb:17 in LeakyCache#remember")
    allow(profile).to receive(:_native_top).and_return([rows[0].reject { |key, _| key == :library }])
    expect { profile.top(10) }.to raise_error(KeyError, /library/)
  end

  it "groups sites by location, file, gem or class" do
    profile = described_class.parse(@rec.profile)
    by_gem = profile.top(10, group: :gem, app_root: Pathname("/app"))
    expect(by_gem.map { |s| [s.label, s.live_objects, s.class_name] }).to eq([["app", 84, nil], ["json (stdlib)", 3, nil]])
    expect(by_gem.first).to have_attributes(stacks: 2, locations: ProfileFixtures::CACHE_SITE) # the heaviest stack
    expect(profile.top(1, group: :class, by: :count).first).to have_attributes(label: "Buffer::Chunk", class_name: "Buffer::Chunk")
    expect(profile.top(10, group: :file).map(&:label)).to eq(["/app/leaky_cache.rb", "/usr/lib/ruby/3.1.0/json/common.rb", "/app/buffer.rb"])
    expect(profile.top(1, group: :location).first.label).to eq("/app/leaky_cache.rb:17 in LeakyCache#remember")
    expect(profile.top(10, app_root: nil).map(&:library)).to eq(["(other)", "json (stdlib)", "(other)"])
  end

  it "uses Rails.root as the default app root when Rails has one, else the current directory" do
    expect(described_class.default_app_root).to eq(Dir.pwd)
    rails = Module.new { def self.root = Pathname("/app") }
    stub_const("Rails", rails)
    expect(described_class.default_app_root).to eq("/app")
    profile = described_class.parse(@rec.profile)
    expect(profile.top(10).map(&:called_from).compact).to eq(["/app/api.rb:9 in Api#decode"])
  end

  it "sums profiles with merge: samples, totals, paths and count; sizes only when every one has them" do
    Dir.mktmpdir do |dir|
      a = described_class.load(write_fixture(@rec, dir, "a.pb.gz"))
      keep = strings_at(ProfileFixtures::CACHE_SITE, 2, bytes: 10_000)
      b = described_class.load(write_fixture(recorder_with(keep), dir, "b.pb.gz"))
      sum = described_class.merge([a, b])
      expect(sum).to have_attributes(path: nil, paths: [a.path, b.path], count: 2, period: 1024, total_objects: 89,
        total_bytes: a.total_bytes + b.total_bytes, sample_types: a.sample_types)
      expect(sum.samples.size).to eq(a.samples.size + b.samples.size)
      expect(sum.inspect).to include("(sum of 2)")
      expect(sum.top(1).first).to have_attributes(location: "/app/leaky_cache.rb:17", live_objects: 6, stacks: 1)
      expect(a.diff(sum).first).to have_attributes(location: "/app/leaky_cache.rb:17", objects_change: 2)
      nested = described_class.merge([sum, a])
      expect([nested.count, nested.paths, nested.total_objects]).to eq([3, [a.path, b.path, a.path], 176])
      one = described_class.merge([a])
      expect([one.path, one.count, one.samples]).to eq([a.path, 1, a.samples])

      sizeless = described_class.parse(recorder_with(keep, size_enabled: false).profile)
      mixed = described_class.merge([a, sizeless])
      expect(mixed).to have_attributes(sizes?: false, total_bytes: nil, total_objects: 89, paths: [a.path], count: 2,
        sample_types: [%w[heap-live-samples count], %w[heap-live-records count], %w[heap-live-samples-variance count^2]])
    end
  end

  it "names the profile that cannot be summed with the others" do
    # A profile with one sample type, inuse_space/bytes, and nothing else.
    strings = ["", "inuse_space", "bytes"].map { |t| [0x32, t.bytesize].pack("CC") + t }.join
    go = described_class.parse([0x0a, 4, 0x08, 1, 0x10, 2].pack("C*") + strings, path: "go.pb")
    expect(go.sample_types).to eq([%w[inuse_space bytes]])
    ours = described_class.parse(@rec.profile)
    expect { described_class.merge([ours, go]) }.to raise_error(DatadogHeap::Error,
      "cannot sum 2 profiles: pprof: go.pb (profile 2 of 2) has no sample type in common with the ones before it " \
      "(it has inuse_space/bytes; the first has heap-live-samples/count, heap-live-size/bytes, heap-live-records/count, " \
      "heap-live-samples-variance/count^2, heap-live-size-variance/bytes^2)")
  end

  describe "errors" do
    it "names the path and the reason for a missing file or a directory" do
      Dir.mktmpdir do |dir|
        missing = File.join(dir, "nope.pb.gz")
        expect { described_class.load(missing) }
          .to raise_error(DatadogHeap::Error, "cannot read profile #{missing}: No such file or directory")
        expect { described_class.load(dir) }.to raise_error(DatadogHeap::Error, /cannot read profile #{dir}: Is a directory/)
      end
    end

    it "names the path and the reason for a file that is not a profile" do
      Dir.mktmpdir do |dir|
        {
          "text.txt" => ["this is not a profile\n", /not a pprof protobuf/],
          "empty.pb" => ["", /empty/],
          "truncated.pb.gz" => [@rec.profile[0, 30], /gzip input of 30 bytes is corrupt or truncated/],
          # Valid protobuf (field 9, time_nanos = 1) but no sample types: not a profile either.
          "no_types.pb" => ["\x48\x01".b, /defines no sample types/],
        }.each do |name, (content, reason)|
          path = File.join(dir, name)
          File.binwrite(path, content)
          expect { described_class.load(path) }.to raise_error(DatadogHeap::Error) { |e|
            expect(e.message).to start_with("#{path} is not a readable pprof profile (#{content.bytesize} bytes): ")
            expect(e.message).to match(reason)
          }
        end
      end
    end

    # Crafted profiles, from bytes. A pprof Profile is a protobuf message: field 1 (sample_type)
    # and field 2 (sample) are length-delimited submessages, so "\x12\x00" is an empty sample
    # and "\x12\x02\x10\x01" a sample whose one value is 1; field 6 is the string table.
    def crafted(samples, sample: "\x12\x00".b, types: "".b)
      Zlib.gzip(types + sample * samples, level: Zlib::BEST_COMPRESSION)
    end

    # One sample type, objects/count.
    def one_type
      "\x0a\x04\x08\x01\x10\x02".b + ["", "objects", "count"].map { |t| [0x32, t.bytesize].pack("CC") + t }.join
    end

    def with_limit(value)
      saved = ENV["DATADOG_HEAP_MAX_PROFILE_BYTES"]
      ENV["DATADOG_HEAP_MAX_PROFILE_BYTES"] = value
      yield
    ensure
      ENV["DATADOG_HEAP_MAX_PROFILE_BYTES"] = saved
    end

    it "refuses a small file that would decode to more than the memory limit, naming the limit and how to raise it" do
      bomb = crafted(10_000_000) # 20 MB of empty samples, about 20 kB of gzip
      expect(bomb.bytesize).to be < 64 * 1024
      with_limit(nil) do
        expect { described_class.parse(bomb) }.to raise_error(DatadogHeap::Error) { |e|
          expect(e.message).to start_with("profile is not a readable pprof profile (#{bomb.bytesize} bytes): pprof: reading " \
            "this profile needs more memory than the limit of #{4096 * bomb.bytesize} bytes (4096 times the " \
            "#{bomb.bytesize} bytes it is read from, and at least 67108864): its 10000000 samples, 0 locations, " \
            "0 functions and 0 strings take about ")
          expect(e.message).to end_with("; to read it, set the environment variable DATADOG_HEAP_MAX_PROFILE_BYTES to a larger number of bytes")
        }
      end
      with_limit("1073741824") do
        expect { described_class.parse(bomb) }.to raise_error(DatadogHeap::Error,
          /needs more memory than the limit of 1073741824 bytes: its 10000000 samples, /)
      end
    end

    it "holds a small file to a limit scaled to its size, which the 1 GiB bound alone did not" do
      bomb = crafted(2_500_000) # 5 MB of empty samples, about 5 kB of gzip
      expect(bomb.bytesize).to be < 16 * 1024
      with_limit(nil) do
        expect { described_class.parse(bomb) }.to raise_error(DatadogHeap::Error) { |e|
          expect(e.message).to include("needs more memory than the limit of 67108864 bytes (4096 times the " \
            "#{bomb.bytesize} bytes it is read from, and at least 67108864): its 2500000 samples, ")
          # What it asks for fits in 1 GiB, which read it: the process grew to 641 MB.
          needed = Integer(e.message[/take about (\d+) bytes/, 1])
          expect(needed).to be_between(64 << 20, 1 << 30)
        }
      end
    end

    it "refuses it before decoding it: the peak RSS of a process that reads it barely moves" do
      skip "needs /proc/self/status (Linux)" unless File.readable?("/proc/self/status")
      script = <<~'RUBY'
        require "datadog_heap"
        bytes = $stdin.binmode.read
        begin
          DatadogHeap::Profile.parse(bytes) if ARGV[0] == "parse"
        rescue DatadogHeap::Error
        end
        puts File.read("/proc/self/status")[/^VmHWM:\s+(\d+) kB/, 1]
      RUBY
      lib = File.expand_path("../lib", __dir__)
      # The decompressed protobuf (20 MB, 5 MB); reading the 10M samples (the limit raised) peaks
      # at 1.8 GB, and the 2.5M samples of 5 kB, which the 1 GiB bound let through, at 641 MB.
      [10_000_000, 2_500_000].each do |samples|
        bomb = crafted(samples)
        peak, base = %w[parse load].map do |mode|
          out, err, status = Open3.capture3({"DATADOG_HEAP_MAX_PROFILE_BYTES" => nil}, RbConfig.ruby, "-I", lib, "-e", script,
            mode, stdin_data: bomb, binmode: true)
          expect(status).to be_success, err
          Integer(out) * 1024
        end
        expect(peak - base).to be < 100 << 20, "#{samples} samples: the peak RSS grew by #{(peak - base) >> 20} MiB"
      end
    end

    it "takes the limit from DATADOG_HEAP_MAX_PROFILE_BYTES" do
      # Fewer samples under GC_STRESS, where each of the Ruby objects a parse makes runs a GC (the
      # 100,000 took six minutes there); the limit below is 10 bytes a sample either way.
      n = RecorderHelpers::GC_STRESSED ? 10_000 : 100_000
      profile = crafted(n, sample: "\x12\x02\x10\x01".b, types: one_type)
      expect(described_class.parse(profile).total_objects).to eq(n)
      with_limit((10 * n).to_s) do
        expect { described_class.parse(profile) }
          .to raise_error(DatadogHeap::Error, /needs more memory than the limit of #{10 * n} bytes: its #{n} samples, /)
      end
      with_limit("60_000_000") { expect(described_class.parse(profile).samples.size).to eq(n) }
      with_limit("") { expect(described_class.parse(profile).samples.size).to eq(n) }
      with_limit("1GB") do
        expect { described_class.parse(profile) }.to raise_error(ArgumentError,
          "DATADOG_HEAP_MAX_PROFILE_BYTES must be a positive whole number of bytes, such as 4294967296, got \"1GB\"")
      end
    end

    it "checks its arguments" do
      profile = described_class.parse(@rec.profile)
      expect { described_class.parse(nil) }.to raise_error(TypeError, "bytes must be a String, got nil (NilClass)")
      expect { described_class.parse(@rec.profile, path: 1) }.to raise_error(TypeError, /\Apath must be a String or Pathname .*got 1 \(Integer\)/)
      expect { described_class.load(:heap) }.to raise_error(TypeError, /\Apath must be a String or Pathname .*got :heap \(Symbol\)/)
      expect { described_class.new }.to raise_error(NoMethodError)
      expect { profile.top(0) }.to raise_error(ArgumentError, /n must be between 1/)
      expect { profile.top("3") }.to raise_error(TypeError, /n must be an Integer/)
      expect { profile.top(3, by: :bytes) }.to raise_error(ArgumentError, "by must be one of :size, :count, got :bytes (Symbol)")
      expect { profile.top(3, by: "size") }.to raise_error(ArgumentError, /by must be one of :size, :count, got "size" \(String\)/)
      expect { profile.top(3, sort: :size) }
        .to raise_error(ArgumentError, "DatadogHeap::Profile#top: unknown keyword :sort; known: :by, :group, :app_root")
      expect { profile.top(3, group: :method) }
        .to raise_error(ArgumentError, "group must be one of :site, :location, :file, :gem, :class, got :method (Symbol)")
      expect { profile.top(3, group: "gem") }.to raise_error(ArgumentError, /group must be one of .*got "gem" \(String\)/)
      expect { profile.top(3, app_root: 1) }.to raise_error(TypeError, /\Aapp_root must be a String or Pathname .*got 1 \(Integer\)/)
      expect { profile.top(3, app_root: ["/app", ""]) }.to raise_error(ArgumentError, "app_root[1] must not be empty")
      expect { profile.diff(profile, by: :size) }
        .to raise_error(ArgumentError, "DatadogHeap::Profile#diff: unknown keyword :by; known: :group, :app_root")
      expect { profile.diff(profile, group: :gems) }.to raise_error(ArgumentError, /group must be one of/)
      expect { described_class.merge(profile) }.to raise_error(TypeError, /\Aprofiles must be an Array of DatadogHeap::Profile, got #<DatadogHeap::Profile>/)
      expect { described_class.merge([]) }.to raise_error(ArgumentError, "profiles must not be empty")
      expect { described_class.merge([profile, "b.pb.gz"]) }
        .to raise_error(TypeError, "profiles[1] must be a DatadogHeap::Profile, got \"b.pb.gz\" (String)")
      expect { profile.diff("old.pb.gz") }
        .to raise_error(TypeError, "other must be a DatadogHeap::Profile, got \"old.pb.gz\" (String)")
    end
  end

  it "reports its memory to ObjectSpace" do
    keep = Array.new(200) { |i| ["x", [["site#{i}", "/app/s#{i}.rb", i]], 1, "String"] }
    big = described_class.parse(recorder_with(keep).profile)
    small = described_class.parse(@rec.profile)
    expect(ObjectSpace.memsize_of(big)).to be > ObjectSpace.memsize_of(small)
  end

  describe "with go tool pprof" do
    go = ENV.fetch("PATH", "").split(File::PATH_SEPARATOR).map { |d| File.join(d, "go") }.find { |f| File.executable?(f) }

    before do
      skip "go is not installed (Debian: golang-go, which bin/setup --dev installs): cannot check go tool pprof" unless go
    end

    # Runs `go tool pprof ARGS` in a scratch HOME and GOCACHE, never asking the network.
    def pprof(go, dir, *args)
      env = {"HOME" => dir, "GOCACHE" => File.join(dir, "gocache"), "GOPROXY" => "off"}
      out, err, status = Open3.capture3(env, go, "tool", "pprof", "-symbolize=none", *args)
      expect(status).to be_success, "go tool pprof #{args.join(" ")} failed: #{err}"
      out
    end

    # The rows of a -top table, largest first.
    def top_rows(out)
      out.lines.grep(/\A\s*\d[\d.]*\w*\s+[\d.]+%/)
    end

    it "reads the profile: sample types, labels and the leaking site" do
      Dir.mktmpdir do |dir|
        path = write_fixture(@rec, dir, "heap.pb.gz")
        raw = pprof(go, dir, "-raw", path)
        expect(raw).to include("PeriodType: allocations count", "Period: 1024",
          "heap-live-samples/count heap-live-size/bytes", "allocation class:[String]",
          "LeakyCache#remember /app/leaky_cache.rb:17")
        expect(raw).to match(/gc gen age:\[[1-9]\d*\]/)
        by_size = pprof(go, dir, "-top", "-sample_index=heap-live-size", path)
        expect(by_size).to include("Type: heap-live-size")
        expect(top_rows(by_size).first).to include("LeakyCache#remember")
        by_count = pprof(go, dir, "-top", "-sample_index=heap-live-samples", path)
        expect(by_count).to include("Type: heap-live-samples")
        expect(top_rows(by_count).first).to match(/\A\s*80\s.*Buffer#push/)
      end
    end

    it "reads a profile without sizes: only heap-live-samples" do
      keep = mixed_objects
      Dir.mktmpdir do |dir|
        path = write_fixture(recorder_with(keep, size_enabled: false), dir, "heap.pb.gz")
        raw = pprof(go, dir, "-raw", path)
        expect(raw).to include("heap-live-samples/count")
        expect(raw).not_to include("heap-live-size")
      end
    end
  end
end
