# frozen_string_literal: true

require_relative "spec_helper"
require "fileutils"
require "open3"
require "rbconfig"
require "rubygems/package"
require "tmpdir"

# What the gems carry and how the extension is found. Building and installing the gems is
# .ci/check-gems' job (it needs every Ruby's extension and minutes): here, the source gem's file
# list and the message a precompiled gem gives on a Ruby it has no extension for.
RSpec.describe "packaging" do
  root = File.expand_path("..", __dir__)

  it "ships in the source gem what extconf.rb needs to build, the Ruby code, the CLI and the signatures" do
    spec = Dir.chdir(root) { Gem::Specification.load(File.join(root, "datadog_heap.gemspec")) }
    expect(spec.extensions).to eq(["ext/datadog_heap/extconf.rb"])
    expect(spec.files).to include("Cargo.toml", "Cargo.lock", "src/lib.rs", "ext/datadog_heap/Cargo.toml",
      "ext/datadog_heap/build.rs", "ext/datadog_heap/src/lib.rs", "ext/datadog_heap/extconf.rb",
      "lib/datadog_heap.rb", "lib/datadog_heap/middleware.rb", "lib/datadog_heap/railtie.rb",
      "lib/datadog_heap/auto_mode.rb", "sig/datadog_heap.rbs", "exe/datadog-heap")
    expect(spec.files).to include(*Dir.chdir(root) { Dir["lib/**/*.rb", "src/**/*.rs", "ext/**/*.rs"] })
    expect(spec.files.grep(%r{(\A|/)target/|\.so\z|\.gem\z|\Atmp/|\Apkg/})).to eq([])
    expect(spec.executables).to eq(["datadog-heap"])
  end

  it "ships LICENSE, NOTICE and THIRD_PARTY_NOTICES in the source gem and in the platform gems" do
    spec = Dir.chdir(root) { Gem::Specification.load(File.join(root, "datadog_heap.gemspec")) }
    expect(spec.files).to include("LICENSE", "NOTICE", "THIRD_PARTY_NOTICES")
    expect(File.read(File.join(root, "LICENSE"))).to include("Apache License", "Version 2.0, January 2004", "END OF TERMS AND CONDITIONS")
    # The platform gems' file lists come from the Rakefile's platform_gemspec, which drops the
    # sources that build the extension: the notices must survive that.
    out, status = Open3.capture2e(RbConfig.ruby, "-rrake", "-e",
      'load "Rakefile"; puts platform_gemspec("x86_64-linux").files, "--", platform_gemspec("aarch64-linux").files',
      chdir: root)
    expect(status).to be_success, out
    x86, arm = out.split("--\n").map(&:lines).map { |l| l.map(&:chomp) }
    [x86, arm].each do |files|
      expect(files).to include("LICENSE", "NOTICE", "THIRD_PARTY_NOTICES", "lib/datadog_heap.rb")
      expect(files.grep(%r{\A(src|ext|ffi)/|\ACargo\.})).to eq([])
    end
  end

  it "has the metadata RubyGems shows, and builds without a warning" do
    spec = Dir.chdir(root) { Gem::Specification.load(File.join(root, "datadog_heap.gemspec")) }
    expect(spec.homepage).to start_with("https://")
    # No homepage_uri beside the homepage: RubyGems (3.5 on Ruby 3.3) warns when two URIs are one.
    expect(spec.metadata.keys).to include("source_code_uri", "changelog_uri", "bug_tracker_uri", "documentation_uri")
    expect(spec.metadata.values_at("source_code_uri", "changelog_uri", "bug_tracker_uri", "documentation_uri"))
      .to all(start_with("https://"))
    expect(spec.metadata["rubygems_mfa_required"]).to eq("true")
    expect(spec.license).to eq("Apache-2.0")
    Dir.mktmpdir("packaging") do |dir|
      out, status = Open3.capture2e("gem", "build", "datadog_heap.gemspec", "--output", File.join(dir, "x.gem"), chdir: root)
      expect(status).to be_success, out
      expect(out).not_to match(/WARNING/i)
    end
  end

  describe "the license check (.ci/licenses.rb)" do
    script = File.join(root, ".ci", "licenses.rb")
    crates_io = "registry+https://github.com/rust-lang/crates.io-index"

    # A cargo metadata document: the extension crate depending on `deps`, each [name, license]
    # or [name, license, source], with a crate directory under `dir` holding a LICENSE file.
    def metadata(dir, deps, crates_io)
      ext = {"name" => "datadog_heap", "version" => "0.1.0", "id" => "path+file://#{dir}/ext#0.1.0", "source" => nil,
             "license" => "Apache-2.0", "manifest_path" => File.join(dir, "ext", "Cargo.toml"), "targets" => [{"kind" => ["cdylib"]}]}
      packages = deps.map do |name, license, source|
        crate = File.join(dir, "#{name}-1.0.0")
        FileUtils.mkdir_p(crate)
        File.write(File.join(crate, "LICENSE"), "#{license} text of #{name}\n")
        {"name" => name, "version" => "1.0.0", "id" => "#{source || crates_io}##{name}@1.0.0", "source" => source || crates_io,
         "license" => license, "manifest_path" => File.join(crate, "Cargo.toml"), "targets" => [{"kind" => ["lib"]}]}
      end
      nodes = [{"id" => ext["id"], "deps" => packages.map { |p| {"pkg" => p["id"], "dep_kinds" => [{"kind" => nil}]} }}] +
        packages.map { |p| {"id" => p["id"], "deps" => []} }
      file = File.join(dir, "metadata.json")
      File.write(file, JSON.generate("packages" => [ext, *packages], "workspace_members" => [ext["id"]], "resolve" => {"nodes" => nodes}))
      file
    end

    define_method(:licenses) do |*args|
      out, err, status = Open3.capture3(RbConfig.ruby, script, *args)
      [out, err, status.exitstatus]
    end

    it "passes allowed licenses, and fails on a disallowed one, naming the crate and its license" do
      require "json"
      Dir.mktmpdir("licenses") do |dir|
        notices = File.join(dir, "NOTICES")
        allowed = [["permissive", "MIT OR Apache-2.0"], ["either", "GPL-3.0-only OR MIT"], ["legacy", "Apache-2.0/MIT"],
          ["later", "MPL-2.0+"], ["nested", "ISC AND (Apache-2.0 OR ISC OR MIT-0)"]]
        doc = metadata(dir, allowed, crates_io)
        out, err, code = licenses("notices", "--metadata", doc, "--notices", notices)
        expect([err, code]).to eq(["", 0]), out
        text = File.read(notices)
        expect(text).to include("permissive 1.0.0", "either 1.0.0", "MIT OR Apache-2.0 text of permissive")
        out, err, code = licenses("check", "--metadata", doc, "--notices", notices)
        expect([err, code]).to eq(["", 0]), out
        expect(out).to include("all allowed", "is current")

        # A GPL crate added: the check fails and says which crate and which license.
        doc = metadata(dir, allowed + [["copyleft", "GPL-3.0-only"]], crates_io)
        _, err, code = licenses("check", "--metadata", doc, "--notices", notices)
        expect(code).to eq(1)
        expect(err).to include(%(copyleft 1.0.0: license "GPL-3.0-only" is not in the allowed list))
        # ... and notices are not written with it in.
        _, err, code = licenses("notices", "--metadata", doc, "--notices", notices)
        expect(code).to eq(1)
        expect(err).to include("copyleft 1.0.0")
        expect(File.read(notices)).to eq(text)
      end
    end

    it "fails on an AND with a disallowed license, a missing license, a source other than crates.io, a banned crate, stale notices" do
      require "json"
      Dir.mktmpdir("licenses") do |dir|
        notices = File.join(dir, "NOTICES")
        doc = metadata(dir, [["ok", "MIT"]], crates_io)
        expect(licenses("notices", "--metadata", doc, "--notices", notices).last).to eq(0)
        bad = [["ok", "MIT"], ["both", "MIT AND LGPL-2.1-or-later"], ["none", nil], ["broken", "MIT OR (Apache-2.0"],
          ["gitdep", "MIT", "git+https://example.com/gitdep#abc"], ["openssl-sys", "MIT"]]
        _, err, code = licenses("check", "--metadata", metadata(dir, bad, crates_io), "--notices", notices)
        expect(code).to eq(1)
        expect(err).to include(%(both 1.0.0: license "MIT AND LGPL-2.1-or-later" is not in the allowed list),
          "none 1.0.0: no license expression", "broken 1.0.0: unbalanced parentheses",
          "gitdep 1.0.0: comes from git+https://example.com/gitdep#abc, not crates.io",
          "openssl-sys 1.0.0: banned", "NOTICES is stale")
        expect(err).not_to include("ok 1.0.0:")
        # An allowed crate added is not an error of its own, but the notices no longer match.
        _, err, code = licenses("check", "--metadata", metadata(dir, [["ok", "MIT"], ["new", "MIT"]], crates_io), "--notices", notices)
        expect(code).to eq(1)
        expect(err).to include("NOTICES is stale").and(satisfy { |e| e.lines.size == 2 })
      end
    end
  end

  describe "the release check (.ci/release_check.rb)" do
    script = File.join(root, ".ci", "release_check.rb")

    define_method(:check_files) do |kind, files|
      out, err, status = Open3.capture3(RbConfig.ruby, script, "--files", kind, stdin_data: files.join("\n"))
      [out, err, status.exitstatus]
    end

    it "passes the gemspec's files as a source gem, and as a platform gem with its extensions" do
      out, status = Open3.capture2e(RbConfig.ruby, "-rrake", "-e",
        'load "Rakefile"; puts load_gemspec.files, "--", platform_gemspec("x86_64-linux").files', chdir: root)
      expect(status).to be_success, out
      source, platform = out.split("--\n").map { |part| part.lines.map(&:chomp) }
      expect(check_files("source", source)).to eq(["release check: the source gem's files: no problem found\n", "", 0])
      platform += %w[3.1 3.3 3.4].map { |minor| "lib/datadog_heap/#{minor}/datadog_heap.so" }
      expect(check_files("platform", platform)).to eq(["release check: the platform gem's files: no problem found\n", "", 0])

      # Stray files, a missing LICENSE, sources in a platform gem, an extension in a source gem.
      _, err, code = check_files("platform", platform - ["LICENSE"] +
        %w[target/release/libdatadog_heap.so lib/datadog_heap/recorder.rb~ ext/datadog_heap/src/lib.rs ffi/src/lib.rs notes.txt])
      expect(code).to eq(1)
      expect(err).to include("LICENSE: missing", "target/release/libdatadog_heap.so: a build or scratch directory",
        "lib/datadog_heap/recorder.rb~: a build artefact or an editor's leftover",
        "ext/datadog_heap/src/lib.rs: a source file in a platform gem", "ffi/src/lib.rs: a source file in a platform gem",
        "notes.txt: not a file a gem is made of")
      _, err, code = check_files("platform", platform.grep_v(/\.so\z/))
      expect([err, code]).to eq(["release check: the platform gem's files: 1 problem:\n" \
        "  lib/datadog_heap/<ruby>/datadog_heap.so: none (a platform gem carries one per Ruby)\n", 1])
      _, err, code = check_files("source", source + ["lib/datadog_heap/3.1/datadog_heap.so", "lib/datadog_heap/3.1/datadog_heap.so.built-for"])
      expect(code).to eq(1)
      expect(err).to include("lib/datadog_heap/3.1/datadog_heap.so: a prebuilt extension in the source gem",
        "datadog_heap.so.built-for: a build stamp")
    end

    it "fails a gem whose version is not the project's, and writes no checksum for it" do
      Dir.mktmpdir("release") do |dir|
        File.write(File.join(dir, "LICENSE"), "text")
        spec = Gem::Specification.new do |s|
          s.name = "datadog_heap"
          s.version = "9.9.9"
          s.summary = "wrong version"
          s.authors = ["x"]
          s.license = "Apache-2.0"
          s.homepage = "https://example.com"
          s.files = ["LICENSE"]
        end
        gem = File.join(dir, Dir.chdir(dir) { Gem::DefaultUserInteraction.use_ui(Gem::SilentUI.new) { Gem::Package.build(spec) } })
        File.write("#{gem}.sha256", "stale")
        out, err, status = Open3.capture3(RbConfig.ruby, script, gem)
        expect(status.exitstatus).to eq(1)
        expect(out).to include("datadog_heap-9.9.9.gem (source, ruby,", "  LICENSE")
        expect(err).to include(%(datadog_heap-9.9.9.gem: "9.9.9", not "#{DatadogHeap::VERSION}"), "NOTICE: missing",
          "THIRD_PARTY_NOTICES: missing", "ext/datadog_heap/extconf.rb: missing")
        expect(File).not_to exist("#{gem}.sha256")
      end
    end

    it "finds the versions of the gem, the crates and CHANGELOG in agreement" do
      out, status = Open3.capture2e(RbConfig.ruby, "-e", 'load ARGV[0]; p ReleaseCheck.version_problems([], release: false), ReleaseCheck.versions.map(&:last).uniq',
        script)
      expect(status).to be_success, out
      expect(out.lines.map(&:chomp)).to eq(["[]", [DatadogHeap::VERSION].inspect])
    end
  end

  it "names the Rubies a precompiled gem has extensions for when it has none for this one" do
    Dir.mktmpdir("packaging") do |dir|
      # The Ruby code only: the extensions are replaced by two for Rubies that are not this one.
      Dir.chdir(root) { Dir["lib/**/*.rb"] }.each do |file|
        FileUtils.mkdir_p(File.dirname(File.join(dir, file)))
        FileUtils.cp(File.join(root, file), File.join(dir, file))
      end
      %w[2.9 9.8].each do |minor|
        FileUtils.mkdir_p(File.join(dir, "lib", "datadog_heap", minor))
        File.write(File.join(dir, "lib", "datadog_heap", minor, "datadog_heap.so"), "")
      end
      out, status = Open3.capture2e({"GC_STRESS" => nil}, RbConfig.ruby, "-I", File.join(dir, "lib"), "-e",
        'begin; require "datadog_heap"; rescue LoadError => e; puts e.message; exit 3; end')
      expect(status.exitstatus).to eq(3), out
      expect(out).to include("datadog_heap has no extension for Ruby #{RUBY_VERSION} here (it has one for Ruby 2.9, 9.8)")
      expect(out).to include("gem install datadog_heap --platform ruby")
    end
  end
end
