//! Arguments from Ruby, checked and converted, and `record_allocation`, whose arguments are most
//! of its work. Errors name the argument and show the value (TypeError for a wrong type,
//! ArgumentError for a bad value).

use datadog_heap_core::{truncation, NamedFrame, RecordOutcome};
use magnus::{
    prelude::*, rb_sys::AsRawValue, typed_data::Obj, Error, RArray, RString, Ruby, Value,
};

use super::{with_session, Recorder};
use crate::errors::{arg_error, type_error, OrRaise};
use crate::runtime;
use crate::shims;

/// An Integer argument as i64; TypeError for non-Integers, ArgumentError past 64 bits.
pub fn integer(ruby: &Ruby, name: &str, value: Value) -> Result<i64, Error> {
    let Some(int) = magnus::Integer::from_value(value) else {
        return Err(type_error(
            ruby,
            format!("{name} must be an Integer, got {}", value.class().inspect()),
        ));
    };
    int.to_i64()
        .map_err(|_| arg_error(ruby, format!("{name} is out of range: {}", value.inspect())))
}

/// `value` for an error message, as `DatadogHeap::Validate.describe` shows it (`"2" (String)`):
/// briefly, and without running a user's inspect, which could raise, or recurse through a
/// structure deep enough that a GC starting down there aborts Ruby 3.1 (the fuzz spec met it).
/// `#<?>` when even that fails.
fn describe(ruby: &Ruby, value: Value) -> String {
    let shown = ruby
        .define_module("DatadogHeap")
        .and_then(|m| m.const_get::<_, magnus::RModule>("Validate"))
        .and_then(|v| v.funcall::<_, _, RString>("describe", (value,)));
    shown.map_or_else(|_| "#<?>".to_string(), owned_string)
}

/// A positive count that fits in 32 bits.
pub fn positive_u32(ruby: &Ruby, name: &str, value: u64) -> Result<u32, Error> {
    if value == 0 {
        return Err(arg_error(
            ruby,
            format!("{name} must be a positive Integer, got 0"),
        ));
    }
    u32::try_from(value).map_err(|_| {
        arg_error(
            ruby,
            format!("{name} must be at most {}, got {value}", u32::MAX),
        )
    })
}

/// The bytes of a Ruby String as UTF-8, replacing invalid sequences.
fn owned_string(s: RString) -> String {
    let bytes = crate::shims::string_bytes(s);
    match String::from_utf8(bytes) {
        Ok(text) => text,
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    }
}

/// `locations` -> owned frames, innermost first, cut to `max_frames` as the sampler cuts them.
fn convert_locations(
    ruby: &Ruby,
    locations: Value,
    max_frames: usize,
) -> Result<Vec<(String, String, i32)>, Error> {
    let array = RArray::from_value(locations).ok_or_else(|| {
        type_error(
            ruby,
            format!(
                "locations must be an Array of [name, path, line], got {}",
                locations.class().inspect()
            ),
        )
    })?;
    let (keep, marker) = truncation(array.len(), max_frames, false);
    let mut frames = Vec::with_capacity(keep + 1);
    for i in 0..keep {
        let entry: Value = array.entry(i as isize)?;
        let bad = || {
            type_error(
                ruby,
                format!(
                    "locations[{i}] must be [String, String, Integer], got {}",
                    describe(ruby, entry)
                ),
            )
        };
        let frame = RArray::from_value(entry).ok_or_else(bad)?;
        if frame.len() != 3 {
            return Err(bad());
        }
        let name = RString::from_value(frame.entry(0)?).ok_or_else(bad)?;
        let path = RString::from_value(frame.entry(1)?).ok_or_else(bad)?;
        let line_value: Value = frame.entry(2)?;
        if magnus::Integer::from_value(line_value).is_none() {
            return Err(bad());
        }
        let line = integer(ruby, "line", line_value)?;
        let line = i32::try_from(line).map_err(|_| {
            arg_error(
                ruby,
                format!("locations[{i}] line must fit in 32 bits, got {line}"),
            )
        })?;
        frames.push((owned_string(name), owned_string(path), line));
    }
    if let Some(marker) = marker {
        frames.push((marker, String::new(), 0));
    }
    Ok(frames)
}

/// `_native_record_allocation(obj, weight, class_name, locations)` -> true when pending. The
/// same path as the hook's samples: the recording waits for the commit job, for which the
/// session is listed (so its pending objects stay marked even if the recorder is dropped).
pub fn record_allocation(
    ruby: &Ruby,
    rb_self: Obj<Recorder>,
    object: Value,
    weight: Value,
    class_name: Value,
    locations: Value,
) -> Result<bool, Error> {
    with_session(ruby, &rb_self, |session| {
        let raw = object.as_raw();
        if shims::heap_type(raw).is_none() {
            return Err(arg_error(
                ruby,
                format!(
                    "obj must be a heap object, got {}: immediates cannot be tracked",
                    describe(ruby, object)
                ),
            ));
        }
        let weight = integer(ruby, "weight", weight)?;
        if weight < 1 {
            return Err(arg_error(
                ruby,
                format!("weight must be a positive Integer, got {weight}"),
            ));
        }
        let weight = positive_u32(ruby, "weight", weight as u64)?;
        let class_name = if class_name.is_nil() {
            None
        } else {
            let s = RString::from_value(class_name).ok_or_else(|| {
                type_error(
                    ruby,
                    format!(
                        "class_name must be a String or nil, got {}",
                        class_name.class().inspect()
                    ),
                )
            })?;
            Some(owned_string(s))
        };
        let frames = convert_locations(ruby, locations, session.config.max_frames)?;
        let named_frames: Vec<NamedFrame> = frames
            .iter()
            .map(|(name, file, line)| NamedFrame {
                name,
                filename: file,
                line: *line,
            })
            .collect();
        let recorded = session
            .core
            .record_allocation(
                raw as usize,
                u64::from(weight),
                class_name.as_deref(),
                &named_frames,
                shims::gc_count(),
            )
            .or_raise(ruby)?;
        if recorded.needs_commit && session.has_pending() {
            runtime::list(session);
            runtime::request_commit();
        }
        Ok(recorded.outcome == RecordOutcome::Pending)
    })
}
