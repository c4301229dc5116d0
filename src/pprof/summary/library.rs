//! Which library a file belongs to, what the application's own code is, and how a report shows
//! a file's path.

use std::borrow::Cow;

/// The directories holding the application's own code. A file is app code when it is under one
/// of them and not in an installed gem there (`vendor/bundle/.../gems/NAME-VERSION/`), or when
/// its path is relative (Ruby keeps the main script's path as given, relative to where the
/// program started). With no directory, only relative paths are app code.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AppRoot {
    /// Each ends in '/'.
    dirs: Vec<String>,
}

impl AppRoot {
    /// `dirs` are absolute directories; empty ones are ignored, a trailing '/' is optional.
    pub fn new<S: AsRef<str>>(dirs: impl IntoIterator<Item = S>) -> Self {
        let mut out: Vec<String> = Vec::new();
        for dir in dirs {
            let dir = dir.as_ref();
            if dir.is_empty() {
                continue;
            }
            // "/" itself stays "/": every absolute path is under it.
            let dir = format!("{}/", dir.trim_end_matches('/'));
            if !out.contains(&dir) {
                out.push(dir);
            }
        }
        AppRoot { dirs: out }
    }

    /// The part of `filename` under the app root, if it is under one.
    fn relative<'a>(&self, filename: &'a str) -> Option<&'a str> {
        if !filename.starts_with('/') {
            return Some(filename);
        }
        self.dirs
            .iter()
            .find_map(|d| filename.strip_prefix(d.as_str()))
    }
}

/// Where a file is, as the summaries see it: what [`library_of`] names and [`short_path`] shows.
/// Every `&str` is a slice of the file name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place<'a> {
    /// Application code: the path under its app root (the path as given when it is relative).
    App(&'a str),
    /// An installed gem: its directory (`NAME-VERSION`), the gem's name, the path inside it.
    Gem {
        dir: &'a str,
        name: &'a str,
        inside: &'a str,
    },
    /// Ruby's own library: `stdlib`, `site_ruby` or `vendor_ruby`, the library's name (its
    /// first directory or file, less `.rb`/`.so`), the path below the version directory (and
    /// an architecture one).
    RubyLib {
        kind: &'a str,
        name: &'a str,
        inside: &'a str,
    },
    /// `<internal:...>`.
    Internal,
    /// `(eval)`, `(eval at ...)`.
    Eval,
    /// No file, or another pseudo-file (`<main>`, `(irb)`).
    Unknown,
    Other,
}

/// Classifies `filename`; the order of the checks is the contract [`library_of`] states.
fn place<'a>(filename: &'a str, app_root: &AppRoot) -> Place<'a> {
    if filename.is_empty() {
        return Place::Unknown;
    }
    if filename.starts_with("<internal:") {
        return Place::Internal;
    }
    if filename.starts_with("(eval") {
        return Place::Eval;
    }
    if filename.starts_with('<') || filename.starts_with('(') {
        return Place::Unknown;
    }
    if let Some(inside) = app_root.relative(filename) {
        return gem_dir(inside).unwrap_or(Place::App(inside));
    }
    if let Some(gem) = gem_dir(filename) {
        return gem;
    }
    ruby_lib(filename).unwrap_or(Place::Other)
}

/// Whether a frame's file is the application's own code (see [`AppRoot`]); empty names and
/// pseudo-files (`<internal:kernel>`, `(eval)`...) are not. Does not allocate.
pub fn is_app_frame(filename: &str, app_root: &AppRoot) -> bool {
    matches!(place(filename, app_root), Place::App(_))
}

pub(super) const APP: &str = "app";

/// The library a file belongs to, for grouping by gem:
/// - `app` for application code (see [`AppRoot`]);
/// - the gem's name for a file in an installed gem (`.../gems/NAME-VERSION/...`, bundler's
///   `.../bundler/gems/NAME-REVISION/...`), wherever it is, the app root included;
/// - `NAME (stdlib)` for a file of Ruby's own library (`.../lib/ruby/3.1.0/NAME/...` or
///   `NAME.rb`, `.../ruby/3.1.0/NAME.so`), `NAME (site_ruby)` and `NAME (vendor_ruby)` likewise (Debian puts packaged
///   libraries in vendor_ruby);
/// - `ruby (internal)` for `<internal:...>` files, `(eval)` for evaluated code, `(unknown)` for
///   a frame without a file, and `(other)` for any other file.
pub fn library_of(filename: &str, app_root: &AppRoot) -> String {
    match place(filename, app_root) {
        Place::App(_) => APP.into(),
        Place::Gem { name, .. } => name.into(),
        Place::RubyLib { kind, name, .. } => format!("{name} ({kind})"),
        Place::Internal => "ruby (internal)".into(),
        Place::Eval => "(eval)".into(),
        Place::Unknown => "(unknown)".into(),
        Place::Other => "(other)".into(),
    }
}

