# frozen_string_literal: true

require "set"

# Sites from stacks the sampler really captured (the other specs build stacks by hand): C frames
# carry their caller's file:line, library code is told from app code by the app root. :heavy:
# skipped under GC_STRESS=1, where turning RSpec's deep stacks into Ruby arrays takes minutes.
RSpec.describe "allocation sites of real stacks", :heavy do
  # Everything `block` allocates that is still alive after a GC, as a Profile.
  def profile_of
    rec = DatadogHeap::Recorder.new(sample_every: 1, max_overhead: nil)
    keep = nil
    rec.start
    begin
      keep = yield
    ensure
      rec.stop
    end
    GC.start
    profile = DatadogHeap::Profile.parse(rec.profile)
    expect(keep).not_to be_nil
    profile
  end

  it "names the Ruby line, its method, the method called there, and the app line a library was called from" do
    set_line = mul_line = nil
    profile = profile_of do
      set_line = __LINE__ + 1
      set = Set.new([1])
      mul_line = __LINE__ + 1
      string = "ab" * 40
      [set, string]
    end
    sites = profile.top(2**62 - 1, app_root: __dir__)
    set_rb = Set.instance_method(:initialize).source_location.first
    here = "#{__FILE__}:"

    # Set#initialize (Ruby, in the standard library) makes its Hash with Hash.new (C).
    hash = sites.find { |s| s.class_name == "Hash" && s.location.start_with?("#{set_rb}:") }
    expect(hash).not_to be_nil, -> { sites.map { |s| [s.class_name, s.label, s.called_from].inspect }.join("\n") }
    expect(hash.function).to match(/initialize\z/)
    expect(hash.callee).to match(/new\z/)
    expect(hash.label).to eq("#{hash.location} in #{hash.function} via #{hash.callee}")
    expect(hash.library).to eq("set (stdlib)")
    expect(hash.called_from).to start_with("#{here}#{set_line} in ")

    # String#* (C) called on an app line: the site is that line, no called-from.
    string = sites.find { |s| s.class_name == "String" && s.location == "#{here}#{mul_line}" }
    expect(string).not_to be_nil, -> { sites.map(&:label).join("\n") }
    expect(string.callee).to eq("*").or(eq("String#*"))
    expect(string).to have_attributes(library: "app", called_from: nil)

    # With no app root, the Set's Hash has no app frame to point at.
    expect(profile.top(2**62 - 1, app_root: nil).find { |s| s.location == hash.location && s.class_name == "Hash" })
      .to have_attributes(called_from: nil, library: "set (stdlib)")
  end
end
