//! `DatadogHeap::Exporter`: the core's `ProfileUploader` as a Ruby object (lib/datadog_heap/upload.rb
//! wraps it; keyword arguments and checks live there).
//!
//! Profiles go in under the GVL (`_native_enqueue_profile` encodes a recorder's live objects,
//! itself without the GVL; `_native_enqueue` takes pprof bytes); `_native_flush` sends them with
//! the GVL released, so the thread that flushes (auto's writer thread) blocks and no other does.
//! An interrupt of that thread (Thread#kill, the VM ending it at exit) cancels the request in
//! flight through the unblocking function; the profile stays queued.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use datadog_heap_core::exporter::{
    Backend, CancellationToken, FailureKind, FlushOutcome, PendingUpload, ProfileUploader,
    UploaderConfig,
};
use magnus::{
    function, method, prelude::*, Error, IntoValue, RArray, RHash, RModule, RString, Ruby,
};

use crate::errors::{arg_error, OrRaise};
use crate::recorder::{profile as recorder_profile, stat_value, Recorder};
use crate::runtime::{self, guarded};
use crate::shims::{self, IfRefused};

#[magnus::wrap(class = "DatadogHeap::Exporter", free_immediately)]
pub struct Exporter {
    uploader: ProfileUploader,
}

fn time_from_ns(name: &str, ns: i64, ruby: &Ruby) -> Result<SystemTime, Error> {
    let ns = u64::try_from(ns).map_err(|_| {
        arg_error(
            ruby,
            format!("{name} must be nanoseconds since the epoch >= 0, got {ns}"),
        )
    })?;
    Ok(UNIX_EPOCH + Duration::from_nanos(ns))
}

