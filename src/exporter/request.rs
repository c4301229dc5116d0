//! One request per profile, through libdd-profiling's exporter.
//!
//! - Datadog agent: `ProfileExporter::build` makes the agent intake's multipart request (`event`
//!   = `event.json` with the span, family, tags and attachments; `profile.pprof`); we add the
//!   profiler's name and version as `info`, and check the status of the answer.
//! - Pyroscope: `POST <base>/ingest?name=<app>{labels}&from=&until=&format=pprof&spyName=...` with a
//!   multipart body of `profile` (the pprof) and `sample_type_config` (how Pyroscope should read
//!   our sample types), sent with libdd-profiling's `Exporter::send`, which takes no cancellation
//!   token: that request is bounded by the timeout only.
//!
//! Runs on the flushing thread, with no GVL and no VM call; allocates with Rust's allocator.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::header::{HeaderMap, HeaderName, HeaderValue, AUTHORIZATION, CONTENT_TYPE, USER_AGENT};
use libdd_common::tag::{parse_tags, Tag};
use libdd_profiling::exporter::{config as endpoints, Exporter, ProfileExporter};
use libdd_profiling::internal::EncodedProfile;
use serde_json::json;

use super::multipart::Multipart;
use super::{Backend, FailureKind, PendingUpload, UploadFailure, UploaderConfig};
use crate::error::{HeapError, Result};
use crate::pprof::{LIVE_SAMPLES_TYPE, LIVE_SIZE_TYPE};

/// The profiler's name as the intake sees it (`DD-EVP-ORIGIN`, Pyroscope's `spyName`).
pub const PROFILER_NAME: &str = "datadog_heap";
/// The profile family Datadog files our profiles under.
pub const DATADOG_FAMILY: &str = "ruby";

/// How Pyroscope should read our two sample types: live objects and live bytes, averaged (not
/// summed) when profiles of one series are merged, shown as Go's in-use memory types.
fn pyroscope_sample_types() -> String {
    let config = |units: &str, display: &str| {
        json!({"units": units, "aggregation": "average", "display-name": display,
               "sampled": false, "cumulative": false})
    };
    json!({
        LIVE_SAMPLES_TYPE: config("objects", "inuse_objects"),
        LIVE_SIZE_TYPE: config("bytes", "inuse_space"),
    })
    .to_string()
}

pub(super) enum BackendClient {
    Datadog(Box<ProfileExporter>),
    Pyroscope(Box<Exporter>),
}

fn invalid(name: &'static str, expected: &'static str, value: &str) -> HeapError {
    HeapError::InvalidArgument {
        name,
        expected,
        value: value.to_owned(),
    }
}

fn timeout_ms(timeout: Duration) -> u64 {
    u64::try_from(timeout.as_millis())
        .unwrap_or(u64::MAX)
        .max(1)
}

/// Each `key:value` tag as libdatadog's `Tag`; a tag it refuses is an `InvalidArgument`.
fn checked_tags(tags: &[String]) -> Result<Vec<Tag>> {
    tags.iter()
        .map(|tag| {
            let (mut parsed, error) = parse_tags(tag);
            match (parsed.len(), error) {
                (1, None) => parsed
                    .pop()
                    .ok_or_else(|| invalid("tags", "key:value", tag)),
                _ => Err(invalid(
                    "tags",
                    "key:value tags without ',' or ' ', not starting or ending with ':'",
                    tag,
                )),
            }
        })
        .collect()
}

fn http_uri(name: &'static str, url: &str) -> Result<http::Uri> {
    let expected = "an http://, https:// or unix:// URL";
    if let Some(path) = url.strip_prefix("unix://") {
        if name != "agent url" || !path.starts_with('/') {
            return Err(invalid(name, expected, url));
        }
        return unix_uri(path).ok_or_else(|| invalid(name, expected, url));
    }
    let uri: http::Uri = url.parse().map_err(|_| invalid(name, expected, url))?;
    match uri.scheme_str() {
        Some("http" | "https") if uri.authority().is_some() => Ok(uri),
        _ => Err(invalid(name, expected, url)),
    }
}

/// The URI libdatadog's connector reads as a unix socket: scheme `unix`, the socket's path
/// hex-encoded as the authority. Built here because libdd-common 1.1's own helpers give it an
/// empty path, which the `http` crate in this tree rejects (`parse_uri` even panics on it).
fn unix_uri(path: &str) -> Option<http::Uri> {
    let hex: String = path.bytes().map(|b| format!("{b:02x}")).collect();
    http::Uri::builder()
        .scheme("unix")
        .authority(hex.as_str())
        .path_and_query("/")
        .build()
        .ok()
}

