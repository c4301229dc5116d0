# frozen_string_literal: true

require_relative "spec_helper"
require "open3"
require "tmpdir"
require "rbconfig"

# The load- and start-time gates for Rubies this machine cannot run (docs/compatibility.md): a GC
# other than the default one (Ruby 3.4+'s modular GC, MMTk), and loading off the main Ractor.
RSpec.describe DatadogHeap::Compat do

  # Runs `code` in a fresh ruby with the gem's lib/ on the load path; [stdout, stderr, status].
  def ruby_child(code, env: {})
    Open3.capture3(env, RbConfig.ruby, "-I", File.expand_path("../lib", __dir__), "-e", code)
  end

  describe ".gc_implementation" do
    it "reads the name GC.config gives (Ruby 3.4+), the default GC otherwise" do
      expect(described_class.gc_implementation({implementation: "mmtk", rgengc_allow_full_mark: true})).to eq("mmtk")
      expect(described_class.gc_implementation({rgengc_allow_full_mark: true})).to eq("default")
      expect(described_class.gc_implementation(nil)).to eq("default")
    end

    it "says the default GC on the Rubies CI runs" do
      expect(described_class.gc_implementation).to eq("default")
    end
  end

  describe ".gc_refusal" do
    it "refuses MMTk, naming the GC, the reason and the way around" do
      why = described_class.gc_refusal("mmtk", {})
      expect(why).to include('"mmtk" GC', "ObjectSpace::WeakMap", "unset RUBY_GC_LIBRARY", "DATADOG_HEAP_ALLOW_GC=mmtk")
    end

    it "lets the default GC through, and another one only when DATADOG_HEAP_ALLOW_GC names it" do
      expect(described_class.gc_refusal("default", {})).to be_nil
      expect(described_class.gc_refusal("mmtk", {"DATADOG_HEAP_ALLOW_GC" => "mmtk"})).to be_nil
      expect(described_class.gc_refusal("mmtk", {"DATADOG_HEAP_ALLOW_GC" => "1"})).to include("refused")
    end
  end

  # GC.config is replaced in a child process, as a Ruby running MMTk would answer it.
  def mmtk
    'GC.singleton_class.define_method(:config) { {implementation: "mmtk"} }; require "datadog_heap"; '
  end

  it "under MMTk, a recorder refuses to start with DatadogHeap::Error and samples nothing" do
    out, err, status = ruby_child(mmtk + <<~RUBY)
      rec = DatadogHeap::Recorder.new(sampler: :countdown, sample_every: 1)
      begin
        rec.start
        puts "started"
      rescue DatadogHeap::Error => e
        puts "refused: \#{e.message}"
      end
      puts "running=\#{rec.running?} hooks=\#{DatadogHeap::Testing._native_hooks.inspect}"
    RUBY
    expect(status).to be_success, err
    expect(out).to include('refused: datadog_heap: this Ruby runs the "mmtk" GC', "running=false hooks=[false, false, nil]")
  end

  it "under MMTk with DATADOG_HEAP_ALLOW_GC=mmtk, a recorder starts and warns once" do
    out, err, status = ruby_child(mmtk + <<~RUBY, env: {"DATADOG_HEAP_ALLOW_GC" => "mmtk"})
      a = DatadogHeap::Recorder.new(sampler: :countdown, sample_every: 1)
      a.start
      DatadogHeap::Recorder.new(sampler: :countdown, sample_every: 1).start
      puts "running=\#{a.running?}"
    RUBY
    expect(status).to be_success, err
    expect(out).to include("running=true")
    expect(err.scan(/recording under the "mmtk" GC/).size).to eq(1)
  end

  describe ".check_main_ractor!" do
    it "passes on the main Ractor" do
      expect { described_class.check_main_ractor! }.not_to raise_error
    end

    it "raises LoadError naming the Ractor when called from another one" do
      other = Object.new
      main = Object.new
      ractor = Object.new
      ractor.define_singleton_method(:main) { main }
      ractor.define_singleton_method(:current) { other }
      expect { described_class.check_main_ractor!(ractor) }.to raise_error(LoadError, /must be loaded from the main Ractor/)
    end
  end
end

RSpec.describe "ext/datadog_heap/extconf.rb" do
  it "stops before building, with a list of what is missing, when cargo is not there" do
    Dir.mktmpdir do |dir|
      out, err, status = Open3.capture3({"CARGO" => File.join(dir, "no-cargo")}, RbConfig.ruby,
        File.expand_path("../ext/datadog_heap/extconf.rb", __dir__), chdir: dir)
      expect(status).not_to be_success
      expect(out + err).to include("datadog_heap: cannot build the extension for Ruby #{RUBY_VERSION}",
        "no-cargo` was not found: building needs Rust (cargo >= 1.85")
      expect(File.exist?(File.join(dir, "Makefile"))).to be(false)
    end
  end
end
