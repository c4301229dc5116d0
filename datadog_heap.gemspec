# frozen_string_literal: true

require_relative "lib/datadog_heap/version"

Gem::Specification.new do |spec|
  spec.name = "datadog_heap"
  spec.version = DatadogHeap::VERSION
  spec.authors = ["datadog_heap contributors"]
  spec.license = "Apache-2.0"
  spec.summary = "Sampling live-heap recorder for CRuby, written in Rust, with pprof output"
  spec.description = <<~DESC
    Samples one Ruby allocation in N, remembers its stack, tracks whether the object is still
    alive, and reports the live ones as a pprof heap profile: a Rust port of the heap recorder in
    Datadog's Ruby profiler, usable on its own from any Ruby program or profiler.
  DESC
  spec.required_ruby_version = ">= 3.1"

  # Where the project lives. Every URI below derives from it; `rake release:check` checks that
  # they are all set and use https.
  source = "https://github.com/DataDog/datadog_heap"
  spec.homepage = source
  # The homepage is the repository: RubyGems shows `homepage` as the home page, and from 3.5 it
  # warns when two *_uri keys share a URI, so the metadata names the source once.
  spec.metadata = {
    "source_code_uri" => source,
    "changelog_uri" => "#{source}/blob/main/CHANGELOG.md",
    "bug_tracker_uri" => "#{source}/issues",
    "documentation_uri" => "https://rubydoc.info/gems/datadog_heap/#{spec.version}",
    # Pushing a version needs the owner's second factor.
    "rubygems_mfa_required" => "true",
  }

  # Dir globs rather than `git ls-files`, so a checkout with uncommitted files builds too. The
  # binding crate depends on the core crate by path, so the whole Cargo workspace ships: root
  # Cargo.toml and Cargo.lock, src/ and ext/ (never a target/ directory or a stale Makefile).
  # LICENSE, NOTICE and THIRD_PARTY_NOTICES (the licenses of the crates the extension links in,
  # `rake licenses:notices`) go in every gem, the platform gems too.
  spec.files = Dir[
    "README.md", "CHANGELOG.md", "LICENSE", "NOTICE", "THIRD_PARTY_NOTICES", "Cargo.toml", "Cargo.lock", "*.gemspec",
    "src/**/*",
    "ext/**/{Cargo.toml,extconf.rb,*.rs}",
    # ffi/ (the C ABI for Datadog's profiler) is a workspace member: cargo needs its manifest and
    # sources to load the workspace, though the gem never builds it.
    "ffi/Cargo.toml", "ffi/src/**/*.rs",
    "lib/**/*.rb",
    "exe/*",
    "sig/**/*.rbs",
  ].reject { |f| File.directory?(f) || f.include?("/target/") }
  spec.require_paths = ["lib"]
  spec.bindir = "exe"
  spec.executables = Dir["exe/*"].map { |f| File.basename(f) }
  spec.extensions = ["ext/datadog_heap/extconf.rb"]
end
