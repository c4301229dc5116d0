# frozen_string_literal: true

# Builds the smoke driver from this repository alone: our static library (cargo, dev profile), the
# shim (ffi/c/heap_recorder_shim.c), the driver (ddheap_smoke.c) and the stand-ins for the parts
# of Datadog's and libdatadog's headers they use (standins/). Nothing of another project is
# compiled or read. `ruby ffi/smoke/build.rb OUT_DIR` writes OUT_DIR/object_id/ddheap_smoke.so
# (datadog 2.41's header) and OUT_DIR/record_id/ddheap_smoke.so (dd-trace-rb master's), then
# `ruby -I OUT_DIR/object_id ffi/smoke/smoke.rb` runs the checks. Needs cargo and a C compiler.
require "fileutils"
require "rbconfig"

module DdheapSmokeBuild
  HERE = __dir__
  ROOT = File.expand_path("../..", HERE)
  # Each generation of heap_recorder.h, and the compiler flags that choose it.
  FLAVORS = {"object_id" => [], "record_id" => ["-DDDHEAP_DDTRACE_WEAKMAP=1"]}.freeze

  module_function

  def run(*command)
    system(*command) || abort("ffi/smoke/build.rb: failed: #{command.join(" ")}")
  end

  def static_library
    run("cargo", "build", "--quiet", "-p", "datadog_heap_cabi", chdir: ROOT)
    target = ENV.fetch("CARGO_TARGET_DIR", "").empty? ? File.join(ROOT, "target") : File.expand_path(ENV["CARGO_TARGET_DIR"], ROOT)
    File.join(target, "debug", "libdatadog_heap_cabi.a")
  end

  # Builds every flavor into `out`; returns {flavor => directory holding ddheap_smoke.so}.
  def build(out)
    library = static_library
    cc = ENV.fetch("CC", RbConfig::CONFIG["CC"] || "cc")
    FLAVORS.to_h do |flavor, flags|
      dir = File.join(out, flavor)
      FileUtils.mkdir_p(dir)
      run(cc, "-std=gnu99", "-shared", "-fPIC", "-O1", "-Wall", "-Wno-unused-function",
        "-Werror=implicit-function-declaration", "-DUSE_DEFERRED_HEAP_ALLOCATION_RECORDING=1", *flags,
        "-I", File.join(HERE, "standins"), "-I", File.join(ROOT, "ffi", "include"),
        "-I", RbConfig::CONFIG["rubyarchhdrdir"], "-I", RbConfig::CONFIG["rubyhdrdir"],
        File.join(HERE, "ddheap_smoke.c"), File.join(ROOT, "ffi", "c", "heap_recorder_shim.c"),
        File.join(HERE, "standins", "helpers.c"),
        "-Wl,--exclude-libs,ALL", library, "-lpthread", "-ldl", "-lm",
        "-o", File.join(dir, "ddheap_smoke.so"))
      [flavor, dir]
    end
  end
end

if $PROGRAM_NAME == __FILE__
  abort "usage: ruby ffi/smoke/build.rb OUT_DIR" unless ARGV.size == 1
  DdheapSmokeBuild.build(File.expand_path(ARGV[0])).each_value { |dir| puts dir }
end
