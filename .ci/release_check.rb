#!/usr/bin/env ruby
# frozen_string_literal: true

# Checks built gems before they are pushed; `rake release:check` builds them and runs this.
#
#   ruby .ci/release_check.rb [--release] GEM...
#       For each gem: lists its files; fails on a file no gem should carry (anything under a
#       target/ or tmp/ directory, a built object, a gem, an editor's leftover, a file outside the
#       directories the gem is made of), on LICENSE, NOTICE or THIRD_PARTY_NOTICES missing, on a
#       source gem without its Rust sources or with a prebuilt extension, on a platform gem
#       without an extension or with sources, on a file git does not track (in a checkout; the
#       platform gem's extensions are built, not tracked), and on any warning RubyGems gives about the gem's
#       specification (what `gem build` prints). Then checks that the gem's version, the version
#       in lib/datadog_heap/version.rb, the crates' versions (Cargo.toml, Cargo.lock) and
#       CHANGELOG.md's newest version agree, and writes GEM.sha256 beside each gem (sha256sum's
#       format: `sha256sum -c` checks it). --release (RELEASE=1 in rake): also require the top
#       section of CHANGELOG.md to be that version with a date, not Unreleased.
#
#   ruby .ci/release_check.rb --files source|platform < LIST
#       Checks a file list (one path a line) as it would the files of such a gem: what the specs
#       use to check the gemspecs without building gems.

require "digest"
require "rubygems/package"
require "stringio"