/// `filename` as a report shows it, the way memory_profiler and stackprof shorten paths, from
/// the same classification as [`library_of`]:
/// - application code: the path under the app root (`app/models/user.rb`);
/// - a gem's file: `NAME-VERSION PATH`, PATH inside the gem's directory less a leading `lib/`
///   (`rack-3.0.8 rack/utils.rb`);
/// - Ruby's own library: `stdlib PATH`, `site_ruby PATH` or `vendor_ruby PATH`, PATH below the
///   version (and architecture) directory (`stdlib json/common.rb`);
/// - anything else (pseudo-files, other files) unchanged.
///
/// Two files may share a short form (one gem installed twice); it is for people, not a key.
pub fn short_path<'a>(filename: &'a str, app_root: &AppRoot) -> Cow<'a, str> {
    match place(filename, app_root) {
        Place::App(inside) if !inside.is_empty() => Cow::Borrowed(inside),
        Place::Gem { dir, inside, .. } => {
            let inside = inside.strip_prefix("lib/").unwrap_or(inside);
            Cow::Owned(format!("{dir} {inside}"))
        }
        Place::RubyLib { kind, inside, .. } => Cow::Owned(format!("{kind} {inside}")),
        _ => Cow::Borrowed(filename),
    }
}

fn is_version(segment: &str) -> bool {
    segment.starts_with(|c: char| c.is_ascii_digit())
        && segment.chars().all(|c| c.is_ascii_digit() || c == '.')
}

/// The gem a path is in: the directory after the last `/gems/` (or a leading `gems/` in a path
/// relative to the app root), its name less its `-VERSION` (from the first `-` followed by a
/// digit, so platform suffixes go too; else from the last `-`, for bundler's git checkouts).
fn gem_dir(path: &str) -> Option<Place<'_>> {
    let rest = match path.rsplit_once("/gems/") {
        Some((_, rest)) => rest,
        None => path.strip_prefix("gems/")?,
    };
    let (dir, inside) = rest.split_once('/')?;
    let bytes = dir.as_bytes();
    let cut = (1..bytes.len())
        .find(|&i| bytes[i - 1] == b'-' && bytes[i].is_ascii_digit())
        .map(|i| i - 1)
        .or_else(|| dir.rfind('-').filter(|&i| i > 0));
    let name = cut.map_or(dir, |i| &dir[..i]);
    (!name.is_empty()).then_some(Place::Gem { dir, name, inside })
}

/// A file of Ruby's own library: under `.../lib/ruby/`, or Debian's `/usr/lib/<arch>/ruby/3.1.0/`
/// for C extensions. `RbConfig::CONFIG["rubylibdir"]` and `"archdir"` are such directories in
/// every layout Ruby installs itself in (spec/short_paths_spec.rb checks this Ruby's).
fn ruby_lib(filename: &str) -> Option<Place<'_>> {
    let rest = match filename.rsplit_once("/lib/ruby/") {
        Some((_, rest)) => rest,
        None => {
            let (_, rest) = filename.rsplit_once("/ruby/")?;
            rest.split('/').next().filter(|v| is_version(v))?;
            rest
        }
    };
    // `inside` starts at the library's name; None once no segment is left.
    let (first, after) = split_first(rest);
    let (kind, mut inside) = match first {
        "site_ruby" | "vendor_ruby" => (first, after),
        _ => ("stdlib", Some(rest)),
    };
    // Skip the version directory, then an architecture one (x86_64-linux-gnu).
    if let Some(at) = inside {
        let (segment, after) = split_first(at);
        if is_version(segment) {
            inside = after;
        }
    }
    while let Some(at) = inside {
        match split_first(at) {
            (segment, Some(after)) if segment.contains('-') => inside = Some(after),
            _ => break,
        }
    }
    let inside = inside?;
    let (name, _) = split_first(inside);
    if name.is_empty() {
        return None;
    }
    let name = name
        .strip_suffix(".rb")
        .or_else(|| name.strip_suffix(".so"))
        .unwrap_or(name);
    Some(Place::RubyLib { kind, name, inside })
}

/// The first `/`-separated segment of `path`, and what follows its `/` (None without one).
fn split_first(path: &str) -> (&str, Option<&str>) {
    match path.split_once('/') {
        Some((first, rest)) => (first, Some(rest)),
        None => (path, None),
    }
}
