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

if rb_sys_available?
  create_rust_makefile("#{EXT_NAME}/#{EXT_NAME}") do |r|
    r.profile = ENV.fetch("RB_SYS_CARGO_PROFILE", :release).to_sym
  end
  exit
end

cargo = ENV.fetch("CARGO", "cargo")
unless system(cargo, "--version", out: File::NULL, err: File::NULL)
  abort <<~MSG
    datadog_heap: `#{cargo}` was not found. Building this gem needs Rust (cargo >= 1.85):
    install it with https://rustup.rs or your system's package manager, then retry.
  MSG
end

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
