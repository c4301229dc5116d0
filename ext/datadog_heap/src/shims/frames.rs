//! Frame handles from `rb_profile_frames` and what the hook may read from them without
//! allocating: paths, labels and method names (strings the VM already holds), and, for a method
//! entry, its owner class, read from the entry itself, once `verify_method_entry_layout` has
//! checked at load time that the fields sit where we expect.
//!
//! Why read a field: every public accessor that names a frame's class (`rb_profile_frame_classpath`,
//! `_qualified_method_name`, `_full_label`) builds a new String, which the NEWOBJ hook must not
//! do; the class itself is only reachable through the method entry. What we rely on:
//! `rb_profile_frames` hands out iseqs (`imemo_iseq`) and callable method entries (`imemo_ment`),
//! whose layout `{flags, defined_class, def, called_id, owner}` (method.h) has not changed from
//! Ruby 2.3 to 3.4. The imemo tag and the owner slot are checked against the allocating public
//! accessors on the real stack at load; if anything disagrees, frames are named without their
//! class instead (and `method_entry_layout_verified` says so).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use rb_sys::{ruby_value_type as T, VALUE};

use super::heap_type;

/// `imemo_type` values (internal/imemo.h, the same from 2.3 to 3.4) and where the tag sits.
const IMEMO_MENT: VALUE = 6;
const IMEMO_ISEQ: VALUE = 7;
const IMEMO_MASK: VALUE = 0x0f;
/// Word index of `owner` in `rb_callable_method_entry_t`.
const METHOD_ENTRY_OWNER_WORD: usize = 4;

/// Set once at load when the checks in `verify_method_entry_layout` passed.
static LAYOUT_VERIFIED: AtomicBool = AtomicBool::new(false);
/// `__attached__`, the hidden ivar that holds a singleton class's object before Ruby 3.2.
static ATTACHED_ID: AtomicU64 = AtomicU64::new(0);

/// Captures the current thread's stack into `frames`/`lines` (innermost first); returns the
/// depth. Needs the GVL; allocates nothing (usable in the hook).
pub fn profile_frames(frames: &mut [VALUE], lines: &mut [i32]) -> usize {
    let capacity = frames.len().min(lines.len()).min(i32::MAX as usize);
    // SAFETY: both buffers hold at least `capacity` entries; rb_profile_frames writes at most that
    // many, allocates nothing and raises nothing.
    let depth = unsafe {
        rb_sys::rb_profile_frames(0, capacity as i32, frames.as_mut_ptr(), lines.as_mut_ptr())
    };
    depth.clamp(0, capacity as i32) as usize
}

fn non_nil(value: VALUE) -> Option<VALUE> {
    (value != rb_sys::Qnil as VALUE).then_some(value)
}

/// The file of a frame from `profile_frames`, `None` for a C frame. Allocates nothing.
pub fn frame_path(frame: VALUE) -> Option<VALUE> {
    // SAFETY: `frame` came from rb_profile_frames in this hook call (an iseq or method entry);
    // the accessor returns a string the VM already holds, without allocating.
    non_nil(unsafe { rb_sys::rb_profile_frame_path(frame) })
}

/// The method name of a frame from `profile_frames` (for a C frame, the name it was defined
/// with). Allocates nothing.
pub fn frame_method_name(frame: VALUE) -> VALUE {
    // SAFETY: as in `frame_path`.
    unsafe { rb_sys::rb_profile_frame_method_name(frame) }
}

/// The label of a Ruby frame from `profile_frames`: its iseq's label ("bar", "block in
/// <main>", "<class:Foo>", "<top (required)>"); nil for a C frame. Allocates nothing.
pub fn frame_label(frame: VALUE) -> VALUE {
    // SAFETY: as in `frame_path`.
    unsafe { rb_sys::rb_profile_frame_label(frame) }
}

/// The imemo tag of a frame handle; `None` if it is not an imemo at all.
fn imemo_tag(frame: VALUE) -> Option<VALUE> {
    if heap_type(frame) != Some(T::RUBY_T_IMEMO) {
        return None;
    }
    // SAFETY: a heap object (checked above): its first word is its flags.
    let flags = unsafe { *(frame as *const VALUE) };
    Some((flags >> rb_sys::ruby_fl_ushift::RUBY_FL_USHIFT as VALUE) & IMEMO_MASK)
}

/// The raw owner slot of a method entry (not checked).
///
/// # Safety
/// `frame` must be a live `imemo_ment`, and the layout verified.
unsafe fn owner_slot(frame: VALUE) -> VALUE {
    // SAFETY: per the contract, `frame` points at a callable method entry of at least five words.
    unsafe { *(frame as *const VALUE).add(METHOD_ENTRY_OWNER_WORD) }
}

/// The class or module that defines the method of a method-entry frame (`Integer` for
/// `Integer#times`, the singleton class for `def self.build`); `None` for an iseq frame (a
/// block outside any method, a class body, a script) or when the layout is not verified.
/// Allocates nothing; reads two words.
pub fn method_entry_owner(frame: VALUE) -> Option<VALUE> {
    if !LAYOUT_VERIFIED.load(Ordering::Relaxed) || imemo_tag(frame) != Some(IMEMO_MENT) {
        return None;
    }
    // SAFETY: a method entry from rb_profile_frames, alive (its method is running), layout
    // verified at load.
    let owner = unsafe { owner_slot(frame) };
    is_module_like(owner).then_some(owner)
}

