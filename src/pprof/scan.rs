//! What decoding a pprof `Profile` message will allocate, counted from its wire format without
//! decoding it, so that a small input that asks for a lot is refused before anything is
//! allocated for it.
//!
//! The counts follow prost's decoding of the `libdd-profiling-protobuf` messages: a repeated
//! field grows its `Vec` one element per occurrence (a packed one, one per varint), a string
//! reserves its length, everything else (ids, indexes, numbers, unknown fields) takes no heap.
//! The reader reserves the top-level lists itself from these counts, so only the lists inside
//! samples and locations grow by doubling.

use std::mem::size_of;

use libdd_profiling_protobuf::prost_impls as pb;

use super::budget::{alloc_cost, exact_vec_cost, grown_vec_cost};

/// How many of each thing a `Profile` message holds, and the heap bytes prost takes to decode it.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(super) struct Shape {
    pub sample_types: usize,
    pub samples: usize,
    pub mappings: usize,
    pub locations: usize,
    pub functions: usize,
    pub strings: usize,
    pub comments: usize,
    /// Lines over all locations, and the locations that have none.
    pub lines: usize,
    pub locations_without_lines: usize,
    /// Values over all samples, and the samples that have any.
    pub values: usize,
    pub samples_with_values: usize,
    /// Heap bytes of the decoded message: its top-level lists made with the capacity counted
    /// here, each string, and the lists inside samples and locations grown one push at a time.
    pub decoded_bytes: u64,
}

// Field numbers (profile.proto).
const PROFILE_SAMPLE_TYPE: u32 = 1;
const PROFILE_SAMPLE: u32 = 2;
const PROFILE_MAPPING: u32 = 3;
const PROFILE_LOCATION: u32 = 4;
const PROFILE_FUNCTION: u32 = 5;
const PROFILE_STRING_TABLE: u32 = 6;
const PROFILE_COMMENT: u32 = 13;
const SAMPLE_LOCATION_ID: u32 = 1;
const SAMPLE_VALUE: u32 = 2;
const SAMPLE_LABEL: u32 = 3;
const LOCATION_LINE: u32 = 4;

const VARINT: u8 = 0;
const FIXED64: u8 = 1;
const LENGTH_DELIMITED: u8 = 2;
const START_GROUP: u8 = 3;
const END_GROUP: u8 = 4;
const FIXED32: u8 = 5;

/// How deep groups (a wire type pprof never uses, which prost skips) may nest.
const GROUP_DEPTH: u32 = 100;

impl Shape {
    /// Counts `raw`, a `Profile` message. `Err` (what is wrong) where the wire format is broken,
    /// which prost would refuse too. A field with a wire type its number does not have is
    /// skipped here and refused by prost, before it allocates anything for it.
    pub fn scan(raw: &[u8]) -> Result<Shape, String> {
        let mut shape = Shape::default();
        let mut buf = raw;
        while !buf.is_empty() {
            let (field, wire_type) = key(&mut buf)?;
            if wire_type != LENGTH_DELIMITED {
                if (field, wire_type) == (PROFILE_COMMENT, VARINT) {
                    shape.comments += 1;
                }
                skip(field, wire_type, &mut buf, GROUP_DEPTH)?;
                continue;
            }
            let payload = delimited(&mut buf)?;
            match field {
                PROFILE_SAMPLE_TYPE => shape.sample_types += 1,
                PROFILE_SAMPLE => shape.add_sample(payload)?,
                PROFILE_MAPPING => shape.mappings += 1,
                PROFILE_LOCATION => shape.add_location(payload)?,
                PROFILE_FUNCTION => shape.functions += 1,
                PROFILE_STRING_TABLE => {
                    shape.strings += 1;
                    // prost reserves the length, and Vec never reserves fewer than 8 bytes.
                    let reserved = if payload.is_empty() {
                        0
                    } else {
                        payload.len().max(8)
                    };
                    shape.add_bytes(alloc_cost(reserved as u64));
                }
                PROFILE_COMMENT => shape.comments += varints(payload),
                _ => {}
            }
        }
        shape.add_bytes(exact_vec_cost(
            shape.sample_types,
            size_of::<pb::ValueType>(),
        ));
        shape.add_bytes(exact_vec_cost(shape.samples, size_of::<pb::Sample>()));
        shape.add_bytes(exact_vec_cost(shape.mappings, size_of::<pb::Mapping>()));
        shape.add_bytes(exact_vec_cost(shape.locations, size_of::<pb::Location>()));
        shape.add_bytes(exact_vec_cost(shape.functions, size_of::<pb::Function>()));
        shape.add_bytes(exact_vec_cost(shape.strings, size_of::<String>()));
        shape.add_bytes(exact_vec_cost(shape.comments, size_of::<i64>()));
        Ok(shape)
    }

