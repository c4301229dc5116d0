# frozen_string_literal: true

require "spec_helper"

# README's defaults table and docs/configuration.md's say what the code does: each value is read
# from both files and compared with the constants the recorder uses.
RSpec.describe "the documented defaults" do
  ROOT = File.expand_path("..", __dir__)

  # {setting => default} of the first Markdown table after `heading` in `file`: the first two
  # columns, backticks dropped.
  def defaults_table(file, heading)
    lines = File.readlines(File.join(ROOT, file))
    start = lines.index { |l| l.start_with?(heading) } or raise "#{file} has no #{heading.inspect}"
    rows = lines[start..].drop_while { |l| !l.start_with?("|") }.take_while { |l| l.start_with?("|") }
    rows.drop(2).to_h do |row|
      setting, default = row.split("|").map(&:strip).reject(&:empty?).first(2)
      [setting.delete("`"), default.delete("`")]
    end
  end

  let(:code) do
    d = DatadogHeap::Recorder::DEFAULTS
    {
      "sampler" => ":#{DatadogHeap::Recorder.new.sampler}",
      "sample_every" => DatadogHeap::Recorder::SAMPLE_EVERY.fetch(:windowed).to_s,
      "sample_every with sampler: :countdown" => DatadogHeap::Recorder::SAMPLE_EVERY.fetch(:countdown).to_s,
      "windows_per_second" => d.fetch(:windows_per_second).to_s,
      "max_overhead" => d.fetch(:max_overhead).to_s,
    }
  end

  it "README's table matches the code" do
    readme = defaults_table("README.md", "## Which setting when")
    code.each do |setting, value|
      expect(readme.fetch(setting)).to start_with(value), "README.md, #{setting}: #{readme[setting].inspect}, code: #{value}"
    end
    expect(readme.fetch("max_overhead")).to include("none when you set `sample_every`".delete("`"))
    expect(DatadogHeap::Recorder.new(sample_every: 4096).max_overhead).to be_nil
  end

  it "docs/configuration.md's table matches the code, every option of it included" do
    docs = defaults_table("docs/configuration.md", "## Defaults")
    code.each do |setting, value|
      expect(docs.fetch(setting)).to eq(value), "docs/configuration.md, #{setting}: #{docs[setting].inspect}, code: #{value}"
    end
    d = DatadogHeap::Recorder::DEFAULTS
    %i[sample_rate size_enabled max_frames max_tracked_objects].each do |key|
      expect(docs.fetch(key.to_s)).to eq(d.fetch(key).to_s), key.to_s
    end
    %i[rss_limit preset].each { |key| expect(docs.fetch(key.to_s)).to eq("nil") }
    documented = docs.keys.map { |k| k.split.first.to_sym }.uniq
    expect(d.keys - documented).to be_empty, "options missing from docs/configuration.md: #{d.keys - documented}"
  end
end