impl BackendClient {
    /// Checks the configuration and builds the client (libdd-profiling's exporter and its
    /// runtime). Needs no GVL.
    pub(super) fn new(config: &UploaderConfig) -> Result<Self> {
        let tags = checked_tags(&config.tags)?;
        let setup = |e: String| HeapError::Host(format!("could not set up the exporter: {e}"));
        match &config.backend {
            Backend::DatadogAgent { url } => {
                let uri = http_uri("agent url", url)?;
                let endpoint = endpoints::agent(uri)
                    .map_err(|_| invalid("agent url", "a URL", url))?
                    .with_timeout(timeout_ms(config.timeout));
                let exporter = ProfileExporter::new(
                    PROFILER_NAME,
                    config.profiler_version.clone(),
                    DATADOG_FAMILY,
                    Some(tags),
                    endpoint,
                )
                .map_err(|e| setup(format!("{e:#}")))?;
                Ok(BackendClient::Datadog(Box::new(exporter)))
            }
            Backend::Pyroscope {
                url,
                app_name,
                auth_token,
                tenant_id,
            } => {
                http_uri("pyroscope url", url)?;
                if app_name.is_empty() || app_name.contains(['{', '}', ',', '=']) {
                    return Err(invalid(
                        "app_name",
                        "a non-empty name without '{', '}', ',' or '='",
                        app_name,
                    ));
                }
                for (name, value) in [("auth_token", auth_token), ("tenant_id", tenant_id)] {
                    if let Some(value) = value {
                        if HeaderValue::from_str(value).is_err() {
                            return Err(invalid(name, "printable ASCII", value));
                        }
                    }
                }
                let exporter = Exporter::new().map_err(|e| setup(format!("{e:#}")))?;
                Ok(BackendClient::Pyroscope(Box::new(exporter)))
            }
        }
    }

    /// Sends one profile; `Ok` when the backend answered 2xx.
    pub(super) fn send(
        &self,
        config: &UploaderConfig,
        profile: &PendingUpload,
        cancel: &super::CancellationToken,
    ) -> std::result::Result<(), UploadFailure> {
        let status = match self {
            BackendClient::Datadog(exporter) => {
                let encoded = EncodedProfile {
                    start: profile.start,
                    end: profile.end,
                    buffer: profile.pprof.clone(),
                    endpoints_stats: Default::default(),
                };
                let info = json!({
                    "profiler": {"name": PROFILER_NAME, "version": config.profiler_version},
                });
                let request = exporter
                    .build(encoded, &[], &[], None, None, Some(info))
                    .map_err(|e| transport_failure(&format!("{e:#}")))?;
                exporter
                    .send(request, Some(cancel))
                    .map_err(|e| transport_failure(&format!("{e:#}")))?
                    .status()
            }
            BackendClient::Pyroscope(exporter) => {
                let Backend::Pyroscope {
                    url,
                    app_name,
                    auth_token,
                    tenant_id,
                } = &config.backend
                else {
                    return Err(transport_failure("backend and client disagree"));
                };
                let target = pyroscope_target(url, app_name, &config.tags, profile);
                let sample_types = pyroscope_sample_types();
                let mut form = Multipart::new();
                form.file(
                    "profile",
                    "profile.pprof",
                    "application/octet-stream",
                    &profile.pprof,
                );
                form.file(
                    "sample_type_config",
                    "sample_type_config.json",
                    "application/json",
                    sample_types.as_bytes(),
                );
                let (content_type, body) = form.finish();
                let mut headers = HeaderMap::new();
                let header = |v: &str| {
                    HeaderValue::from_str(v).map_err(|_| transport_failure("invalid header value"))
                };
                headers.insert(CONTENT_TYPE, header(&content_type)?);
                let agent = format!("{PROFILER_NAME}/{}", config.profiler_version);
                headers.insert(USER_AGENT, header(&agent)?);
                if let Some(token) = auth_token {
                    headers.insert(AUTHORIZATION, header(&format!("Bearer {token}"))?);
                }
                if let Some(tenant) = tenant_id {
                    headers.insert(HeaderName::from_static("x-scope-orgid"), header(tenant)?);
                }
                exporter
                    .send(http::Method::POST, &target, headers, &body, config.timeout)
                    .map_err(|e| transport_failure(&format!("{e:#}")))?
                    .status()
            }
        };
        if status.is_success() {
            Ok(())
        } else {
            Err(UploadFailure {
                kind: FailureKind::HttpStatus(status.as_u16()),
                message: format!("the backend answered HTTP {status}"),
            })
        }
    }
}

