#!/usr/bin/env ruby
# frozen_string_literal: true

# Fails (exit 1) when a public class, module, method or attribute of the Ruby API has no RDoc
# comment, listing each; `rake doc:coverage` runs it, and CI with it. Two views are compared:
#
# - what RDoc reads in lib/ (methods written in Ruby, and the extension's methods documented with
#   `:method:` comments, see lib/datadog_heap/recorder.rb): each public one needs a comment;
# - what the loaded gem answers (`public_instance_methods`, `singleton_methods`, including
#   the gem's modules prepended to a class): each must be one RDoc has a comment for, so a method
#   the extension adds without a `:method:` comment fails too.
#
# The rows (Structs) have no methods of their own to document: their comment must name every
# member (as the loaded Struct has them; with --static, as the source lists them). DatadogHeap::Testing must say it is for tests only. The Railtie's comment must show
# every setting as `config.datadog_heap.NAME` (loaded when Rails is installed; else its settings
# are read from the source).
#
#   ruby .ci/api_docs.rb [--lib DIR] [--static]   (--static: RDoc's view only, no extension loaded)

require "rdoc"
require "stringio"
require "tmpdir"

module ApiDocs
  ROOT = File.expand_path("..", __dir__)

  # The public API: name => what to check (:class with instance and singleton methods, :module
  # with module functions, :rows with Struct members).
  API = {
    "DatadogHeap" => :module,
    "DatadogHeap::Error" => :class,
    "DatadogHeap::Recorder" => :class,
    "DatadogHeap::LiveObject" => :class,
    "DatadogHeap::Profile" => :class,
    "DatadogHeap::Profile::Sample" => :rows,
    "DatadogHeap::Profile::Site" => :rows,
    "DatadogHeap::Profile::SiteDiff" => :rows,
    "DatadogHeap::Profile::SiteTrend" => :rows,
    "DatadogHeap::Retainers" => :class,
    "DatadogHeap::Retainers::Site" => :rows,
    "DatadogHeap::Retainers::Retained" => :rows,
    "DatadogHeap::Middleware" => :class,
    "DatadogHeap::Railtie" => :class,
    "DatadogHeap::Testing" => :testing,
  }.freeze
  # Files that define the API beyond lib/datadog_heap.rb's own requires.
  REQUIRES = %w[datadog_heap datadog_heap/middleware].freeze

  module_function

  # RDoc's store for the Ruby files under `lib`.
  def rdoc_store(lib)
    options = RDoc::Options.load_options
    options.parse(["--quiet", "--dry-run", "--op", File.join(Dir.tmpdir, "datadog_heap_api_docs"), *Dir[File.join(lib, "**", "*.rb")].sort])
    rdoc = RDoc::RDoc.new
    # RDoc prints its progress and warnings on $stdout/$stderr; the report below says what matters.
    out = $stdout
    $stdout = StringIO.new
    begin
      rdoc.document(options)
    ensure
      $stdout = out
    end
    rdoc.store
  end

  def text(comment)
    (comment.respond_to?(:text) ? comment.text : comment.to_s).strip
  end

  # A Struct row's constant: [comment, [members]] from its source (RDoc sees a constant).
  def row(store, name)
    owner_name, _, const = name.rpartition("::")
    owner = store.find_class_or_module(owner_name)
    constant = owner&.constants&.find { |c| c.name == const }
    return nil unless constant

    # The members as the loaded Struct has them (some come from the extension's field lists),
    # else as the source names them.
    loaded = resolve(name)
    members = loaded.is_a?(Class) && loaded < Struct ? loaded.members.map(&:to_s) : constant.value.to_s.scan(/:(\w+)/).flatten
    [text(constant.comment), members]
  end

  # Whether a row's comment describes `member`: by name, by a pattern (`*_change` covers
  # bytes_change), or as one of "the fields of OTHER" (another row of the same owner).
  def described?(store, name, comment, member)
    return true if comment.match?(/(?<![\w:*])#{Regexp.escape(member)}\b/)
    return true if comment.scan(/`(\*?\w+\*?)`/).flatten.any? do |pattern|
      pattern.include?("*") && File.fnmatch?(pattern, member)
    end

    owner = name.rpartition("::").first
    comment.scan(/fields of (\w+)/).flatten.any? do |other|
      _, others = row(store, "#{owner}::#{other}")
      others&.include?(member)
    end
  end

  # Problems RDoc's own view shows.
  def static_problems(store, lib)
    problems = []
    API.each do |name, kind|
      if kind == :rows
        comment, members = row(store, name)
        next problems << "#{name}: not found" if comment.nil?
        next problems << "#{name}: no comment" if comment.empty?

        unnamed = members.reject { |m| described?(store, name, comment, m) }
        problems << "#{name}: the comment does not describe #{unnamed.join(", ")}" unless unnamed.empty?
        next
      end
      mod = store.find_class_or_module(name)
      next problems << "#{name}: not found in #{lib}" unless mod
      next problems << "#{name}: no comment" if text(mod.comment_location.map(&:first).map { |c| text(c) }.join("\n")).empty? && text(mod.comment).empty?

      if kind == :testing && !text(mod.comment).match?(/tests only|specs and benchmarks only|not part of (its|the) API/i)
        problems << "#{name}: the comment must say it is for tests only"
      end
      mod.method_list.each do |m|
        next if m.visibility != :public || m.name.start_with?("_native_") || !m.document_self

        problems << "#{name}#{m.singleton ? "." : "#"}#{m.name}: no comment" if text(m.comment).empty?
      end
      mod.attributes.each do |a|
        next if a.visibility != :public

        problems << "#{name}#{a.singleton ? "." : "#"}#{a.name} (attribute): no comment" if text(a.comment).empty?
      end
    end
    problems
  end

  # The public methods the loaded `mod` answers, as [name, singleton?]: its own and those of the
  # gem's modules prepended to it (Recorder's RssLimit), not `_native_` ones.
  def runtime_methods(mod)
    found = []
    targets = [[mod.singleton_class, true]]
    targets << [mod, false] if mod.is_a?(Class)
    targets.each do |target, singleton|
      prepended = target.ancestors.take_while { |m| m != target }.select { |m| m.name.to_s.start_with?("DatadogHeap::") }
      names = target.public_instance_methods(false) + prepended.flat_map { |m| m.public_instance_methods(false) }
      # Rails' class attributes (config, instance, ...) are Rails::Railtie's, not ours.
      names -= ::Rails::Railtie.singleton_class.public_instance_methods if defined?(::Rails::Railtie) && mod <= ::Rails::Railtie
      names.uniq.each { |n| found << [n.to_s, singleton] unless n.to_s.start_with?("_native_") }
    end
    found
  end

  # Problems the loaded gem shows: a public method RDoc has no comment for.
  def runtime_problems(store)
    problems = []
    API.each do |name, kind|
      next if %i[rows testing].include?(kind)
      next unless (mod = resolve(name))

      runtime_methods(mod).each do |method, singleton|
        # Documented where it is defined: the class, or a module of the gem prepended to it.
        owner = (singleton ? mod.method(method) : mod.instance_method(method)).owner
        docs = [store.find_class_or_module(name), (store.find_class_or_module(owner.name) if owner.name)].compact.uniq
        entries = docs.flat_map do |doc|
          found = doc.method_list.select { |m| m.name == method && !!m.singleton == singleton }
          found += doc.attributes.select { |a| [a.name, "#{a.name}="].include?(method) && !!a.singleton == singleton }
          # RDoc lists a Ruby `initialize` as `new`.
          found += doc.method_list.select { |m| m.name == "new" && m.singleton } if method == "new" && singleton
          found
        end
        next if entries.any? { |e| !text(e.comment).empty? }

        problems << "#{name}#{singleton ? "." : "#"}#{method}: defined #{where(mod, method, singleton)}, no RDoc comment"
      end
      # And the other way: a method documented (a `:method:` comment, say) that the class does
      # not have, or not publicly, is documentation of nothing.
      doc = store.find_class_or_module(name)
      next unless doc

      public = runtime_methods(mod).to_h { |m, singleton| [[m, singleton], true] }
      doc.method_list.each do |m|
        next if m.visibility != :public || m.name.start_with?("_native_") || !m.document_self
        next if public[[m.name, !!m.singleton]] || (m.name == "new" && m.singleton && mod.respond_to?(:new))

        problems << "#{name}#{m.singleton ? "." : "#"}#{m.name}: documented, but #{name} has no such public method"
      end
    end
    problems
  end

  def resolve(name)
    name.split("::").reduce(Object) { |m, c| m.const_defined?(c, false) ? m.const_get(c, false) : (return nil) }
  end

  def where(mod, method, singleton)
    loc = (singleton ? mod.method(method) : mod.instance_method(method)).source_location
    loc ? "at #{loc.join(":").delete_prefix("#{ROOT}/")}" : "by the extension"
  end

  # The Railtie's settings are each shown as config.datadog_heap.NAME in its comment.
  def railtie_problems(store, lib)
    doc = store.find_class_or_module("DatadogHeap::Railtie")
    return [] unless doc

    keys = if (railtie = resolve("DatadogHeap::Railtie"))
      railtie::DEFAULTS.keys + railtie::UNSET_BY_DEFAULT
    else
      source = File.read(File.join(lib, "datadog_heap", "railtie.rb"))
      (source[/DEFAULTS = \{(.*?)\}\.freeze/m, 1].to_s.scan(/(\w+):/).flatten +
        source[/UNSET_BY_DEFAULT = %i\[(.*?)\]/m, 1].to_s.split).map(&:to_sym)
    end
    return ["DatadogHeap::Railtie: its settings (DEFAULTS) could not be read"] if keys.empty?

    missing = keys.reject { |k| text(doc.comment).include?("config.datadog_heap.#{k}") }
    missing.map { |k| "DatadogHeap::Railtie: setting config.datadog_heap.#{k} is not in the class comment" }
  end

  def main(argv)
    lib = File.join(ROOT, "lib")
    static = false
    args = argv.dup
    until args.empty?
      case (arg = args.shift)
      when "--lib" then lib = File.expand_path(args.shift.to_s)
      when "--static" then static = true
      else
        warn "usage: ruby .ci/api_docs.rb [--lib DIR] [--static]"
        return 2
      end
    end
    store = rdoc_store(lib)
    unless static
      $LOAD_PATH.unshift(lib)
      begin
        require "rails"
      rescue LoadError
        warn "api docs: Rails is not installed: DatadogHeap::Railtie checked from its source only"
      end
      REQUIRES.each { |f| require f }
      require "datadog_heap/railtie" if defined?(::Rails::Railtie)
    end
    problems = static_problems(store, lib)
    problems += runtime_problems(store) unless static
    problems += railtie_problems(store, lib)
    problems.uniq!
    if problems.empty?
      checked = API.keys.size
      puts "api docs: the #{checked} classes and modules of the public API, their public methods and attributes are documented#{" (RDoc's view only)" if static}"
      0
    else
      warn "api docs: #{problems.size} undocumented:", *problems.map { |p| "  #{p}" }
      1
    end
  end
end

exit ApiDocs.main(ARGV) if $PROGRAM_NAME == __FILE__
