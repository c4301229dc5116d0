# frozen_string_literal: true

require_relative "spec_helper"
require "fileutils"
require "open3"
require "rbconfig"
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
