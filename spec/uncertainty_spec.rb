# frozen_string_literal: true

require "stringio"
require "tmpdir"
require "datadog_heap/cli"
require_relative "fixtures/profiles"

# How much each row of a report can be trusted: profiles carry, per pprof sample, how many records
# (live sampled objects) it sums and the variance of its estimates; a sample of weight w adds
# w(w-1) to the variance of the object count and w(w-1)·size² to that of the bytes (the sigma the
# accuracy specs use). `report` shows samples and ± per row, `diff` whether a change exceeds its
# noise, and rows resting on fewer than 5 samples are marked rough.
RSpec.describe "sampling uncertainty" do
  include ProfileFixtures

  # The user's case: one Hash sample weighing 14824.
  HEAVY_SITE = [["Client#read", "/gems/puma-6.4.0/lib/puma/client.rb", 152], ["<main>", "/app/main.rb", 1]].freeze

  let(:keep) { [] }
  let(:dir) { Dir.mktmpdir("datadog-heap-sure") }

  after { FileUtils.remove_entry(dir) }

  def heavy(count = 1, weight: 14_824)
    Array.new(count) { [{a: 1}, HEAVY_SITE, weight, "Hash"] }
  end

  def profile_of(objects, name = "heap.pb.gz", **opts)
    keep.concat(objects)
    DatadogHeap::Profile.load(write_fixture(recorder_with(objects, **opts), dir, name))
  end

  def table_rows(out, header)
    lines = out.lines.map(&:chomp)
    start = lines.index { |l| l.lstrip.start_with?(header) }
    expect(start).not_to be_nil, "no table headed #{header.inspect} in:\n#{out}"
    lines.drop(start + 1).take_while { |l| !l.empty? }
  end

  describe "in profiles" do
    it "carries records and variances per sample, which #top sums per site as samples and standard deviations" do
      objects = heavy(3, weight: 500) + objects_at(ProfileFixtures::BUFFER_SITE, 40, weight: 2, class_name: "Chunk")
      rec = recorder_with(objects)
      profile = DatadogHeap::Profile.parse(rec.profile)
      expect(profile.sample_types).to eq([%w[heap-live-samples count], %w[heap-live-size bytes], %w[heap-live-records count],
        %w[heap-live-samples-variance count^2], %w[heap-live-size-variance bytes^2]])
      expect(profile.uncertainty?).to be(true)
      live = rec.each_live_object.to_a
      {"Hash" => 3, "Chunk" => 40}.each do |class_name, count|
        mine = live.select { |o| o.class_name == class_name }
        site = profile.top(10).find { |s| s.class_name == class_name }
        expect(site.samples).to eq(count)
        expect(site.objects_stddev).to be_within(1e-6).of(Math.sqrt(mine.sum { |o| o.weight * (o.weight - 1) }))
        expect(site.bytes_stddev).to be_within(1e-3).of(Math.sqrt(mine.sum { |o| o.weight * (o.weight - 1) * o.size**2 }))
      end
      expect(profile.top(10).map { |s| [s.class_name, s.rough?] }).to contain_exactly(["Hash", true], ["Chunk", false])
    end

    it "sums them when profiles are merged, and leaves them out when one profile has none" do
      a = profile_of(heavy(2, weight: 500), "a.pb.gz")
      b = profile_of(heavy(3, weight: 500), "b.pb.gz")
      sum = DatadogHeap::Profile.merge([a, b]).top(1).first
      one = [a, b].map { |p| p.top(1).first }
      expect(sum.samples).to eq(5)
      expect(sum.bytes_stddev).to be_within(1e-3).of(Math.sqrt(one.sum { |s| s.bytes_stddev**2 }))
      expect(sum.rough?).to be(false)

      keep.concat(heavy(2))
      legacy = DatadogHeap::Profile.parse(DatadogHeap::Testing._native_profile_without_uncertainty(recorder_with(keep)))
      expect(legacy.sample_types).to eq([%w[heap-live-samples count], %w[heap-live-size bytes]])
      expect(legacy.uncertainty?).to be(false)
      expect(legacy.top(1).first).to have_attributes(samples: nil, bytes_stddev: nil, objects_stddev: nil, rough?: false)
      expect(DatadogHeap::Profile.merge([a, legacy]).uncertainty?).to be(false)
      expect(a.diff(legacy).first).to have_attributes(new_samples: nil, bytes_change_stddev: nil, significant: nil)
    end
  end

  describe "datadog-heap report" do
    it "shows samples and ± per row, and marks the rows resting on fewer than 5 samples" do
      path = profile_of(heavy + objects_at(ProfileFixtures::BUFFER_SITE, 40, weight: 2, class_name: "Chunk")).path
      out, err, code = cli_in_process("report", path, "--app-root", "/app")
      expect([err, code]).to eq(["", 0])
      expect(out).to match(/^ *live bytes +± +live objects +samples +share +class/)
      rows = table_rows(out, "live bytes")
      # The measured row first, the one-sample row after it though it weighs more.
      expect(out).to include("by live bytes, rows on fewer than 5 samples (~) last:")
      expect(rows[0]).to match(%r{\A *[\d.]+ KiB +±[\d.]+ B +80 +40 +\d+\.\d% +Chunk +\d+ +buffer\.rb:8 in Buffer#push})
      expect(rows[1]).to match(%r{\A *~[\d.]+ MiB +±[\d.]+ MiB +14824 +1 +\d+\.\d% +Hash +\d+ +puma-6\.4\.0 puma/client\.rb:152 in Client#read})
      expect(out).to match(/^~ rough: fewer than 5 samples/)
      expect(out).to include("± is one standard deviation")
    end

    it "says n/a for profiles written without sample counts" do
      keep.concat(heavy)
      path = File.join(dir, "old.pb.gz")
      File.binwrite(path, DatadogHeap::Testing._native_profile_without_uncertainty(recorder_with(keep)))
      out, err, code = cli_in_process("report", path)
      expect([err, code]).to eq(["", 0])
      expect(table_rows(out, "live bytes")[0]).to match(/\A *[\d.]+ MiB +n\/a +14824 +n\/a +100\.0% +Hash/)
      expect(out).to include("this profile does not say how many samples")
      expect(out).not_to include("~ rough")
    end
  end

  describe "datadog-heap diff" do
    it "says per row whether the change exceeds its own noise (2 standard deviations)" do
      old = profile_of(heavy(2, weight: 500) + objects_at(ProfileFixtures::BUFFER_SITE, 40, weight: 2), "old.pb.gz")
      new = profile_of(heavy(3, weight: 500) + objects_at(ProfileFixtures::BUFFER_SITE, 200, weight: 2), "new.pb.gz")
      out, err, code = cli_in_process("diff", old.path, new.path, "--app-root", "/app")
      expect([err, code]).to eq(["", 0])
      expect(out).to include("2 of 2 sites grew, 1 beyond their noise (|growth| > 2 sd):")
      rows = table_rows(out, "growth")
      buffer = rows.find { |r| r.include?("buffer.rb") }
      hash = rows.find { |r| r.include?("puma-6.4.0 puma/client.rb:152") }
      expect(buffer).to match(/\A\+[\d.]+ KiB +±[\d.]+ B +.* 40 -> 200 +yes +Object/)
      expect(hash).to match(/\A\+[\d.]+ KiB +±[\d.]+ KiB +.* ~2 -> ~3 +no +Hash/)
      d = old.diff(new).find { |r| r.class_name == "Hash" }
      expect(d).to have_attributes(old_samples: 2, new_samples: 3, significant: false)
      expect(d.bytes_change_stddev).to be_within(1e-6).of(Math.sqrt(d.old_bytes**2 * 499 / 1000.0 + d.new_bytes**2 * 499 / 1500.0))
    end
  end

  describe "datadog-heap trend" do
    it "says why nothing is growing and what to do when only few-sample sites rose" do
      paths = [[], heavy, heavy, heavy, heavy].each_with_index.map do |objects, i|
        sleep 0.01
        profile_of(objects + objects_at(ProfileFixtures::BUFFER_SITE, 40, weight: 2), "heap-#{i}.pb.gz", sample_every: 4096).path
      end
      out, err, code = cli_in_process("trend", *paths, "--app-root", "/app")
      expect([err, code]).to eq(["", 0])
      expect(out).to include("0 growing")
      expect(out).to match(/No site is growing: 1 site rose but rests on fewer than 5 samples/m)
      expect(out).to include("take more profiles", "lower sample_every", "preset: :leak_hunt")
      row = table_rows(out, "verdict").find { |r| r.include?("client.rb") }
      expect(row).to match(/\Asteady .* 0 -> 1 .*1 sample/)
    end

    it "says it skipped the empty profiles at the start" do
      paths = [[], [], heavy(6, weight: 4), heavy(12, weight: 4), heavy(18, weight: 4)].each_with_index.map do |objects, i|
        sleep 0.01
        profile_of(objects, "heap-#{i}.pb.gz", sample_every: 4).path
      end
      out, err, code = cli_in_process("trend", *paths)
      expect([err, code]).to eq(["", 0])
      expect(out).to include("skipped the first 2 profiles: no live samples yet")
      expect(table_rows(out, "verdict")[0]).to match(/\Agrowing .* 6 -> 18 /)
    end
  end
end
