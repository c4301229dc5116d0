# frozen_string_literal: true

require "open3"
require "tmpdir"

FRAME_NAMES_APP = File.expand_path("fixtures/frame_names/app.rb", __dir__)
FRAME_NAMES_LOADED = File.expand_path("fixtures/frame_names/loaded.rb", __dir__)
require FRAME_NAMES_APP

# Frame names as Ruby 3.4's backtraces and stackprof give them, on every Ruby: the sampler
# names frames inside the NEWOBJ hook, so these also check that it does so from what the VM
# already holds (a crash or an empty name would show here).
RSpec.describe "frame names" do
  after { @rec&.stop }

  # The line of `# site:TAG` in `file`.
  def site_line(tag, file)
    index = File.readlines(file).index { |l| l.include?("# site:#{tag}") }
    raise "no site #{tag} in #{file}" unless index
    index + 1
  end

  # Samples every allocation the block makes (it returns what to keep alive) and returns the
  # frame names, innermost first, of each distinct stack with a frame at the tagged line.
  def names_at(tag, file = FRAME_NAMES_APP)
    @rec = DatadogHeap::Recorder.new(sample_every: 1, max_overhead: nil)
    @rec.start
    kept = yield
    @rec.stop
    full_gc
    line = site_line(tag, file)
    stacks = @rec.each_live_object.map(&:locations)
      .select { |locations| locations.any? { |_, path, l| path == file && l == line } }
    expect(kept).not_to be_nil
    expect(stacks).not_to be_empty, "nothing sampled at #{file}:#{line}; #{@rec.debug.inspect[0, 2000]}"
    stacks.map { |locations| locations.map(&:first) }.uniq
  end

  it "verified at load that method entries can be read (else names would lack their class)" do
    expect(DatadogHeap::Testing._native_frame_classes_named).to be(true)
  end

  {
    initialize: [-> { FrameNames::AccLeak.new }, ["Class#new", "FrameNames::AccLeak#initialize", "Class#new"]],
    singleton: [-> { FrameNames::Foo.build }, ["Class#new", "FrameNames::Foo.build"]],
    module_method: [-> { FrameNames::UsesHelpers.new.helper }, ["Class#new", "FrameNames::Helpers#helper"]],
    module_singleton: [-> { FrameNames::Helpers.make }, ["Class#new", "FrameNames::Helpers.make"]],
    c_frames: [-> { FrameNames::Foo.new.repeat(3) },
      ["String#*", "FrameNames::Foo#repeat", "Integer#times", "FrameNames::Foo#repeat"]],
    define_method: [-> { FrameNames::Foo.new.defined }, ["Class#new", "block in <class:Foo>"]],
    eval: [-> { FrameNames::Foo.new.evaluated },
      ["Class#new", "FrameNames::Foo#evaluated", "Kernel#eval", "FrameNames::Foo#evaluated"]],
    top_block: [-> { FrameNames::TOP_BLOCK.call },
      ["Class#new", "block (2 levels) in <top (required)>", "Array#map", "block in <top (required)>"]],
    anonymous: [-> { FrameNames.anon.new.make }, ["Class#new", /\A#<Class:0x\h{16}>#make\z/]],
    anonymous_singleton: [-> { FrameNames.anon.build }, ["Class#new", /\A#<Class:0x\h{16}>\.build\z/]],
    anonymous_module: [-> { FrameNames.anon_module.build }, ["Class#new", /\A#<Module:0x\h{16}>\.build\z/]],
    object_singleton: [-> { FrameNames::OBJECT.build }, ["Class#new", /\A#<Object:0x\h{16}>\.build\z/]],
  }.each do |tag, (run, expected)|
    it "names #{tag}: #{expected.map { |e| e.is_a?(Regexp) ? e.source : e }.join(" < ")}" do
      expect(names_at(tag) { run.call }).to include(start_with(*expected))
    end
  end

  it "names the anonymous class as its inspect shows it" do
    names = names_at(:anonymous) { FrameNames.anon.new.make }
    expect(names).to include(start_with("Class#new", "#{FrameNames.anon.inspect}#make"))
  end

  # rb_profile_frames gives the method's entry, not the block's iseq, for a block that runs inside
  # a method (3.1 to 3.4), so the block is named as its method, as stackprof names it; the
  # iseq frames above (blocks outside methods, define_method) keep their `block in`.
  it "names a block inside a method as the method (nested too), with the C frames between" do
    expect(names_at(:block_in_method) { FrameNames::Foo.new.bar })
      .to include(start_with("Class#new", "FrameNames::Foo#bar", "Array#map", "FrameNames::Foo#bar"))
    expect(names_at(:nested_in_method) { FrameNames::Foo.new.nested })
      .to include(start_with("Class#new", "FrameNames::Foo#nested", "Array#map", "FrameNames::Foo#nested",
        "Array#map", "FrameNames::Foo#nested"))
  end

  describe "a script's top, a class body and a top-level eval" do
    def loaded_names(tag)
      names_at(tag, FRAME_NAMES_LOADED) do
        FrameNames::Kept.clear
        load FRAME_NAMES_LOADED
        FrameNames::Kept.dup
      end
    end

    it "names the top of a loaded file <top (required)>, under Kernel#load" do
      expect(loaded_names(:top)).to include(start_with("Class#new", "<top (required)>", "Kernel#load"))
    end

    it "names a class body <class:Name>" do
      expect(loaded_names(:class_body)).to include(start_with("Class#new", "<class:FrameNamesBody>", "<top (required)>"))
    end

    it "names top-level eval code by its own label (the script's, or <compiled> on 3.4)" do
      # rb_profile_frame_label of a top-level eval's iseq: "<compiled>" on 3.4 (its backtraces
      # show the script's label, found through the iseq's parent, which no accessor gives).
      eval_label = RUBY_VERSION >= "3.4" ? "<compiled>" : "<top (required)>"
      expect(loaded_names(:top_eval)).to include(start_with("Class#new", eval_label, "Kernel#eval", "<top (required)>"))
    end
  end

  it "gives one stack to every allocation at one site, found in the stack cache" do
    @rec = DatadogHeap::Recorder.new(sample_every: 1, max_overhead: nil)
    @rec.start
    kept = Array.new(50) { FrameNames::AccLeak.new }
    @rec.stop
    full_gc
    markers = @rec.each_live_object.select { |o| o.class_name == "FrameNames::Marker" }
    expect(markers.size).to eq(kept.size)
    stacks = markers.map(&:locations).uniq
    expect(stacks.size).to eq(1), "stacks: #{stacks.inspect}"
    expect(stacks.first.first(3).map(&:first)).to eq(["Class#new", "FrameNames::AccLeak#initialize", "Class#new"])
    # Under GC_STRESS every allocation runs a GC, which empties the cache.
    expect(@rec.stats[:lifetime_stack_cache_hits]).to be > 0 unless RecorderHelpers::GC_STRESSED
  end

  describe "with go tool pprof" do
    go = ENV.fetch("PATH", "").split(File::PATH_SEPARATOR).map { |d| File.join(d, "go") }.find { |f| File.executable?(f) }

    it "shows Class#method names in -top" do
      skip "go is not installed (Debian: golang-go, which bin/setup --dev installs)" unless go
      @rec = DatadogHeap::Recorder.new(sample_every: 1, max_overhead: nil)
      @rec.start
      kept = Array.new(200) { FrameNames::AccLeak.new }
      @rec.stop
      full_gc
      Dir.mktmpdir do |dir|
        path = @rec.write_profile(File.join(dir, "heap.pb.gz"))
        env = {"HOME" => dir, "GOCACHE" => File.join(dir, "gocache"), "GOPROXY" => "off"}
        out, err, status = Open3.capture3(env, go, "tool", "pprof", "-top", "-symbolize=none",
          "-sample_index=heap-live-samples", path)
        expect(status).to be_success, "go tool pprof failed: #{err}"
        expect(out).to include("FrameNames::AccLeak#initialize", "Class#new")
      end
      expect(@rec.each_live_object.count { |o| o.class_name == "FrameNames::AccLeak" }).to eq(kept.size)
    end
  end
end
