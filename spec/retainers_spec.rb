# frozen_string_literal: true

require "singleton"
require "stringio"
require "datadog_heap/cli"
require "tmpdir"

# What the specs below retain objects through. Each example records its objects in a helper
# method that has returned by the time the search runs, so no frame of the example points at them.
module RetainerSpecCache
  CACHE = {}
end

class RetainerSpecRegistry
  attr_reader :items

  def initialize
    @items = []
  end
end

class RetainerSpecWidget
  @instances = []

  class << self
    attr_reader :instances
  end
end

class RetainerSpecConfig
  include Singleton
  attr_reader :items

  def initialize
    @items = []
  end
end

module RetainerSpecHooks
  HOOKS = []
end

# No methods at all: the search must still name its ivar.
class RetainerSpecBare < BasicObject
  def initialize(value)
    @value = value
  end
end

# Lies about everything a naive search would ask it.
class RetainerSpecLiar
  def initialize(value)
    @value = value
  end

  def instance_variables = raise("no")
  def instance_variable_get(*) = raise("no")
  def ==(*) = true
  def equal?(*) = true
  def method_missing(*) = raise("no")
  def respond_to_missing?(*) = true
end

class RetainerSpecHash < Hash
  def each_pair = raise("no")
  def each = raise("no")
end

