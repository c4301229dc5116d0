//! Which library a file belongs to, and what the application's own code is.

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

/// Whether a frame's file is the application's own code (see [`AppRoot`]); empty names and
/// pseudo-files (`<internal:kernel>`, `(eval)`...) are not.
pub fn is_app_frame(filename: &str, app_root: &AppRoot) -> bool {
    library_of(filename, app_root) == APP
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
    if filename.is_empty() {
        return "(unknown)".into();
    }
    if filename.starts_with("<internal:") {
        return "ruby (internal)".into();
    }
    if filename.starts_with("(eval") {
        return "(eval)".into();
    }
    if filename.starts_with('<') || filename.starts_with('(') {
        return "(unknown)".into();
    }
    if let Some(inside) = app_root.relative(filename) {
        return gem_of(&format!("/{inside}")).unwrap_or_else(|| APP.into());
    }
    if let Some(gem) = gem_of(filename) {
        return gem;
    }
    // `.../lib/ruby/...`, or Debian's `/usr/lib/<arch>/ruby/3.1.0/` for C extensions.
    let ruby_lib = filename
        .rsplit_once("/lib/ruby/")
        .map(|(_, rest)| rest)
        .or_else(|| {
            let (_, rest) = filename.rsplit_once("/ruby/")?;
            rest.split('/')
                .next()
                .filter(|v| is_version(v))
                .map(|_| rest)
        });
    if let Some(rest) = ruby_lib {
        let mut parts = rest.split('/');
        let (kind, mut name) = match parts.next() {
            Some(dir @ ("site_ruby" | "vendor_ruby")) => (dir, parts.next()),
            first => ("stdlib", first),
        };
        // Skip the version directory, then an architecture one (x86_64-linux-gnu).
        if name.is_some_and(is_version) {
            name = parts.next();
        }
        let mut rest: Vec<&str> = parts.collect();
        while name.is_some_and(|n| n.contains('-') && !rest.is_empty()) {
            name = Some(rest.remove(0));
        }
        if let Some(name) = name.filter(|n| !n.is_empty()) {
            let name = name
                .strip_suffix(".rb")
                .or_else(|| name.strip_suffix(".so"))
                .unwrap_or(name);
            return format!("{name} ({kind})");
        }
    }
    "(other)".into()
}

fn is_version(segment: &str) -> bool {
    segment.starts_with(|c: char| c.is_ascii_digit())
        && segment.chars().all(|c| c.is_ascii_digit() || c == '.')
}

/// The gem a path is in: the directory after the last `/gems/`, less its `-VERSION` (from the
/// first `-` followed by a digit, so platform suffixes go too; else from the last `-`, for
/// bundler's git checkouts).
fn gem_of(path: &str) -> Option<String> {
    let (_, rest) = path.rsplit_once("/gems/")?;
    let (dir, _) = rest.split_once('/')?;
    let bytes = dir.as_bytes();
    let cut = (1..bytes.len())
        .find(|&i| bytes[i - 1] == b'-' && bytes[i].is_ascii_digit())
        .map(|i| i - 1)
        .or_else(|| dir.rfind('-').filter(|&i| i > 0));
    let name = cut.map_or(dir, |i| &dir[..i]);
    (!name.is_empty()).then(|| name.to_owned())
}
