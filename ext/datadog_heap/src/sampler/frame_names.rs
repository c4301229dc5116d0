//! Frame names as Ruby 3.4 backtraces and stackprof show them, on every Ruby we support,
//! composed inside the NEWOBJ hook from strings the VM already holds: the frame's label or
//! method name, its method entry's owner's cached name, and the singleton class's object.
//!
//! | frame                                   | name                         |
//! | --------------------------------------- | ---------------------------- |
//! | method `bar` of class `Foo`             | `Foo#bar`                    |
//! | singleton method `Foo.build`            | `Foo.build`                  |
//! | method of a module `M`                  | `M#m`                        |
//! | C method (`Integer#times`, `Class#new`) | `Integer#times`, `Class#new` |
//! | method of an anonymous class            | `#<Class:0x00007f...>#m`     |
//! | singleton method of a plain object      | `#<Foo:0x00007f...>.m`       |
//! | block, class body, script, eval         | its label: `block (2 levels) in <main>`, `<class:Foo>`, `<top (required)>` |
//!
//! `rb_profile_frames` hands out the method entry, not the block's iseq, for a block running
//! inside a method (on 3.1, 3.3 and 3.4 alike), so such a block is named as its method
//! (`Foo#bar`), as stackprof names it.
//!
//! Runs inside the NEWOBJ hook: no Ruby allocation, no raise, no Ruby call; appends to a Rust
//! String (system allocator).

use std::fmt::Write;

use rb_sys::VALUE;

use crate::shims;

/// Names the frames of one capture. Remembers the last owner's prefix (`Foo#`, `Foo.`), since
/// neighbouring frames often share their class (recursion, a class's methods calling each
/// other), which spares looking its name up again.
#[derive(Default)]
pub struct FrameNamer {
    last_owner: VALUE,
    prefix: String,
}

impl FrameNamer {
    /// Appends the name of `frame` (a handle from `rb_profile_frames`) to `out`. `c_frame`: the
    /// frame has no path (a method defined in C).
    pub fn write(&mut self, out: &mut String, frame: VALUE, c_frame: bool) {
        let name = if c_frame {
            shims::frame_method_name(frame)
        } else {
            shims::frame_label(frame)
        };
        let name = shims::hook_string(name);
        if let Some(owner) = shims::method_entry_owner(frame) {
            if owner != self.last_owner || self.prefix.is_empty() {
                self.prefix.clear();
                write_prefix(&mut self.prefix, owner);
                self.last_owner = owner;
            }
            out.push_str(&self.prefix);
        }
        out.push_str(name);
    }
}

/// `Owner#`, or `Object.` for a method of a singleton class.
fn write_prefix(out: &mut String, owner: VALUE) {
    match shims::singleton_attached(owner) {
        Some(attached) if shims::is_module_like(attached) => {
            write_module(out, attached);
            out.push('.');
        }
        Some(object) => {
            let _ = write!(out, "#<{}:{:#018x}>.", shims::class_name_of(object), object);
        }
        None => {
            write_module(out, owner);
            out.push('#');
        }
    }
}

/// A class's or module's name, or `#<Class:0x...>` / `#<Module:0x...>` (as `inspect` shows it)
/// for an anonymous one.
fn write_module(out: &mut String, module: VALUE) {
    let name = shims::module_name(module)
        .map(shims::hook_string)
        .unwrap_or("");
    if !name.is_empty() {
        out.push_str(name);
    } else {
        let kind = if shims::is_module(module) {
            "Module"
        } else {
            "Class"
        };
        let _ = write!(out, "#<{kind}:{module:#018x}>");
    }
}

/// The name `FrameNamer` gives `frame`, for the load-time layout check (which compares it
/// with the label Ruby builds).
pub fn frame_name(frame: VALUE) -> Option<String> {
    let mut out = String::new();
    FrameNamer::default().write(&mut out, frame, shims::frame_path(frame).is_none());
    Some(out)
}