/// A T_CLASS or a T_MODULE.
pub fn is_module_like(value: VALUE) -> bool {
    matches!(heap_type(value), Some(T::RUBY_T_CLASS | T::RUBY_T_MODULE))
}

/// A T_MODULE.
pub fn is_module(value: VALUE) -> bool {
    heap_type(value) == Some(T::RUBY_T_MODULE)
}

/// The name of a class or module: the String it caches, permanent ("Foo::Bar") or temporary
/// (a class under an anonymous one); `None` for an anonymous one. Allocates nothing.
pub fn module_name(module: VALUE) -> Option<VALUE> {
    if !is_module_like(module) {
        return None;
    }
    // SAFETY: a T_CLASS or T_MODULE; rb_mod_name returns the cached name or nil, without
    // allocating.
    non_nil(unsafe { rb_sys::rb_mod_name(module) })
}

/// The object a singleton class is attached to; `None` for any other class. Never raises or
/// allocates.
pub fn singleton_attached(class: VALUE) -> Option<VALUE> {
    if heap_type(class) != Some(T::RUBY_T_CLASS) {
        return None;
    }
    // SAFETY: a T_CLASS (checked above); its first word is its flags.
    let flags = unsafe { *(class as *const VALUE) };
    if flags & rb_sys::ruby_fl_type::RUBY_FL_SINGLETON as VALUE == 0 {
        return None;
    }
    attached_object(class)
}

#[cfg(ruby_gte_3_2)]
fn attached_object(class: VALUE) -> Option<VALUE> {
    // SAFETY: a singleton class (checked by the caller), so rb_class_attached_object reads its
    // attached object and does not raise.
    non_nil(unsafe { rb_sys::rb_class_attached_object(class) })
}

#[cfg(not(ruby_gte_3_2))]
fn attached_object(class: VALUE) -> Option<VALUE> {
    let id = ATTACHED_ID.load(Ordering::Relaxed);
    if id == 0 {
        return None;
    }
    // SAFETY: a class; rb_attr_get looks the hidden ivar up in its table (nil when absent),
    // without allocating, raising or warning.
    non_nil(unsafe { rb_sys::rb_attr_get(class, id as rb_sys::ID) })
}

/// Whether `method_entry_owner` reads owners (the load-time check passed).
pub fn method_entry_layout_verified() -> bool {
    LAYOUT_VERIFIED.load(Ordering::Relaxed)
}

/// Checks, on the stack that loads the extension (which always holds the C frame of
/// `Kernel#require`, and usually Ruby method frames), that every frame handle's imemo tag agrees
/// with what the allocating public accessors say about it (a class path exactly for method
/// entries), that every owner slot holds a class or module, and that at least one frame's owner
/// gives the full label Ruby computes. Only then does `method_entry_owner` read owners.
///
/// Called once from `init`, with the GVL; allocates (the accessors' Strings).
pub fn verify_method_entry_layout(name_of: impl Fn(VALUE) -> Option<String>) {
    // SAFETY: rb_intern2 with a pointer and length of a static string; GVL held (init).
    let id = unsafe { rb_sys::rb_intern2(c"__attached__".as_ptr(), 12) };
    ATTACHED_ID.store(id as u64, Ordering::Relaxed);
    let mut frames = [0 as VALUE; 64];
    let mut lines = [0i32; 64];
    let depth = profile_frames(&mut frames, &mut lines);
    let (mut agreed, mut failed) = (0usize, false);
    for &frame in &frames[..depth] {
        let tag = imemo_tag(frame);
        // SAFETY: a frame handle from rb_profile_frames just now, GVL held; allocates a String.
        let classpath = non_nil(unsafe { rb_sys::rb_profile_frame_classpath(frame) });
        match tag {
            Some(IMEMO_ISEQ) if classpath.is_none() => {}
            Some(IMEMO_MENT) if classpath.is_some() => {
                // SAFETY: an imemo_ment (its tag says so, and Ruby found a class for it); the
                // slot is only read here, not trusted until checked.
                if !is_module_like(unsafe { owner_slot(frame) }) {
                    failed = true;
                    continue;
                }
                // SAFETY: as above; allocates a String.
                let full = unsafe { rb_sys::rb_profile_frame_full_label(frame) };
                // SAFETY: a String Ruby just returned, not used past this statement.
                let full = unsafe { super::borrow_str(full) }.map(str::to_owned);
                LAYOUT_VERIFIED.store(true, Ordering::Relaxed);
                let ours = name_of(frame);
                LAYOUT_VERIFIED.store(false, Ordering::Relaxed);
                if full.is_some() && ours == full {
                    agreed += 1;
                }
            }
            _ => failed = true,
        }
    }
    LAYOUT_VERIFIED.store(!failed && agreed > 0, Ordering::Relaxed);
}
