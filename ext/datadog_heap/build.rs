//! Exposes the Ruby being built against as cfgs (`ruby_gte_3_3`, `ruby_lt_3_4`, `ruby_eq_3_1`,
//! `ruby_have_*`, ...) so version-dependent VM calls can be chosen at compile time. The values
//! come from rb-sys's build script (`links = "rb"`), which asks the `ruby` found through `RUBY`
//! or `PATH`.
//!
//! On top of the version, what the Ruby headers themselves declare, for APIs a Ruby removes
//! (docs/compatibility.md):
//!
//! - `dh_postponed_job_preregister`: `rb_postponed_job_preregister` and `_trigger` (Ruby 3.3+).
//! - `dh_postponed_job_register_one`: `rb_postponed_job_register_one` (deprecated in 3.3,
//!   removed in 4.1 by Feature #21768).
//!
//! The extension calls the old function only where the new ones are missing, so a Ruby without
//! it never sees a reference to it. A Ruby whose headers declare neither fails the build here,
//! with a message saying so, rather than in rustc.

use std::error::Error;
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn Error>> {
    let _ = rb_sys_env::activate()?;
    println!("cargo:rustc-check-cfg=cfg(dh_postponed_job_preregister)");
    println!("cargo:rustc-check-cfg=cfg(dh_postponed_job_register_one)");

    // rb-sys passes RbConfig on as `cargo:rbconfig_KEY=VALUE` (links = "rb").
    let hdrdir = std::env::var("DEP_RB_RBCONFIG_RUBYHDRDIR")
        .map_err(|_| "rb-sys did not say where the Ruby headers are (rbconfig_rubyhdrdir)")?;
    let debug_h = PathBuf::from(&hdrdir).join("ruby").join("debug.h");
    println!("cargo:rerun-if-changed={}", debug_h.display());
    let header = std::fs::read_to_string(&debug_h)
        .map_err(|e| format!("cannot read {}: {e}", debug_h.display()))?;
    let header = without_comments(&header);
    let preregister = declares(&header, "rb_postponed_job_preregister")
        && declares(&header, "rb_postponed_job_trigger");
    let register_one = declares(&header, "rb_postponed_job_register_one");
    if preregister {
        println!("cargo:rustc-cfg=dh_postponed_job_preregister");
    }
    if register_one {
        println!("cargo:rustc-cfg=dh_postponed_job_register_one");
    }
    let version = ruby_version();
    if !preregister && !register_one {
        return Err(format!(
            "datadog_heap: {} (Ruby {version}) declares neither rb_postponed_job_preregister nor \
             rb_postponed_job_register_one: this Ruby has no postponed-job API the extension \
             knows; see docs/compatibility.md",
            debug_h.display()
        )
        .into());
    }
    // The window timer's and the jobs' thread rules follow the version (runtime/windows.rs):
    // 3.3 brought `rb_postponed_job_trigger`, safe from any thread. A header that disagrees is a
    // Ruby we do not know.
    let gte_3_3 = std::env::var("DEP_RB_VERSION_GTE_3_3").as_deref() == Ok("true");
    if gte_3_3 != preregister {
        return Err(format!(
            "datadog_heap: Ruby {version} {} rb_postponed_job_preregister, which every Ruby \
             from 3.3 on has and none before; see docs/compatibility.md",
            if preregister {
                "declares"
            } else {
                "does not declare"
            }
        )
        .into());
    }
    Ok(())
}

/// Whether `header` declares the function `name` (a prototype: the name followed by `(`).
fn declares(header: &str, name: &str) -> bool {
    header.match_indices(name).any(|(at, _)| {
        let before = header[..at].chars().next_back();
        let after = header[at + name.len()..].trim_start().starts_with('(');
        after && !before.is_some_and(|c| c.is_alphanumeric() || c == '_')
    })
}

/// `source` with its `/* */` and `//` comments blanked (the docs name functions too).
fn without_comments(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix("/*") {
            rest = after.find("*/").map_or("", |end| &after[end + 2..]);
            out.push(' ');
        } else if let Some(after) = rest.strip_prefix("//") {
            rest = after.find('\n').map_or("", |end| &after[end..]);
        } else {
            let c = rest.chars().next().unwrap_or(' ');
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    out
}

fn ruby_version() -> String {
    ["MAJOR", "MINOR", "TEENY"]
        .map(|k| std::env::var(format!("DEP_RB_RBCONFIG_{k}")).unwrap_or_else(|_| "?".into()))
        .join(".")
}
