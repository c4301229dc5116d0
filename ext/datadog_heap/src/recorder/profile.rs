//! `profile`: the live objects as a gzip pprof. The full update and the snapshot (names included)
//! run with the GVL; building and compressing the profile runs without it, on data the snapshot
//! owns, so other threads keep going and nothing a forked child could inherit is held meanwhile.

use std::time::SystemTime;

use datadog_heap_core::pprof::{encode_profile_retained, RetainedBy};
use datadog_heap_core::{EncodeOptions, EncodedPprof};
use magnus::{Error, RString, Ruby};

use super::{with_session, Recorder};
use crate::errors::{heap_error, OrRaise};
use crate::runtime;
use crate::shims::{without_gvl, IfRefused};

/// `profile` -> gzip pprof of the live objects.
pub fn profile(ruby: &Ruby, rb_self: &Recorder) -> Result<RString, Error> {
    let encoded = encode(ruby, rb_self, None, None, &RetainedBy::new(), true)?;
    Ok(ruby.str_from_slice(&encoded.bytes))
}

/// `profile` as written before profiles carried records and variances (and as uploads still
/// are): the two estimates only. For the specs of readers of older profiles.
pub fn profile_without_uncertainty(ruby: &Ruby, rb_self: &Recorder) -> Result<RString, Error> {
    let encoded = encode(ruby, rb_self, None, None, &RetainedBy::new(), false)?;
    Ok(ruby.str_from_slice(&encoded.bytes))
}

/// `_native_profile_retained([[record_id, path], ...])`: `profile`, with a `retained by` label
/// on those objects (Recorder#profile(retainers: ...)).
pub fn profile_retained(
    ruby: &Ruby,
    rb_self: &Recorder,
    paths: Vec<(i64, String)>,
) -> Result<RString, Error> {
    let encoded = encode(
        ruby,
        rb_self,
        None,
        None,
        &paths.into_iter().collect(),
        true,
    )?;
    Ok(ruby.str_from_slice(&encoded.bytes))
}

/// The live objects as a gzip pprof whose span is `start..end` (see `EncodeOptions`), with a
/// `retained by` label on the objects `retained_by` names, and the records and variances when
/// `uncertainty`; what `profile` returns, and what the exporter uploads (without them). Needs the
/// GVL; releases it to encode.
pub(crate) fn encode(
    ruby: &Ruby,
    rb_self: &Recorder,
    start: Option<SystemTime>,
    end: Option<SystemTime>,
    retained_by: &RetainedBy,
    uncertainty: bool,
) -> Result<EncodedPprof, Error> {
    with_session(ruby, rb_self, |session| {
        let mut snapshot = session.with_vm(ruby, |vm| session.core.prepare_iteration(vm))?;
        let notes = [
            session.sampler_note(),
            session.timer_note(),
            session.late_note(),
            session.budget_note(),
        ];
        for note in notes.into_iter().flatten() {
            snapshot.add_note(note);
        }
        snapshot.add_note(match session.take_full_gc_before_profile() {
            true => "datadog_heap: a full GC ran just before this profile: every object in it was \
                     reachable then"
                .into(),
            false => "datadog_heap: no full GC ran just before this profile: objects the program \
                      dropped since the last GC may still be listed (Recorder#profile(gc: true), \
                      the endpoint's ?gc=1)"
                .into(),
        });
        // The snapshot owns all it reads: the recorder may update again while it is encoded.
        let finished = session.core.finish_iteration();
        let options = EncodeOptions {
            // A sample stands for `sample_every` allocations on average, with either sampler;
            // the overhead budget may have raised the mean in force, which is what this says.
            sample_every: i64::try_from(session.sampler.effective(session.config).sample_every)
                .unwrap_or(i64::MAX),
            start,
            end,
            uncertainty,
        };
        // Not busy meanwhile: other threads allocate while the GVL is released, and none of it is
        // our own work.
        let encoded = runtime::not_busy(|| {
            without_gvl(
                |gvl_held| {
                    (
                        encode_profile_retained(&snapshot, &options, retained_by),
                        gvl_held,
                    )
                },
                None,
                IfRefused::RunWithGvl,
            )
        });
        let (encoded, gvl_held) = match encoded? {
            Some(result) => result,
            None => {
                return Err(heap_error(
                    ruby,
                    "internal error (Rust panic) while encoding the profile",
                ))
            }
        };
        session.set_last_encode_released_gvl(!gvl_held);
        finished.or_raise(ruby)?;
        encoded.or_raise(ruby)
    })
}
