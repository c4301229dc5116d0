# frozen_string_literal: true

require_relative "spec_helper"
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
    walk = lambda do |decl, prefix|
      name = "#{prefix}#{decl.name.to_s.delete_prefix("::")}"
      decl.members.each do |m|
        case m
        when RBS::AST::Members::MethodDefinition
          (@methods[[name, m.kind == :singleton ? :singleton : :instance]] ||= []) << m.name
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

  {
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
end