/// A failure before any answer, classified by libdd-profiling's messages for its timeout and
/// its cancellation (its error type is not public); anything else is the connection's.
fn transport_failure(message: &str) -> UploadFailure {
    let kind = if message.contains("operation timed out") {
        FailureKind::Timeout
    } else if message.contains("operation cancelled by user") {
        FailureKind::Cancelled
    } else {
        FailureKind::Connection
    };
    UploadFailure {
        kind,
        message: message.to_owned(),
    }
}

fn unix_seconds(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// `<base>/ingest?name=...&from=...&until=...&format=pprof&spyName=datadog_heap`.
fn pyroscope_target(base: &str, app_name: &str, tags: &[String], p: &PendingUpload) -> String {
    let name = format!("{app_name}{}", pyroscope_labels(tags));
    format!(
        "{}/ingest?name={}&from={}&until={}&format=pprof&spyName={PROFILER_NAME}",
        base.trim_end_matches('/'),
        percent_encode(&name),
        unix_seconds(p.start),
        unix_seconds(p.end).max(unix_seconds(p.start)),
    )
}

/// `{key=value,...}` from `key:value` tags, as Pyroscope's application name carries labels.
/// Label names keep `[A-Za-z0-9_.]` (anything else becomes `_`); values lose the characters that
/// would end the label set (`,`, `{`, `}`, `=`). Tags without a value are left out.
pub fn pyroscope_labels(tags: &[String]) -> String {
    let labels: Vec<String> = tags
        .iter()
        .filter_map(|tag| tag.split_once(':'))
        .filter(|(key, value)| !key.is_empty() && !value.is_empty())
        .map(|(key, value)| {
            let key: String = key
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || c == '_' || c == '.' {
                        c
                    } else {
                        '_'
                    }
                })
                .collect();
            let value: String = value
                .chars()
                .map(|c| {
                    if matches!(c, ',' | '{' | '}' | '=') {
                        '_'
                    } else {
                        c
                    }
                })
                .collect();
            format!("{key}={value}")
        })
        .collect();
    format!("{{{}}}", labels.join(","))
}

/// Query-string encoding: unreserved characters as they are, every other byte as `%XX`.
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for byte in s.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_sanitized() {
        let tags = vec![
            "env:prod".to_string(),
            "team-name:a,b".to_string(),
            "novalue".to_string(),
            "k:{x=y}".to_string(),
        ];
        assert_eq!(pyroscope_labels(&tags), "{env=prod,team_name=a_b,k=_x_y_}");
        assert_eq!(pyroscope_labels(&[]), "{}");
    }

    #[test]
    fn percent_encoding_keeps_unreserved_only() {
        assert_eq!(percent_encode("a.b{env=x,y}"), "a.b%7Benv%3Dx%2Cy%7D");
        assert_eq!(percent_encode("é"), "%C3%A9");
    }

    #[test]
    fn tags_are_checked_like_libdatadog() {
        assert!(checked_tags(&["service:web".into(), "bare".into()]).is_ok());
        for bad in [":x", "x:", "", "a b", "a,b"] {
            let err = checked_tags(&[bad.to_string()]).unwrap_err();
            assert!(err.to_string().contains("tags must be"), "{bad}: {err}");
        }
    }

    #[test]
    fn urls_are_checked() {
        assert!(http_uri("agent url", "http://127.0.0.1:8126").is_ok());
        assert!(http_uri("agent url", "unix:///var/run/datadog/apm.socket").is_ok());
        assert!(http_uri("pyroscope url", "unix:///tmp/x").is_err());
        assert!(http_uri("agent url", "unix://relative").is_err());
        let uri = http_uri("agent url", "unix:///run/a.sock").unwrap();
        let path = libdd_common::connector::uds::socket_path_from_uri(&uri).unwrap();
        assert_eq!(path, std::path::Path::new("/run/a.sock"));
        for bad in ["localhost:8126", "ftp://x", "http://", "not a url"] {
            assert!(http_uri("agent url", bad).is_err(), "{bad}");
        }
    }
}