    fn add_bytes(&mut self, bytes: u64) {
        self.decoded_bytes = self.decoded_bytes.saturating_add(bytes);
    }

    fn add_sample(&mut self, mut buf: &[u8]) -> Result<(), String> {
        let (mut location_ids, mut values, mut labels) = (0, 0, 0);
        while !buf.is_empty() {
            let (field, wire_type) = key(&mut buf)?;
            let count = repeated(field, wire_type, &mut buf)?;
            match field {
                SAMPLE_LOCATION_ID => location_ids += count,
                SAMPLE_VALUE => values += count,
                SAMPLE_LABEL if wire_type == LENGTH_DELIMITED => labels += 1,
                _ => {}
            }
        }
        self.samples += 1;
        self.values += values;
        self.samples_with_values += usize::from(values > 0);
        self.add_bytes(grown_vec_cost(location_ids, size_of::<u64>()));
        self.add_bytes(grown_vec_cost(values, size_of::<i64>()));
        self.add_bytes(grown_vec_cost(labels, size_of::<pb::Label>()));
        Ok(())
    }

    fn add_location(&mut self, mut buf: &[u8]) -> Result<(), String> {
        let mut lines = 0;
        while !buf.is_empty() {
            let (field, wire_type) = key(&mut buf)?;
            if (field, wire_type) == (LOCATION_LINE, LENGTH_DELIMITED) {
                lines += 1;
            }
            skip(field, wire_type, &mut buf, GROUP_DEPTH)?;
        }
        self.locations += 1;
        self.lines += lines;
        self.locations_without_lines += usize::from(lines == 0);
        self.add_bytes(grown_vec_cost(lines, size_of::<pb::Line>()));
        Ok(())
    }
}

/// Skips one field of a sample and says how many elements prost would push for it if it is a
/// repeated number: one when unpacked, one per varint when packed.
fn repeated(field: u32, wire_type: u8, buf: &mut &[u8]) -> Result<usize, String> {
    if wire_type == LENGTH_DELIMITED {
        return Ok(varints(delimited(buf)?));
    }
    skip(field, wire_type, buf, GROUP_DEPTH)?;
    Ok(usize::from(wire_type == VARINT))
}

/// Varints in a packed field: the bytes that end one (top bit clear). A last one left open is
/// an error to prost, which will have pushed no more than this many.
fn varints(payload: &[u8]) -> usize {
    payload.iter().filter(|&&b| b & 0x80 == 0).count()
}

/// Reads a field's key: its number and wire type.
fn key(buf: &mut &[u8]) -> Result<(u32, u8), String> {
    let key = varint(buf)?;
    let field = u32::try_from(key >> 3)
        .ok()
        .filter(|&f| f > 0)
        .ok_or_else(|| format!("invalid field key {key}"))?;
    Ok((field, (key & 7) as u8))
}

fn varint(buf: &mut &[u8]) -> Result<u64, String> {
    let mut value = 0u64;
    for shift in (0..70).step_by(7) {
        let Some((&byte, rest)) = buf.split_first() else {
            return Err("a varint runs past the end".into());
        };
        *buf = rest;
        value |= u64::from(byte & 0x7f).checked_shl(shift).unwrap_or(0);
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err("a varint is longer than 10 bytes".into())
}

/// Takes a length-delimited payload off `buf`.
fn delimited<'a>(buf: &mut &'a [u8]) -> Result<&'a [u8], String> {
    let len = varint(buf)?;
    advance(buf, len)
}

fn advance<'a>(buf: &mut &'a [u8], len: u64) -> Result<&'a [u8], String> {
    let len = usize::try_from(len)
        .ok()
        .filter(|&len| len <= buf.len())
        .ok_or_else(|| format!("a field of {len} bytes runs past the end"))?;
    let (taken, rest) = buf.split_at(len);
    *buf = rest;
    Ok(taken)
}

/// Skips the value of field `field`, whose key was just read; a group up to its end key.
fn skip(field: u32, wire_type: u8, buf: &mut &[u8], depth: u32) -> Result<(), String> {
    match wire_type {
        VARINT => varint(buf).map(drop),
        FIXED64 => advance(buf, 8).map(drop),
        LENGTH_DELIMITED => delimited(buf).map(drop),
        FIXED32 => advance(buf, 4).map(drop),
        START_GROUP if depth > 0 => loop {
            match key(buf)? {
                (end, END_GROUP) if end == field => return Ok(()),
                (_, END_GROUP) => return Err(format!("group {field} ends with another key")),
                (inner, wire_type) => skip(inner, wire_type, buf, depth - 1)?,
            }
        },
        START_GROUP => Err("groups nest too deep".into()),
        _ => Err(format!("field {field} has invalid wire type {wire_type}")),
    }
}
