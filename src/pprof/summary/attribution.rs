//! Where a stack allocated: the site, the method, the C method called there, the caller in the
//! application, as the summaries print and group them.

use std::sync::Arc;

use super::super::read::SourceFrame;
use super::library::{is_app_frame, library_of, AppRoot, APP};
use super::{GroupBy, Place};

/// Where a stack allocated, as the summaries print it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct Attribution {
    pub location: String,
    pub function: String,
    pub callee: Option<String>,
    pub called_from: Option<String>,
    pub file: String,
    pub library: String,
}

impl Attribution {
    pub fn of(frames: &[SourceFrame], app_root: &AppRoot) -> Attribution {
        let Some(first) = frames.first() else {
            return Attribution {
                location: "(no frames)".into(),
                function: String::new(),
                callee: None,
                called_from: None,
                file: "(no frames)".into(),
                library: "(unknown)".into(),
            };
        };
        // Ruby's own `<internal:...>` methods (Kernel#require under rubygems, Integer#times on
        // 3.3...) are not where the reader should look: the line that called them is.
        let real = frames
            .iter()
            .position(|f| !f.filename.is_empty() && !f.filename.starts_with('<'))
            .unwrap_or(0);
        let ruby = ruby_frame(frames, real);
        let site = &frames[ruby];
        let callee = (ruby > 0 && first.name != site.name).then(|| first.name.clone());
        let library = library_of(&site.filename, app_root);
        let called_from = if library == APP {
            None
        } else {
            (ruby + 1..frames.len())
                .find(|&i| is_app_frame(&frames[i].filename, app_root))
                .map(|i| {
                    let caller = &frames[ruby_frame(frames, i)];
                    format!("{} in {}", location_of(&frames[i]), caller.name)
                })
        };
        Attribution {
            location: location_of(site),
            function: site.name.clone(),
            callee,
            called_from,
            file: if site.filename.is_empty() {
                site.name.clone()
            } else {
                site.filename.clone()
            },
            library,
        }
    }

    /// The place of a row whose heaviest stack is `frames` (attributed to `self`).
    pub fn place(&self, frames: Arc<[SourceFrame]>, class: Option<String>, label: String) -> Place {
        Place {
            frames,
            class,
            label,
            location: self.location.clone(),
            function: self.function.clone(),
            callee: self.callee.clone(),
            called_from: self.called_from.clone(),
            library: self.library.clone(),
        }
    }

    pub fn label(&self, group: GroupBy, class: Option<&str>) -> String {
        let in_function = || {
            // A C extension's init frame is named by its file.
            if self.function.is_empty() || self.function == self.file {
                self.location.clone()
            } else {
                format!("{} in {}", self.location, self.function)
            }
        };
        match group {
            GroupBy::Site => match &self.callee {
                Some(callee) => format!("{} via {callee}", in_function()),
                None => in_function(),
            },
            GroupBy::Location => in_function(),
            GroupBy::File => self.file.clone(),
            GroupBy::Gem => self.library.clone(),
            GroupBy::Class => class.unwrap_or("?").to_owned(),
        }
    }

    /// What tells two groups apart, besides the class.
    pub fn group_key(&self, group: GroupBy) -> String {
        match group {
            GroupBy::Site => format!(
                "{}\0{}\0{}\0{}",
                self.location,
                self.function,
                self.callee.as_deref().unwrap_or(""),
                self.called_from.as_deref().unwrap_or("")
            ),
            GroupBy::Location => self.location.clone(),
            GroupBy::File => self.file.clone(),
            GroupBy::Gem => self.library.clone(),
            GroupBy::Class => String::new(),
        }
    }
}

/// The frame whose method holds `frames[i]`'s line: `i` itself, or, when `frames[i]` is a C
/// frame (it has the `file:line` of the frame outside it), the Ruby frame it was called from.
fn ruby_frame(frames: &[SourceFrame], i: usize) -> usize {
    let Some(f) = frames.get(i) else {
        return i;
    };
    let mut j = i;
    if f.filename.is_empty() || f.line <= 0 {
        return j;
    }
    while frames
        .get(j + 1)
        .is_some_and(|next| next.line == f.line && next.filename == f.filename)
    {
        j += 1;
    }
    j
}

/// `file:line` of a frame; the file alone without a line, the name without a file.
fn location_of(f: &SourceFrame) -> String {
    let file = if f.filename.is_empty() {
        &f.name
    } else {
        &f.filename
    };
    if f.line > 0 {
        format!("{file}:{}", f.line)
    } else {
        file.clone()
    }
}