RSpec.describe "DatadogHeap::Recorder#retainers" do
  before { @rec = manual_recorder }

  after do
    RetainerSpecCache::CACHE.clear
    RetainerSpecWidget.instances.clear
    RetainerSpecConfig.instance.items.clear
    RetainerSpecHooks::HOOKS.clear
    $datadog_heap_spec_registry = nil
  end

  def site(file, line)
    [["make", "/spec/#{file}.rb", line]]
  end

  def commit_and_age
    @rec.commit
    GC.start
  end

  # The Retained entry of the only object recorded at /spec/FILE.rb.
  def retained(result, file)
    sites = result.sites.select { |s| s.location.start_with?("/spec/#{file}.rb:") }
    expect(sites.size).to eq(1), "no single site for #{file} in #{result.sites.map(&:label)}"
    expect(sites.first.objects.size).to eq(1)
    sites.first.objects.first
  end

  def path_of(file, **options)
    result = @rec.retainers(top: 50, **options)
    object = retained(result, file)
    expect(object.status).to eq(:alive), "#{file}: #{object.inspect}\n#{result}"
    object.path
  end

  def keep_in_constant
    RetainerSpecCache::CACHE[:entry] = value = "c" * 100
    record(@rec, value, locations: site("constant", 1))
    nil
  end

  def keep_in_global
    $datadog_heap_spec_registry = RetainerSpecRegistry.new
    4.times { |i| $datadog_heap_spec_registry.items << "g#{i}" * 20 }
    record(@rec, $datadog_heap_spec_registry.items[3], locations: site("global", 2))
    nil
  end

  def keep_in_class_ivar
    RetainerSpecWidget.instances << (widget = RetainerSpecWidget.new)
    record(@rec, widget, locations: site("class_ivar", 3))
    nil
  end

  def keep_in_singleton
    RetainerSpecConfig.instance.items << (value = "s" * 60)
    record(@rec, value, locations: site("singleton", 4))
    nil
  end

  def make_closure
    captured = "p" * 70
    record(@rec, captured, locations: site("closure", 5))
    -> { captured.size }
  end

  def keep_in_closure
    RetainerSpecHooks::HOOKS << make_closure
    nil
  end

  def keep_cycle
    a = []
    b = [a]
    a << b
    record(@rec, a, locations: site("cycle", 6))
    $datadog_heap_spec_registry = a
    nil
  end

  it "names a constant, its Hash key and the object" do
    keep_in_constant
    commit_and_age
    expect(path_of("constant")).to eq("constant RetainerSpecCache::CACHE (Hash) -> [:entry] (String)")
  end

  it "names a global, an ivar and an Array index" do
    keep_in_global
    commit_and_age
    expect(path_of("global")).to eq("global $datadog_heap_spec_registry (RetainerSpecRegistry) -> @items (Array) -> [3] (String)")
  end

  it "names the ivar of a class object, and the instance a Singleton keeps in its class" do
    keep_in_class_ivar
    keep_in_singleton
    commit_and_age
    expect(path_of("class_ivar")).to eq("class RetainerSpecWidget ivar @instances (Array) -> [0] (RetainerSpecWidget)")
    expect(path_of("singleton")).to eq(
      "class RetainerSpecConfig ivar @singleton__instance__ (RetainerSpecConfig) -> @items (Array) -> [0] (String)"
    )
  end

  it "names the local a closure captured" do
    keep_in_closure
    commit_and_age
    expect(path_of("closure")).to eq("constant RetainerSpecHooks::HOOKS (Array) -> [0] (Proc) -> local `captured` (String)")
  end

  it "names a thread-local of another thread" do
    queue = Queue.new
    thread = Thread.new { queue.pop }
    thread.name = "retainer-spec"
    stash = lambda do
      # Set from this thread, so the other one never held the object on its stack.
      thread[:retainer_spec] = [value = "t" * 90]
      record(@rec, value, locations: site("thread_local", 7))
      nil
    end
    stash.call
    stash = nil
    commit_and_age
    expect(path_of("thread_local")).to eq("thread #<Thread retainer-spec> local :retainer_spec (Array) -> [0] (String)")
  ensure
    queue << :done
    thread&.join
  end

  it "does not report a cycle no root reaches as alive: it is garbage at the next GC" do
    keep_cycle
    commit_and_age
    $datadog_heap_spec_registry = nil
    gcs = GC.count
    result = @rec.retainers(top: 50, max_depth: 10_000)
    sites = result.sites.select { |s| s.location == "/spec/cycle.rb:6" }
    if sites.empty?
      # A GC (any allocation under GC.stress) collected it before the search's update.
      expect(GC.count).to be > gcs
      next
    end
    object = sites.first.objects.first
    expect(object).not_to be_alive
    expect(object.path).to be_nil
    if object.status == :collected
      expect(GC.count).to be > gcs
    elsif result.stopped.nil? && !result.depth_cut
      # The search saw everything the roots reach, and this was not in it.
      expect(object.status).to eq(:unreachable), result.to_s
      expect(result.to_s).to include("unreachable from every root")
    else
      # Another spec left a chain deeper than max_depth in the heap: only "not found" can be said.
      expect(object.status).to eq(:not_found), result.to_s
      expect(result.limit_note).not_to be_nil
    end
  end

  it "names the ivars of a BasicObject, and of objects whose methods lie or raise" do
    helper = lambda do
      values = %w[b l h].map { |c| c * 50 }
      hash = RetainerSpecHash.new
      hash[:key] = values[2]
      RetainerSpecHooks::HOOKS.push(RetainerSpecBare.new(values[0]), RetainerSpecLiar.new(values[1]), hash)
      record(@rec, values[0], locations: site("bare", 8))
      record(@rec, values[1], locations: site("liar", 9))
      record(@rec, values[2], locations: site("hash_subclass", 10))
      nil
    end
    helper.call
    helper = nil
    commit_and_age
    expect(path_of("bare")).to eq("constant RetainerSpecHooks::HOOKS (Array) -> [0] (RetainerSpecBare) -> @value (String)")
    expect(path_of("liar")).to eq("constant RetainerSpecHooks::HOOKS (Array) -> [1] (RetainerSpecLiar) -> @value (String)")
    expect(path_of("hash_subclass")).to eq("constant RetainerSpecHooks::HOOKS (Array) -> [2] (RetainerSpecHash) -> [:key] (String)")
  end

  it "keeps nothing alive past the call, and finds the same path after GC.compact" do
    skip "GC.compact can corrupt WeakMaps on this Ruby (bug #19529)" if DatadogHeap::WEAK_MAP_COMPACTION_BUG
    skip "GC.compact is not supported here" unless GC.respond_to?(:compact)

    keep_in_constant
    commit_and_age
    first = path_of("constant")
    GC.compact
    expect(path_of("constant")).to eq(first)
    RetainerSpecCache::CACHE.clear
    full_gc
    expect(live_objects(@rec).map { |o| o.locations.first[1] }).not_to include("/spec/constant.rb")
  end

  it "lets go of the objects it found once it returns" do
    keep_in_constant
    commit_and_age
    expect(path_of("constant")).to start_with("constant RetainerSpecCache::CACHE")
    RetainerSpecCache::CACHE.clear
    full_gc
    expect(live_objects(@rec).map { |o| o.locations.first[1] }).not_to include("/spec/constant.rb")
  end

  it "ranks sites as the report does and picks the largest objects of each" do
    sizes = [10, 300, 50]
    helper = lambda do
      sizes.each { |n| RetainerSpecHooks::HOOKS << (s = "r" * n) and record(@rec, s, locations: site("ranked", 11)) }
      RetainerSpecHooks::HOOKS << (small = "q")
      record(@rec, small, locations: site("small", 12))
      nil
    end
    helper.call
    helper = nil
    commit_and_age
    result = @rec.retainers(top: 1, per_site: 2)
    expect(result.sites.map(&:location)).to eq(["/spec/ranked.rb:11"])
    expect(result.sites.first.objects.map(&:size)).to eq(result.sites.first.objects.map(&:size).sort.reverse)
    expect(result.sites.first.objects.size).to eq(2)
    # The two largest: "r" * 300 and "r" * 50, at [1] and [2].
    expect(result.objects.map(&:path)).to eq(
      ["constant RetainerSpecHooks::HOOKS (Array) -> [1] (String)", "constant RetainerSpecHooks::HOOKS (Array) -> [2] (String)"]
    )
    by_count = @rec.retainers(top: 5, by: :count)
    expect(by_count.sites.first.location).to eq("/spec/ranked.rb:11")
    expect(by_count.sites.first.live_objects).to eq(3)
  end

  it "reports the limit that stopped it" do
    keep_in_global
    commit_and_age
    result = @rec.retainers(top: 50, max_visited: 1)
    expect(result.stopped).to eq(:max_visited)
    expect(retained(result, "global").status).to eq(:not_found)
    expect(result.limit_note).to include("max_visited: 1")

    deep = @rec.retainers(top: 50, max_depth: 1)
    expect(retained(deep, "global").status).to eq(:not_found)
    expect(deep.depth_cut).to be(true)
    expect(deep.limit_note).to include("max_depth: 1")
  end

  it "checks its arguments" do
    expect { @rec.retainers(top: 0) }.to raise_error(ArgumentError, /top must be between 1 and 1000, got 0/)
    expect { @rec.retainers(per_site: "3") }.to raise_error(TypeError, /per_site must be an Integer, got "3"/)
    expect { @rec.retainers(max_depth: 0) }.to raise_error(ArgumentError, /max_depth/)
    expect { @rec.retainers(time_budget: -1) }.to raise_error(ArgumentError, /time_budget must be above 0/)
    expect { @rec.retainers(by: :age) }.to raise_error(ArgumentError, /by must be one of :size, :count, got :age/)
    expect { @rec.retainers(depth: 3) }.to raise_error(ArgumentError, /unknown keyword :depth/)
    expect { @rec.profile(retainers: 3) }.to raise_error(TypeError, /retainers must be true/)
  end

  it "returns no sites for an empty recorder" do
    result = @rec.retainers
    expect(result.sites).to eq([])
    expect(result.to_s).to start_with("Retainers of 0 sampled objects")
  end

  describe "in the pprof" do
    it "labels the objects it found a path for with `retained by`" do
      keep_in_constant
      keep_in_global
      commit_and_age
      profile = DatadogHeap::Profile.parse(@rec.profile(retainers: {top: 50}))
      labels = profile.samples.map(&:retained_by).compact
      expect(labels).to include("constant RetainerSpecCache::CACHE (Hash) -> [:entry] (String)")
      expect(labels).to include(a_string_starting_with("global $datadog_heap_spec_registry"))
      expect(DatadogHeap::Profile.parse(@rec.profile).samples.map(&:retained_by).compact).to eq([])
      expect(profile).to be_retained_by
    end

    it "is printed by `datadog-heap why` and `report --why`" do
      keep_in_constant
      commit_and_age
      Dir.mktmpdir do |dir|
        path = @rec.write_profile(File.join(dir, "heap.pb.gz"), retainers: true)
        out = StringIO.new
        err = StringIO.new
        cli = DatadogHeap::CLI.new(out: out, err: err)
        expect(cli.run(["why", path])).to eq(0), err.string
        expect(out.string).to include("/spec/constant.rb:1 in make")
        expect(out.string).to include("paths found for 1 of the site's 1 sampled objects (100%; 1 of its 1 live objects)",
          "e.g. constant RetainerSpecCache::CACHE (Hash) -> [:entry] (String)")
        expect(out.string).to match(/1 of 1 sampled \(100%\), 1 objects, \d+ B: constant RetainerSpecCache::CACHE \(Hash\) -> \[\*\] \(String\)$/)

        out.truncate(0)
        expect(cli.run(["report", path, "--why"])).to eq(0), err.string
        expect(out.string).to include("Retained by (paths grouped by shape):")
        expect(out.string).to include("constant RetainerSpecCache::CACHE (Hash) -> [:entry] (String)")

        plain = @rec.write_profile(File.join(dir, "plain.pb.gz"))
        err.truncate(0)
        expect(cli.run(["why", plain])).to eq(1)
        expect(err.string).to include("has no retainer paths")
      end
    end
  end

  it "searches 10,000 objects with max_depth 10,000 in a bounded address space (no room made up front for the deepest paths)", :heavy do
    reader, writer = IO.pipe
    pid = fork do
      reader.close
      rec = manual_recorder
      keep = $datadog_heap_spec_keep = Array.new(100) { |site| Array.new(100) { "kept #{site}" } }
      keep.each_with_index do |objects, site|
        objects.each_slice(200) do |slice|
          slice.each { |o| record(rec, o, locations: [["make", "/spec/site#{site}.rb", 1]]) }
          rec.commit
        end
      end
      GC.start
      # 10,000 ids times 10,002 slots was 800 MB reserved before the search began; give the
      # child 300 MB more address space than it has.
      vm_size = File.read("/proc/self/status")[/^VmSize:\s+(\d+) kB/, 1].to_i * 1024
      Process.setrlimit(:AS, vm_size + 300 * 1024 * 1024)
      result = rec.retainers(top: 100, per_site: 100, max_depth: 10_000)
      statuses = result.sites.flat_map { |s| s.objects.map(&:status) }.tally
      writer.write(Marshal.dump([:ok, statuses, keep.size]))
    rescue Exception => e # rubocop:disable Lint/RescueException -- reported to the parent
      writer.write(Marshal.dump([:error, "#{e.class}: #{e.message}"]))
    ensure
      writer.close
      exit!(0)
    end
    writer.close
    outcome = Marshal.load(reader.read) # rubocop:disable Security/MarshalLoad
    Process.wait(pid)
    expect(outcome[0]).to eq(:ok), outcome[1].to_s
    expect(outcome[1]).to eq(alive: 10_000)
  end
end
