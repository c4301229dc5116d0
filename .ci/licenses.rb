#!/usr/bin/env ruby
# frozen_string_literal: true

# The licenses of the Rust crates this project builds, from `cargo metadata` (that is, Cargo.lock)
# and the crates' own sources in cargo's cache. Two jobs:
#
#   ruby .ci/licenses.rb check     fails (exit 1) when a crate the gems build declares no license,
#                                  a license expression the allowed list below cannot satisfy, or
#                                  comes from anywhere but crates.io or this workspace, or is one
#                                  of the banned crates; and when THIRD_PARTY_NOTICES is not what
#                                  `notices` would write now (a crate added, removed or updated)
#   ruby .ci/licenses.rb notices   writes THIRD_PARTY_NOTICES: every crate linked into the
#                                  extension, its declared license, and the license texts it ships
#
# `--metadata FILE` (repeatable) reads `cargo metadata --format-version 1` output from FILE instead
# of running cargo (the spec feeds it made-up documents); `--notices FILE` checks or writes another
# file than THIRD_PARTY_NOTICES. `rake licenses:check` and `rake licenses:notices` run these. Why a
# script of ours and not cargo-deny or cargo-about: see docs/development.md.

require "json"
require "open3"

module ThirdPartyLicenses
  ROOT = File.expand_path("..", __dir__)
  NOTICES = File.join(ROOT, "THIRD_PARTY_NOTICES")

  # The crates built into what the gems ship: the Ruby extension, and the C ABI crate whose
  # sources the source gem carries (it is linked into Datadog's profiler by whoever builds it).
  # The notices cover the extension; the license check covers both.
  EXTENSION = "datadog_heap"
  CHECKED = %w[datadog_heap datadog_heap_cabi].freeze
  # The platform gems are built for these (x86_64-linux, and aarch64-linux by bin/arm64-check).
  TARGETS = %w[x86_64-unknown-linux-gnu aarch64-unknown-linux-gnu].freeze
  CRATES_IO = "registry+https://github.com/rust-lang/crates.io-index"

  # SPDX identifiers a dependency may be used under. Each was reviewed for shipping in a binary
  # gem under Apache-2.0: permissive ones ask only that their notice and text travel with the
  # binary (THIRD_PARTY_NOTICES does that). MPL-2.0 (bitmaps, through libdd-profiling) is
  # copyleft per file: allowed because we ship its files unmodified and its source is on
  # crates.io, as the notices say. Adding an identifier here is a review decision: say why in the
  # commit. GPL, LGPL, AGPL, SSPL and the like are not here on purpose.
  ALLOWED = %w[
    Apache-2.0 MIT MIT-0 BSD-2-Clause BSD-3-Clause ISC Zlib 0BSD Unlicense Unicode-3.0 MPL-2.0
  ].freeze
  # License exceptions (SPDX `WITH`) accepted after an allowed license.
  ALLOWED_EXCEPTIONS = %w[LLVM-exception].freeze
  # Crates that must not be built in, and why.
  BANNED = {
    "openssl-sys" => "links the build machine's libssl: the platform gem must load on any glibc 2.17 Linux (rustls is used instead)",
    "openssl" => "links the build machine's libssl (see openssl-sys)",
  }.freeze
  # Texts a crate's package does not carry but its upstream asks to pass on (Apache-2.0 §4(d)):
  # libdatadog's NOTICE, for its libdd-* crates.
  UPSTREAM_NOTICES = {
    /\Alibdd-/ => <<~TEXT,
      Datadog libdatadog
      Copyright 2021 Datadog, Inc.

      This product includes software developed at Datadog (<https://www.datadoghq.com/>).
    TEXT
  }.freeze
  # The license files a crate ships, by name at the top of its package.
  LICENSE_FILE = /\A(licen[cs]e|copying|notice|unlicense|copyright)([-._].*)?\z/i

  class Error < StandardError; end

  module_function

  # `cargo metadata` for each target, or the documents given.
  def metadata(files)
    return files.map { |f| JSON.parse(File.read(f)) } unless files.empty?

    TARGETS.map do |target|
      cmd = ["cargo", "metadata", "--locked", "--offline", "--format-version", "1", "--filter-platform", target,
        "--manifest-path", File.join(ROOT, "Cargo.toml")]
      out, err, status = Open3.capture3(*cmd)
      unless status.success?
        raise Error, "#{cmd.join(" ")} failed:\n#{err}\n(a crate of Cargo.lock missing from cargo's cache? `cargo fetch --locked` fetches them)"
      end
      JSON.parse(out)
    end
  end

  # The packages reachable from the workspace crates `roots` in one metadata document, with
  # `follow` picking which dependency kinds to walk (nil: normal, "build", "dev") and `into`
  # whether to walk into a package's dependencies. Returns {id => package}.
  def reachable(doc, roots, follow:, into: ->(_pkg) { true })
    packages = doc.fetch("packages").to_h { |p| [p.fetch("id"), p] }
    nodes = doc.fetch("resolve").fetch("nodes").to_h { |n| [n.fetch("id"), n] }
    start = doc.fetch("packages").select { |p| roots.include?(p["name"]) && doc.fetch("workspace_members").include?(p["id"]) }
    raise Error, "no workspace crate named #{roots.join(" or ")} in the metadata" if start.empty?

    seen = {}
    start_ids = start.map { |p| p["id"] }
    stack = start_ids.dup
    while (id = stack.pop)
      next if seen.key?(id)

      seen[id] = packages.fetch(id)
      next unless start_ids.include?(id) || into.call(seen[id])

      nodes.fetch(id).fetch("deps").each do |dep|
        kinds = dep.fetch("dep_kinds").map { |k| k["kind"] }
        stack << dep.fetch("pkg") if kinds.any? { |k| follow.include?(k) }
      end
    end
    seen
  end

  def proc_macro?(pkg)
    pkg.fetch("targets").any? { |t| t.fetch("kind").include?("proc-macro") }
  end

  # Every crate built for the checked crates (normal and build dependencies, proc macros: all that
  # cargo compiles when the source gem installs), over all documents, keyed "name version".
  def built(docs)
    docs.each_with_object({}) do |doc, all|
      reachable(doc, CHECKED, follow: [nil, "build"]).each_value do |pkg|
        all["#{pkg["name"]} #{pkg["version"]}"] ||= pkg unless doc.fetch("workspace_members").include?(pkg["id"])
      end
    end
  end

  # The crates linked into the extension: normal dependencies, not through a proc macro or a
  # build script (those run at build time only).
  def linked(docs)
    docs.each_with_object({}) do |doc, all|
      reachable(doc, [EXTENSION], follow: [nil], into: ->(pkg) { !proc_macro?(pkg) }).each_value do |pkg|
        next if doc.fetch("workspace_members").include?(pkg["id"]) || proc_macro?(pkg)

        all["#{pkg["name"]} #{pkg["version"]}"] ||= pkg
      end
    end.sort_by { |key, pkg| [pkg["name"], Gem::Version.new(pkg["version"].sub(/\+.*/, "")), key] }.to_h
  end

  # Tokens of an SPDX license expression; "/" (an old crates.io form) reads as OR.
  def tokens(expression)
    expression.gsub("/", " OR ").scan(/\(|\)|[^\s()]+/)
  end

  # Whether the SPDX expression `expression` can be satisfied with ALLOWED licenses: OR takes
  # either side, AND needs both (AND binds tighter), "X+" is X or later (X must be allowed),
  # "X WITH E" needs an allowed X and E. Raises Error on an expression it cannot parse.
  def allowed?(expression)
    toks = tokens(expression)
    raise Error, "empty license expression" if toks.empty?

    pos = 0
    peek = -> { toks[pos] }
    take = -> { toks[pos].tap { pos += 1 } }
    parse_or = nil
    parse_atom = lambda do
      tok = take.call
      case tok
      when nil, ")", "AND", "OR", "WITH" then raise Error, "cannot parse license expression #{expression.inspect}"
      when "("
        value = parse_or.call
        raise Error, "unbalanced parentheses in license expression #{expression.inspect}" unless take.call == ")"
        value
      else
        ok = ALLOWED.include?(tok.delete_suffix("+"))
        if peek.call == "WITH"
          take.call
          exception = take.call
          raise Error, "no exception after WITH in license expression #{expression.inspect}" if exception.nil? || exception == ")"
          ok &&= ALLOWED_EXCEPTIONS.include?(exception)
        end
        ok
      end
    end
    parse_and = lambda do
      value = parse_atom.call
      while peek.call == "AND"
        take.call
        value = parse_atom.call & value
      end
      value
    end
    parse_or = lambda do
      value = parse_and.call
      while peek.call == "OR"
        take.call
        value = parse_and.call | value
      end
      value
    end
    value = parse_or.call
    raise Error, "unexpected #{peek.call.inspect} in license expression #{expression.inspect}" unless pos == toks.size

    value
  end

  # The problems with the crates built, one line each (empty: none).
  def problems(docs)
    built(docs).values.sort_by { |p| [p["name"], p["version"]] }.flat_map do |pkg|
      name = "#{pkg["name"]} #{pkg["version"]}"
      found = []
      license = pkg["license"]
      if license.nil? || license.strip.empty?
        found << "#{name}: no license expression in its Cargo.toml#{" (only license-file = #{pkg["license_file"]})" if pkg["license_file"]}: review it by hand"
      else
        begin
          found << "#{name}: license #{license.inspect} is not in the allowed list (#{ALLOWED.join(", ")})" unless allowed?(license)
        rescue Error => e
          found << "#{name}: #{e.message}"
        end
      end
      if pkg["source"] != CRATES_IO
        found << "#{name}: comes from #{pkg["source"] || "a path outside the workspace"}, not crates.io"
      end
      found << "#{name}: banned: #{BANNED[pkg["name"]]}" if BANNED.key?(pkg["name"])
      found
    end
  end

  # The license files a package ships: [[file name, text], ...], sorted by name.
  def license_files(pkg)
    dir = File.dirname(pkg.fetch("manifest_path"))
    names = Dir.exist?(dir) ? Dir.children(dir).grep(LICENSE_FILE).select { |f| File.file?(File.join(dir, f)) } : []
    if pkg["license_file"] && File.file?(File.join(dir, pkg["license_file"]))
      names |= [pkg["license_file"]]
    end
    names.sort.map { |f| [f, File.read(File.join(dir, f), mode: "r:bom|utf-8").scrub.gsub("\r\n", "\n")] }
  end

  # For a crate that ships no license file: the standard text of one license its expression
  # allows, Apache-2.0 (our LICENSE holds it) or MIT (with the crate's authors as holders).
  def standard_text(pkg)
    ids = tokens(pkg["license"].to_s) - %w[( ) AND OR WITH]
    if ids.include?("Apache-2.0")
      ["Apache-2.0 (standard text; the crate ships no license file)", File.read(File.join(ROOT, "LICENSE"))]
    elsif ids.include?("MIT")
      holders = Array(pkg["authors"]).map { |a| a.sub(/\s*<[^>]*>/, "") }
      holders = ["the #{pkg["name"]} authors"] if holders.empty?
      ["MIT (standard text; the crate ships no license file)", format(File.read(File.join(__dir__, "licenses", "MIT.txt")), holders: holders.join(", "))]
    end
  end

  def normalize(text)
    text.split.join(" ")
  end

  # The text of THIRD_PARTY_NOTICES for `docs`.
  def notices(docs)
    crates = linked(docs)
    texts = {} # normalized text => [index, text, [users]]
    rows = crates.map do |key, pkg|
      files = license_files(pkg)
      if files.empty?
        std = standard_text(pkg)
        raise Error, "#{key} ships no license file and #{pkg["license"].inspect} names no license with a standard text here" unless std

        files = [std]
      end
      UPSTREAM_NOTICES.each { |pattern, text| files += [["NOTICE (upstream's; not in the crate's package)", text]] if pattern.match?(pkg["name"]) }
      refs = files.map do |file, text|
        entry = (texts[normalize(text)] ||= [texts.size + 1, text, []])
        entry[2] << "#{key} (#{file})"
        entry[0]
      end
      [key, pkg["license"], refs.uniq.sort]
    end
    width = rows.map { |key, _, _| key.size }.max.to_i
    lines = []
    lines << "Third-party software in datadog_heap's native extension"
    lines << "=" * 55
    lines << ""
    lines << "The prebuilt extension of the platform gems (lib/datadog_heap/<ruby>/datadog_heap.so) and the one"
    lines << "the source gem compiles on install link in the #{rows.size} Rust crates below, all from crates.io, each"
    lines << "under the license it declares (an SPDX expression). The license and notice files each crate"
    lines << "ships follow the list, each distinct text once, numbered. The Rust standard library is linked"
    lines << "in too, under MIT OR Apache-2.0 (https://github.com/rust-lang/rust)."
    lines << "The source of MPL-2.0 code (bitmaps) is that crate's package on crates.io, unmodified."
    lines << ""
    lines << "Generated by `rake licenses:notices` (.ci/licenses.rb) from Cargo.lock and the crates' sources;"
    lines << "do not edit by hand."
    lines << ""
    lines << "Crates"
    lines << "------"
    lines << ""
    rows.each { |key, license, refs| lines << format("%-#{width}s  %s  [%s]", key, license, refs.join(", ")) }
    texts.each_value do |index, text, users|
      lines << ""
      lines << ""
      lines << "#{"-" * 20} #{index} #{"-" * 20}"
      lines << "Shipped by: #{users.join(", ")}"
      lines << ""
      lines.concat(text.rstrip.lines.map(&:rstrip))
    end
    lines.join("\n") << "\n"
  end

  def main(argv)
    files = []
    notices_file = NOTICES
    args = argv.dup
    command = args.shift
    until args.empty?
      case (arg = args.shift)
      when "--metadata" then files << (args.shift or raise Error, "--metadata needs a FILE")
      when "--notices" then notices_file = (args.shift or raise Error, "--notices needs a FILE")
      else raise Error, "unknown argument #{arg.inspect}"
      end
    end
    docs = metadata(files)
    case command
    when "check"
      found = problems(docs)
      expected = notices(docs)
      if !File.exist?(notices_file)
        found << "#{notices_file} is missing: `rake licenses:notices` writes it"
      elsif File.read(notices_file) != expected
        found << "#{notices_file} is stale (the crates or their license files changed): `rake licenses:notices` rewrites it; review the diff"
      end
      if found.empty?
        puts "licenses: #{built(docs).size} crates built, #{linked(docs).size} linked into the extension, all allowed; #{File.basename(notices_file)} is current"
        0
      else
        warn "licenses: #{found.size} problem#{"s" unless found.size == 1}:", *found.map { |f| "  #{f}" }
        1
      end
    when "notices"
      found = problems(docs)
      unless found.empty?
        warn "licenses: not writing #{notices_file}:", *found.map { |f| "  #{f}" }
        return 1
      end
      File.write(notices_file, notices(docs))
      puts "wrote #{notices_file} (#{linked(docs).size} crates)"
      0
    else
      warn "usage: ruby .ci/licenses.rb check|notices [--metadata FILE]... [--notices FILE]"
      2
    end
  rescue Error => e
    warn "licenses: #{e.message}"
    1
  end
end

exit ThirdPartyLicenses.main(ARGV) if $PROGRAM_NAME == __FILE__
