//! A `multipart/form-data` body (RFC 7578) of file parts, for the Pyroscope adapter. (The Datadog
//! request's body is libdd-profiling's.) Every part has a filename: Pyroscope reads its fields
//! as files.

use std::time::{SystemTime, UNIX_EPOCH};

struct Part<'a> {
    name: &'static str,
    filename: &'static str,
    content_type: &'static str,
    bytes: &'a [u8],
}

pub(super) struct Multipart<'a> {
    parts: Vec<Part<'a>>,
}

impl<'a> Multipart<'a> {
    pub(super) fn new() -> Self {
        Multipart { parts: Vec::new() }
    }

    pub(super) fn file(
        &mut self,
        name: &'static str,
        filename: &'static str,
        content_type: &'static str,
        bytes: &'a [u8],
    ) {
        self.parts.push(Part {
            name,
            filename,
            content_type,
            bytes,
        });
    }

    /// The `Content-Type` header (with the boundary) and the body. The boundary is one that no
    /// part contains.
    pub(super) fn finish(self) -> (String, Vec<u8>) {
        let seed = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
            ^ u128::from(std::process::id());
        let mut attempt: u128 = 0;
        let boundary = loop {
            let candidate = format!("datadog-heap-{:032x}", seed.wrapping_add(attempt));
            if !self
                .parts
                .iter()
                .any(|p| contains(p.bytes, candidate.as_bytes()))
            {
                break candidate;
            }
            attempt += 1;
        };
        let mut body = Vec::with_capacity(self.parts.iter().map(|p| p.bytes.len() + 200).sum());
        for part in &self.parts {
            body.extend_from_slice(
                format!(
                    "--{boundary}\r\nContent-Disposition: form-data; name=\"{}\"; filename=\"{}\"\r\nContent-Type: {}\r\n\r\n",
                    part.name, part.filename, part.content_type
                )
                .as_bytes(),
            );
            body.extend_from_slice(part.bytes);
            body.extend_from_slice(b"\r\n");
        }
        body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
        (format!("multipart/form-data; boundary={boundary}"), body)
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}