module ReleaseCheck
  ROOT = File.expand_path("..", __dir__)
  # What a gem is made of: these files at the top, and files under these directories.
  TOP_FILES = %w[README.md CHANGELOG.md LICENSE NOTICE THIRD_PARTY_NOTICES Cargo.toml Cargo.lock datadog_heap.gemspec].freeze
  TOP_DIRS = %w[lib exe sig src ext ffi].freeze
  REQUIRED = %w[LICENSE NOTICE THIRD_PARTY_NOTICES lib/datadog_heap.rb lib/datadog_heap/version.rb exe/datadog-heap sig/datadog_heap.rbs].freeze
  # Files no gem should carry, whatever the gemspec's globs match.
  STRAY = [
    [%r{(\A|/)(target|tmp|pkg|\.git|node_modules)/}, "a build or scratch directory"],
    [/\.(o|a|rlib|rmeta|d|gem|log|orig|rej|swp|tmp)\z|~\z|\.tmp-\d+\z/, "a build artefact or an editor's leftover"],
    [%r{(\A|/)(Makefile|mkmf\.log|\.DS_Store)\z}, "a generated file"],
    [%r{\.built-for\z}, "a build stamp"],
  ].freeze
  CRATES = %w[datadog_heap datadog_heap_core datadog_heap_cabi].freeze

  module_function

  # Problems with the file list of a gem of `kind` (:source or :platform).
  def file_problems(files, kind)
    problems = []
    files.each do |f|
      top = f.split("/").first
      unless TOP_FILES.include?(f) || (TOP_DIRS.include?(top) && f.include?("/"))
        problems << "#{f}: not a file a gem is made of (#{TOP_FILES.join(", ")}, #{TOP_DIRS.map { |d| "#{d}/" }.join(", ")})"
      end
      STRAY.each { |pattern, what| problems << "#{f}: #{what}" if f.match?(pattern) }
    end
    (REQUIRED - files).each { |f| problems << "#{f}: missing" }
    so = files.grep(%r{\Alib/datadog_heap/\d+\.\d+/datadog_heap\.so\z})
    case kind
    when :source
      %w[Cargo.toml Cargo.lock ext/datadog_heap/extconf.rb ext/datadog_heap/Cargo.toml src/lib.rs].each do |f|
        problems << "#{f}: missing (the source gem builds the extension on install)" unless files.include?(f)
      end
      problems += files.grep(/\.(so|bundle|dll)\z/).map { |f| "#{f}: a prebuilt extension in the source gem" }
    when :platform
      problems << "lib/datadog_heap/<ruby>/datadog_heap.so: none (a platform gem carries one per Ruby)" if so.empty?
      problems += files.grep(%r{\A(src|ext|ffi)/|\ACargo\.(toml|lock)\z}).map { |f| "#{f}: a source file in a platform gem" }
      problems += (files.grep(/\.(so|bundle|dll)\z/) - so).map { |f| "#{f}: an extension outside lib/datadog_heap/<ruby>/" }
    end
    problems
  end

  # Files of the list that git does not track (a scratch file a glob picked up), but for the
  # extensions a platform gem carries; none outside a git checkout or without git.
  def untracked(files)
    tracked = begin
      IO.popen(["git", "-C", ROOT, "ls-files", "-z"], err: File::NULL, &:read).to_s.split("\0")
    rescue Errno::ENOENT
      return [] # no git here (a Ruby chroot): nothing to tell tracked files by
    end
    return [] unless $?.success? && !tracked.empty?

    (files - tracked).reject { |f| f.match?(%r{\Alib/datadog_heap/\d+\.\d+/datadog_heap\.so\z}) }
  end

  # RubyGems' warnings about `spec` (homepage missing, open-ended dependencies, ...).
  def spec_warnings(spec)
    out = StringIO.new
    ui = Gem::StreamUI.new(StringIO.new, out, out, false)
    Gem::DefaultUserInteraction.use_ui(ui) { spec.validate(false) }
    out.string.lines.map(&:strip).grep(/\AWARNING:/).reject { |l| l.include?("See https://guides.rubygems.org") }
  rescue Gem::InvalidSpecificationException => e
    ["invalid: #{e.message}"]
  end

  # [[what, version], ...] the project states, from the sources.
  def versions
    found = []
    found << ["lib/datadog_heap/version.rb", File.read(File.join(ROOT, "lib/datadog_heap/version.rb"))[/VERSION = "([^"]+)"/, 1]]
    cargo = File.read(File.join(ROOT, "Cargo.toml"))
    found << ["Cargo.toml [workspace.package]", cargo[/^\[workspace\.package\]\n(?:.*\n)*?version = "([^"]+)"/, 1]]
    %w[Cargo.toml ext/datadog_heap/Cargo.toml ffi/Cargo.toml].each do |manifest|
      text = File.read(File.join(ROOT, manifest))
      package = text[/^\[package\]\n(.*?)(?=^\[)/m, 1].to_s
      own = package[/^version = "([^"]+)"/, 1]
      found << ["#{manifest} [package]", own] if own # else version.workspace = true
    end
    lock = File.read(File.join(ROOT, "Cargo.lock"))
    CRATES.each do |crate|
      found << ["Cargo.lock #{crate}", lock[/^name = "#{crate}"\nversion = "([^"]+)"/, 1]]
    end
    found
  end

  # [version, heading] of CHANGELOG.md's newest version section, and its top section's heading.
  def changelog
    headings = File.read(File.join(ROOT, "CHANGELOG.md")).lines.grep(/\A## \[/).map(&:strip)
    newest = headings.find { |h| !h.match?(/\A## \[Unreleased\]/i) }
    [newest && newest[/\A## \[([^\]]+)\]/, 1], newest, headings.first]
  end

  def version_problems(gem_versions, release:)
    problems = []
    stated = versions
    stated += gem_versions
    log_version, newest, top = changelog
    stated << ["CHANGELOG.md's newest version (#{newest})", log_version]
    expected = stated.first[1]
    stated.each do |what, version|
      problems << "#{what}: #{version.inspect}, not #{expected.inspect} (lib/datadog_heap/version.rb)" unless version == expected
    end
    if release
      problems << "CHANGELOG.md: the top section is #{top.inspect}; a release's is `## [#{expected}] - YYYY-MM-DD`" unless top == newest
      problems << "CHANGELOG.md: #{newest.inspect} has no release date (YYYY-MM-DD)" unless newest.to_s.match?(/\d{4}-\d{2}-\d{2}/)
    end
    problems
  end

  def gem_kind(spec)
    spec.platform.to_s == "ruby" ? :source : :platform
  end

  def main(argv)
    args = argv.dup
    if args.first == "--files"
      kind = args[1].to_s.to_sym
      return usage unless %i[source platform].include?(kind) && args.size == 2

      problems = file_problems($stdin.read.lines.map(&:chomp).reject(&:empty?), kind)
      return report(problems, "the #{kind} gem's files")
    end
    release = !args.delete("--release").nil?
    return usage if args.empty? || args.any? { |a| a.start_with?("-") }

    problems = []
    gem_versions = []
    # A sum from an earlier run must not outlive a failed check.
    args.each { |path| File.delete("#{path}.sha256") if File.exist?("#{path}.sha256") }
    args.each do |path|
      unless File.file?(path)
        problems << "#{path}: no such gem"
        next
      end
      package = Gem::Package.new(path)
      spec = package.spec
      files = package.contents.sort
      kind = gem_kind(spec)
      puts "#{File.basename(path)} (#{kind}, #{spec.platform}, #{(File.size(path) / 1024.0).round} KiB, #{files.size} files):"
      files.each { |f| puts "  #{f}" }
      problems += file_problems(files, kind).map { |p| "#{File.basename(path)}: #{p}" }
      problems += spec_warnings(spec).map { |w| "#{File.basename(path)}: gemspec #{w}" }
      problems += untracked(files).map { |f| "#{File.basename(path)}: #{f}: not tracked by git" }
      gem_versions << ["#{File.basename(path)}", spec.version.to_s]
    end
    problems += version_problems(gem_versions, release: release)
    status = report(problems, "#{args.size} gem#{"s" unless args.size == 1}")
    return status unless status.zero?

    args.each do |path|
      sum = "#{Digest::SHA256.file(path).hexdigest}  #{File.basename(path)}\n"
      File.write("#{path}.sha256", sum)
      print "#{path}.sha256: #{sum}"
    end
    0
  end

  def report(problems, what)
    if problems.empty?
      puts "release check: #{what}: no problem found"
      0
    else
      warn "release check: #{what}: #{problems.size} problem#{"s" unless problems.size == 1}:", *problems.map { |p| "  #{p}" }
      1
    end
  end

  def usage
    warn "usage: ruby .ci/release_check.rb [--release] GEM... | --files source|platform < LIST"
    2
  end
end

exit ReleaseCheck.main(ARGV) if $PROGRAM_NAME == __FILE__
