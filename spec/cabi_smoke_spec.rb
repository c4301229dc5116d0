# frozen_string_literal: true

require "open3"
require "rbconfig"
require "tmpdir"
require_relative "../ffi/smoke/build"

# The C ABI for Datadog's profiler (ffi/) in a live VM: ffi/smoke/build.rb compiles the shim and the
# smoke driver over our static library, from this repository alone (stand-ins for the parts of
# Datadog's headers they use), for both generations of heap_recorder.h, and ffi/smoke/smoke.rb runs
# its checks through the header's functions: pending recordings marked across a GC, commits, ids,
# iteration without the GVL, dead objects and their strings released, errors raised as
# heap_recorder.c raises them.
RSpec.describe "the C ABI's smoke driver" do
  def tool?(*command)
    _, status = Open3.capture2e(*command)
    status.success?
  rescue SystemCallError
    false
  end

  before do
    skip "needs cargo" unless tool?("cargo", "--version")
    skip "needs a C compiler" unless tool?(ENV.fetch("CC", RbConfig::CONFIG["CC"] || "cc"), "--version")
  end

  it "passes every check with datadog 2.41's header (object ids) and with master's (record ids)" do
    Dir.mktmpdir("ddheap-smoke") do |out|
      built = DdheapSmokeBuild.build(out)
      expect(built.keys).to eq(%w[object_id record_id])
      built.each do |flavor, dir|
        output, status = Open3.capture2e(RbConfig.ruby, "-I", dir, File.expand_path("../ffi/smoke/smoke.rb", __dir__))
        expect(status).to be_success, "#{flavor}:\n#{output}"
        expect(output.lines.grep(/\AFAIL/)).to eq([]), "#{flavor}:\n#{output}"
        expect(output.lines.grep(/\Aok /).size).to eq(16), "#{flavor}:\n#{output}"
        expect(output).to end_with("smoke: all checks passed\n")
      end
    end
  end
end
