# frozen_string_literal: true

# Writes the Makefile that `gem install` (and `ruby extconf.rb && make install`) uses to build the
# binding crate into datadog_heap/datadog_heap.so.
#
# With the rb_sys gem installed, its create_rust_makefile does the work. Without it (RubyGems.org
# is not always reachable, and Debian 12 does not package rb_sys), a small cargo-driven Makefile
# is written instead: `make` runs `cargo build --release` for this crate and `make install` copies
# the cdylib to $(sitearchdir)/datadog_heap/datadog_heap.so, which is where RubyGems points
# sitearchdir while it installs a gem.
#
# Environment:
#   CARGO                     cargo to run (default: cargo on PATH)
#   CARGO_TARGET_DIR          where cargo builds; kept after install when given
#   DATADOG_HEAP_KEEP_TARGET  1 keeps the private build directory after `make install`
#   DATADOG_HEAP_NO_RB_SYS    1 writes the cargo-driven Makefile even when rb_sys is installed
#   DATADOG_HEAP_SKIP_CHECKS  1 skips the checks of what the build needs (Ruby headers, cargo,
#                             libclang) that otherwise stop it with a list of what is missing

require "mkmf"
require "rbconfig"
require "shellwords"

EXT_NAME = "datadog_heap"

def rb_sys_available?
  return false if ENV["DATADOG_HEAP_NO_RB_SYS"] == "1"

  require "rb_sys/mkmf"
  true
rescue LoadError
  false
end

# What the build needs, checked before anything runs, so a Ruby with no prebuilt extension (3.2,
# 4.0, or any other platform) either compiles with a line saying what happens, or stops with one
# saying what is missing (docs/compatibility.md).
def check_build_requirements
  problems = []
  version = Gem::Version.new(RUBY_VERSION)
  problems << "Ruby #{RUBY_VERSION} is older than 3.1, the oldest this gem supports" if version < Gem::Version.new("3.1")
  problems << "#{RUBY_ENGINE} is not CRuby: the recorder uses CRuby's C API" unless RUBY_ENGINE == "ruby"
  ruby_h = File.join(RbConfig::CONFIG["rubyhdrdir"].to_s, "ruby.h")
  problems << "Ruby's C headers are missing (#{ruby_h}; Debian: ruby-dev)" unless File.exist?(ruby_h)
  cargo = ENV.fetch("CARGO", "cargo")
  cargo_version = begin
    IO.popen([cargo, "--version"], err: File::NULL, &:read)[/\d+\.\d+\.\d+/]
  rescue SystemCallError
    nil
  end
  if cargo_version.nil?
    problems << "`#{cargo}` was not found: building needs Rust (cargo >= 1.85; https://rustup.rs or your package manager)"
  elsif Gem::Version.new(cargo_version) < Gem::Version.new("1.85")
    problems << "cargo #{cargo_version} is older than 1.85, the oldest that builds this gem (rustup update)"
  end
  # bindgen (through rb-sys) loads libclang to read Ruby's headers.
  libclang = ENV["LIBCLANG_PATH"].to_s.empty? ? nil : Dir[File.join(ENV["LIBCLANG_PATH"], "libclang*.so*")].first
  libclang ||= (IO.popen(%w[ldconfig -p], err: File::NULL, &:read) rescue "")[/libclang[-.\w]*\.so\S*/]
  libclang ||= Dir["/usr/lib/llvm-*/lib/libclang*.so*", "/usr/lib64/libclang*.so*", "/usr/lib/*/libclang*.so*"].first
  problems << "libclang was not found (Debian/Ubuntu: libclang-dev; RHEL: clang-devel; or set LIBCLANG_PATH)" unless libclang
  unless problems.empty?
    abort(["datadog_heap: cannot build the extension for Ruby #{RUBY_VERSION} (#{RUBY_PLATFORM}):", *problems.map { |p| "  - #{p}" }].join("\n"))
  end
  tested = %w[3.1 3.3 3.4].include?(RUBY_VERSION[/\A\d+\.\d+/])
  message "datadog_heap: compiling the extension for Ruby #{RUBY_VERSION} (#{RUBY_PLATFORM}) with cargo " \
    "#{cargo_version}; this takes a few minutes#{tested ? "" : ". This Ruby is not tested by the gem's CI (see docs/compatibility.md)"}\n"
end
check_build_requirements unless ENV["DATADOG_HEAP_SKIP_CHECKS"] == "1"

if rb_sys_available?
  create_rust_makefile("#{EXT_NAME}/#{EXT_NAME}") do |r|
    r.profile = ENV.fetch("RB_SYS_CARGO_PROFILE", :release).to_sym
  end
  exit
end

cargo = ENV.fetch("CARGO", "cargo")

src_dir = File.expand_path(__dir__)
user_target_dir = ENV["CARGO_TARGET_DIR"].to_s
target_dir = user_target_dir.empty? ? File.join(Dir.pwd, "target") : File.expand_path(user_target_dir)
clean_after_install = user_target_dir.empty? && ENV["DATADOG_HEAP_KEEP_TARGET"] != "1"
dlext = RbConfig::CONFIG.fetch("DLEXT")
soext = RbConfig::CONFIG.fetch("SOEXT", "so")

# Makefile variables hold shell-quoted words; they are expanded inside recipes only.
q = ->(s) { Shellwords.escape(s.to_s) }
cargo_env = "RUBY=#{q[RbConfig.ruby]}"

File.write("Makefile", <<~MAKE)
  # Written by #{File.basename(__FILE__)} (cargo-driven fallback: the rb_sys gem is not installed).
  SHELL = /bin/sh
  CARGO = #{q[cargo]}
  MANIFEST = #{q[File.join(src_dir, "Cargo.toml")]}
  TARGET_DIR = #{q[target_dir]}
  RUSTLIB = $(TARGET_DIR)/release/lib#{EXT_NAME}.#{soext}
  DLLIB = #{EXT_NAME}.#{dlext}
  sitearchdir = #{q[RbConfig::CONFIG.fetch("sitearchdir")]}
  RUBYARCHDIR = $(sitearchdir)/#{EXT_NAME}
  CLEAN_AFTER_INSTALL = #{clean_after_install ? 1 : 0}

  .PHONY: all install clean distclean realclean FORCE

  all: $(DLLIB)

  # cargo decides what to rebuild, so it always runs; `+` lends it make's jobserver.
  $(DLLIB): FORCE
  \t+#{cargo_env} $(CARGO) build --release --lib --manifest-path $(MANIFEST) --target-dir $(TARGET_DIR)
  \tcp $(RUSTLIB) $(DLLIB)

  install: all
  \tmkdir -p $(DESTDIR)$(RUBYARCHDIR)
  \tcp $(DLLIB) $(DESTDIR)$(RUBYARCHDIR)/$(DLLIB)
  \tif [ "$(CLEAN_AFTER_INSTALL)" = 1 ]; then rm -rf $(TARGET_DIR); fi

  clean:
  \trm -f $(DLLIB)

  distclean realclean: clean
  \tif [ "$(CLEAN_AFTER_INSTALL)" = 1 ]; then rm -rf $(TARGET_DIR); fi
  \trm -f Makefile

  FORCE:
MAKE
