# frozen_string_literal: true

# Stand-in for the `libdatadog` gem (which ships prebuilt binaries and is not on Debian): it points
# dd-trace-rb's extconf and runtime at a libdatadog built from source by bin/ddtrace-check.
# bin/ddtrace-check installs it as gem libdatadog-<version> in a private GEM_PATH, writing the
# build's prefix into prefix.txt beside this file; LIBDATADOG_OUT overrides it.
module Libdatadog
  VERSION = File.read(File.join(__dir__, "version.txt")).strip

  def self.prefix
    ENV["LIBDATADOG_OUT"] || File.read(File.join(__dir__, "prefix.txt")).strip
  end

  # dd-trace-rb takes lib/ and include/ as ../../lib and ../../include from this folder.
  def self.pkgconfig_folder(*) = File.join(prefix, "lib", "pkgconfig")

  def self.current_platform = "x86_64-linux"

  def self.available_binaries = [current_platform]

  def self.ld_library_path = File.join(prefix, "lib")

  # The crash-tracking receiver binary is not built (only the profiling library is).
  def self.path_to_crashtracking_receiver_binary = nil
end
