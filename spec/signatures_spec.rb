# frozen_string_literal: true

require_relative "spec_helper"
require "open3"
require "rbconfig"
require "tmpdir"
require "datadog_heap/middleware"
require "datadog_heap/upload"

# sig/datadog_heap.rbs against the classes as loaded: every public method of the public classes
# has a signature, and every signature names a method that exists. (`rake lint:rbs` checks that
# the file parses and names only known types.)
RSpec.describe "sig/datadog_heap.rbs" do
  before(:all) do
    begin
      require "rbs"
    rescue LoadError
      skip "the rbs gem is not installed"
    end
    decls = RBS::Parser.parse_signature(File.read(File.expand_path("../sig/datadog_heap.rbs", __dir__)))
    decls = decls.last if decls.is_a?(Array) && decls.size == 3 && decls.last.is_a?(Array) # rbs >= 3: [buffer, directives, decls]
    @methods = {}
    @types = {}
    walk = lambda do |decl, prefix|
      name = "#{prefix}#{decl.name.to_s.delete_prefix("::")}"
      decl.members.each do |m|
        case m
        when RBS::AST::Members::MethodDefinition
          (@methods[[name, m.kind == :singleton ? :singleton : :instance]] ||= []) << m.name
          @types[[name, m.kind == :singleton ? :singleton : :instance, m.name]] = m.respond_to?(:overloads) ? m.overloads.map(&:method_type) : m.types # rbs >= 3 has overloads
        when RBS::AST::Members::AttrReader, RBS::AST::Members::AttrAccessor
          (@methods[[name, :instance]] ||= []) << m.name
        when RBS::AST::Declarations::Class, RBS::AST::Declarations::Module
          walk.call(m, "#{name}::")
        end
      end
    end
    decls.each { |d| walk.call(d, "") }
  end

  # Public methods defined by the gem itself (not Object's, not `_native_` ones), including those
  # of the gem's own modules prepended to the class (Recorder's RssLimit).
  def own_public(owner, kind)
    target = kind == :singleton ? owner.singleton_class : owner
    prepended = target.ancestors.take_while { |m| m != target }.select { |m| m.name.to_s.start_with?("DatadogHeap::") }
    methods = target.public_instance_methods(false) + prepended.flat_map { |m| m.public_instance_methods(false) }
    methods.reject { |m| m.to_s.start_with?("_native_") }
  end

  # DatadogHeap's own helpers (for the extension, the Railtie, auto mode) are public module
  # methods too: there, each signature must name a method, and the methods of the README must be
  # signed, but not every public method.
  it "signs DatadogHeap's module methods that exist, the README's among them" do
    public = own_public(DatadogHeap, :singleton)
    signed = @methods.fetch(["DatadogHeap", :singleton])
    expect(signed - public).to eq([])
    expect(signed).to include(:start, :stop, :recorder, :write_profile, :own_work)
  end

  {
    "DatadogHeap::Compat" => [:singleton],
    "DatadogHeap::Recorder" => [:instance, :singleton],
    "DatadogHeap::LiveObject" => [:instance],
    "DatadogHeap::Profile" => [:instance, :singleton],
    "DatadogHeap::Middleware" => [:instance],
    "DatadogHeap::Retainers" => [:instance],
  }.each do |name, kinds|
    kinds.each do |kind|
      it "has a signature for each public #{kind} method of #{name}, and no more" do
        owner = Object.const_get(name)
        expected = own_public(owner, kind)
        # Internal entry points that stay public for the CLI and the tests.
        expected -= %i[check_options app_roots default_app_root check_path check_token secure_compare_digests inspect]
        expected += %i[initialize] if kind == :instance && @methods[[name, :instance]]&.include?(:initialize)
        signed = @methods.fetch([name, kind], [])
        expect(signed.sort).to eq(expected.sort.uniq)
      end
    end
  end

  # The keywords each signature lists are the keywords the Ruby method takes (methods written in
  # Ruby with named keywords; a `**options` method checks its keys itself, and its spec says which).
  it "lists, for each method written in Ruby, the keywords the method takes" do
    checked = 0
    mismatches = @types.filter_map do |(name, kind, method), types|
      # Modules not loaded here (Auto, loaded by datadog_heap/auto) are left out.
      owner = name.split("::").reduce(Object) { |m, c| m.const_defined?(c, false) ? m.const_get(c, false) : (break nil) }
      next unless owner.is_a?(Module)

      target = kind == :singleton ? owner.singleton_class : owner
      next unless target.method_defined?(method) || target.private_method_defined?(method)

      params = target.instance_method(method).parameters
      next if target.instance_method(method).source_location.nil? || params.any? { |type, _| type == :keyrest }

      checked += 1
      takes = params.select { |type, _| %i[key keyreq].include?(type) }.map(&:last).sort
      signed = types.flat_map { |t| t.type.required_keywords.keys + t.type.optional_keywords.keys }.uniq.sort
      "#{name}#{kind == :singleton ? "." : "#"}#{method}: takes #{takes.inspect}, signed #{signed.inspect}" unless takes == signed
    end
    expect(mismatches).to eq([])
    expect(checked).to be >= 20
  end

  # Methods that take `**options` check the keys against a constant: the signature must list
  # exactly those keywords.
  it "lists, for each method taking **options, the keywords the method accepts" do
    accepted = {
      ["DatadogHeap", :singleton, :start] => DatadogHeap::Recorder::DEFAULTS.keys - DatadogHeap::Recorder::RSS_OPTIONS,
      ["DatadogHeap::Recorder", :singleton, :new] => DatadogHeap::Recorder::DEFAULTS.keys,
      ["DatadogHeap::Recorder", :instance, :record_allocation] => DatadogHeap::Recorder::RECORD_ALLOCATION_KEYWORDS.keys,
      ["DatadogHeap::Recorder", :instance, :retainers] => DatadogHeap::Recorder::RETAINERS_DEFAULTS.keys,
      ["DatadogHeap::Profile", :singleton, :trend] => DatadogHeap::Profile::TREND_KEYWORDS.keys,
      ["DatadogHeap::Profile", :instance, :top] => DatadogHeap::Profile::TOP_KEYWORDS.keys,
      ["DatadogHeap::Profile", :instance, :top_retained] => DatadogHeap::Profile::TOP_KEYWORDS.keys,
      ["DatadogHeap::Profile", :instance, :diff] => DatadogHeap::Profile::DIFF_KEYWORDS.keys,
    }
    accepted.each do |(name, kind, method), keys|
      types = @types.fetch([name, kind, method])
      signed = types.flat_map { |t| t.type.required_keywords.keys + t.type.optional_keywords.keys }.uniq
      expect([name, method, signed.sort]).to eq([name, method, keys.sort])
    end
  end

  # `rake spec:rbs` runs specs under RBS's runtime checks (.ci/rbs_runtime.rb): a signature that
  # does not match what a method returns must fail the run, and the true one must not.
  it "fails a call whose return value does not match its signature under the runtime check" do
    sig = File.read(File.expand_path("../sig/datadog_heap.rbs", __dir__))
    program = <<~RUBY
      require "datadog_heap"
      profile = DatadogHeap::Profile.parse(DatadogHeap::Recorder.new.profile)
      profile.top(3, app_root: Pathname("/app"))
      puts profile.total_objects
    RUBY
    Dir.mktmpdir("rbs-runtime") do |dir|
      run = lambda do |text|
        File.write(File.join(dir, "datadog_heap.rbs"), text)
        Open3.capture3({"RBS_TEST_OPT" => "-I #{dir}", "GC_STRESS" => nil}, RbConfig.ruby, "-I", File.expand_path("../lib", __dir__),
          "-r", File.expand_path("../.ci/rbs_runtime.rb", __dir__), "-rpathname", "-e", program)
      end
      out, err, status = run.call(sig)
      expect([out, status.exitstatus]).to eq(["0\n", 0]), err
      expect(err).to match(/RBS runtime check: [1-9]\d* calls of [1-9]\d* signed methods checked/)
      wrong = sig.sub("def total_objects: () -> Integer", "def total_objects: () -> String")
      expect(wrong).not_to eq(sig)
      _, err, status = run.call(wrong)
      expect(status.exitstatus).not_to eq(0)
      expect(err).to include("[DatadogHeap::Profile#total_objects] ReturnTypeError: expected `::String` but returns `0`")
    end
  end
end