fn ns_from_time(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

impl Exporter {
    /// `_native_new(backend, url, app_name, auth_token, tenant_id, tags, timeout_seconds,
    /// max_queue, profiler_version)`; backend is "agent" or "pyroscope" (the last three
    /// Pyroscope-only, nil otherwise). Ruby has checked the types; the core checks the values.
    #[allow(clippy::too_many_arguments)] // positional, as Ruby passes them
    fn native_new(
        ruby: &Ruby,
        backend: String,
        url: String,
        app_name: Option<String>,
        auth_token: Option<String>,
        tenant_id: Option<String>,
        tags: Vec<String>,
        timeout_seconds: f64,
        max_queue: usize,
        profiler_version: String,
    ) -> Result<Exporter, Error> {
        guarded(ruby, || {
            let backend = match backend.as_str() {
                "agent" => Backend::DatadogAgent { url },
                "pyroscope" => Backend::Pyroscope {
                    url,
                    app_name: app_name.unwrap_or_default(),
                    auth_token,
                    tenant_id,
                },
                other => {
                    return Err(arg_error(
                        ruby,
                        format!("backend must be \"agent\" or \"pyroscope\", got {other:?}"),
                    ))
                }
            };
            let timeout = Duration::try_from_secs_f64(timeout_seconds).map_err(|_| {
                arg_error(
                    ruby,
                    format!("timeout must be a number of seconds > 0, got {timeout_seconds}"),
                )
            })?;
            let uploader = ProfileUploader::new(UploaderConfig {
                backend,
                tags,
                timeout,
                max_queue,
                profiler_version,
            })
            .or_raise(ruby)?;
            Ok(Exporter { uploader })
        })
    }

    /// `_native_enqueue_profile(recorder, start_ns)` -> `[end_ns, dropped]`: queues `recorder`'s
    /// live objects as a profile spanning start..now; `dropped` when that pushed out the oldest.
    fn enqueue_profile(
        ruby: &Ruby,
        rb_self: &Self,
        recorder: &Recorder,
        start_ns: i64,
    ) -> Result<RArray, Error> {
        guarded(ruby, || {
            let start = time_from_ns("start", start_ns, ruby)?;
            let end = SystemTime::now().max(start);
            let encoded = recorder_profile::encode(
                ruby,
                recorder,
                Some(start),
                Some(end),
                &Default::default(),
                // Backends read the two estimates; the records and variances are for the CLI.
                false,
            )?;
            let dropped = rb_self
                .uploader
                .enqueue(PendingUpload::new(encoded.bytes, start, end));
            Ok(ruby.ary_new_from_values(&[
                ns_from_time(end).into_value_with(ruby),
                dropped.into_value_with(ruby),
            ]))
        })
    }

    /// `_native_enqueue(pprof, start_ns, end_ns)` -> dropped: queues a profile made elsewhere.
    fn enqueue(
        ruby: &Ruby,
        rb_self: &Self,
        pprof: RString,
        start_ns: i64,
        end_ns: i64,
    ) -> Result<bool, Error> {
        guarded(ruby, || {
            let start = time_from_ns("start", start_ns, ruby)?;
            let end = time_from_ns("end", end_ns, ruby)?;
            if end < start {
                return Err(arg_error(
                    ruby,
                    format!("end must not be before start, got start {start_ns} and end {end_ns}"),
                ));
            }
            let bytes = shims::string_bytes(pprof);
            Ok(rb_self
                .uploader
                .enqueue(PendingUpload::new(bytes, start, end)))
        })
    }

    /// `_native_flush` -> `[sent, failure_kind, message]`: sends what is queued (see the core's
    /// `flush`), without the GVL. `failure_kind` is nil, :timeout, :connection, :http_status,
    /// :cancelled (interrupted) or :busy (another thread is flushing).
    fn flush(ruby: &Ruby, rb_self: &Self) -> Result<RArray, Error> {
        guarded(ruby, || {
            // Not busy while the GVL is released: other threads' allocations meanwhile are the
            // program's, not our own work's.
            let outcome = runtime::not_busy(|| flush_without_gvl(&rb_self.uploader))?;
            let (kind, message): (Option<&str>, Option<String>) = match outcome {
                None => (
                    Some("cancelled"),
                    Some("interrupted before the upload could start".into()),
                ),
                Some(FlushOutcome { busy: true, .. }) => {
                    (Some("busy"), Some("another thread is uploading".into()))
                }
                Some(FlushOutcome {
                    failure: Some(ref failure),
                    ..
                }) => (
                    Some(match failure.kind {
                        FailureKind::Timeout => "timeout",
                        FailureKind::Connection => "connection",
                        FailureKind::HttpStatus(_) => "http_status",
                        FailureKind::Cancelled => "cancelled",
                    }),
                    Some(failure.message.clone()),
                ),
                Some(_) => (None, None),
            };
            let sent = outcome.map_or(0, |o| o.sent);
            Ok(ruby.ary_new_from_values(&[
                sent.into_value_with(ruby),
                kind.map(|k| ruby.to_symbol(k)).into_value_with(ruby),
                message.into_value_with(ruby),
            ]))
        })
    }

    /// `stats` -> Hash: the `upload_*` counters and `upload_last_error` (String or nil).
    fn stats(ruby: &Ruby, rb_self: &Self) -> Result<RHash, Error> {
        guarded(ruby, || {
            let (counts, last_error) = rb_self.uploader.stats();
            let hash = ruby.hash_new();
            for (key, value) in counts {
                hash.aset(ruby.to_symbol(key), stat_value(ruby, value))?;
            }
            hash.aset(ruby.to_symbol("upload_last_error"), last_error)?;
            Ok(hash)
        })
    }

    /// `queue_length` -> profiles waiting to be sent.
    fn queue_length(ruby: &Ruby, rb_self: &Self) -> Result<usize, Error> {
        guarded(ruby, || Ok(rb_self.uploader.queue_len()))
    }
}

/// Runs `uploader.flush` with the GVL released and an unblocking function that cancels it.
/// `Ok(None)`: the GVL could not be released (interrupts kept coming) or the flush panicked;
/// nothing was lost, the profiles stay queued. An exception raised while handling interrupts
/// comes back as `Err`.
fn flush_without_gvl(uploader: &ProfileUploader) -> Result<Option<FlushOutcome>, Error> {
    let token = CancellationToken::new();
    let cancel = || token.cancel();
    shims::without_gvl(|_| uploader.flush(&token), Some(&cancel), IfRefused::Skip)
}

pub fn init(ruby: &Ruby, module: RModule) -> Result<(), Error> {
    let class = module.define_class("Exporter", ruby.class_object())?;
    // Made only by `_native_new`: an allocated-but-empty Exporter could not be used.
    class.undef_default_alloc_func();
    class.define_singleton_method("_native_new", function!(Exporter::native_new, 9))?;
    class.define_method(
        "_native_enqueue_profile",
        method!(Exporter::enqueue_profile, 2),
    )?;
    class.define_method("_native_enqueue", method!(Exporter::enqueue, 3))?;
    class.define_method("_native_flush", method!(Exporter::flush, 0))?;
    class.define_method("stats", method!(Exporter::stats, 0))?;
    class.define_method("queue_length", method!(Exporter::queue_length, 0))?;
    Ok(())
}
