//! What a capture hands in before anything is named: the VM's frame handles, as keys. A
//! [`FrameKey`] is one frame's handles (for the frame cache), a [`StackHandles`] a whole stack's
//! (for the stack cache). Equal keys in one epoch (the period the caller's handles are stable in)
//! must name equal frames; the caches rely on that and on nothing else.

/// One frame's handles, its raw identity (nothing named yet): equal keys in one epoch must name
/// equal frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FrameKey {
    /// The frame handle (a VALUE in the binding).
    pub handle: u64,
    /// Whatever else its name or location depends on (the binding: for a C frame, the handle of
    /// the Ruby frame whose file it takes; 0 otherwise).
    pub locator: u64,
    pub line: i32,
}

/// Locators up to this one are sentinels (0: the frame is where it is; 1: no Ruby frame to
/// locate it at), not frame handles.
pub const LAST_SENTINEL_LOCATOR: u64 = 1;

/// One captured stack's handles, its raw identity (nothing named yet). Equal keys in one epoch
/// must resolve to equal frames.
#[derive(Debug, Clone, Copy)]
pub struct StackHandles<'a> {
    /// Opaque frame handles, innermost first (VALUEs in the binding).
    pub frames: &'a [u64],
    /// One line number per handle.
    pub lines: &'a [i32],
    /// Whatever else the resolved frames depend on (the binding: `max_frames`).
    pub salt: u64,
    /// The period in which the handles are stable (the binding: the recorder's `handle_epoch`).
    pub epoch: u64,
}

impl StackHandles<'_> {
    /// The key's two independent 64-bit hashes, `(slot, check)`, in one pass over its frames:
    /// the first picks the set, the second must agree too before a slot matches.
    ///
    /// Each hash runs four lanes, frame `i` going to lane `i % 4`, so the processor works on
    /// eight independent multiplications at a time instead of waiting on one chain (on a Rails
    /// stack of 120 frames: about 120 ns, where two single-chain passes took about 490). A step
    /// is a folded 64×64→128-bit multiplication of the lane (xored with the handle) by the line
    /// (xored with a constant), so handle and line each reach every bit of the lane. The lanes
    /// start from the salt and the length, each from its own constant, and are folded together in
    /// order at the end.
    fn hashes(&self) -> (u64, u64) {
        const SLOT: [u64; 4] = [
            0x243f_6a88_85a3_08d3,
            0x1319_8a2e_0370_7344,
            0xa409_3822_299f_31d0,
            0x082e_fa98_ec4e_6c89,
        ];
        const CHECK: [u64; 4] = [
            0x4528_21e6_38d0_1377,
            0xbe54_66cf_34e9_0c6c,
            0xc0ac_29b7_c97c_50dd,
            0x3f84_d5b5_b547_0917,
        ];
        const LINE_SLOT: u64 = 0x9216_d5d9_8979_fb1b;
        const LINE_CHECK: u64 = 0xd131_0ba6_98df_b5ac;
        let fold = |x: u64, y: u64| {
            let p = u128::from(x).wrapping_mul(u128::from(y));
            (p as u64) ^ ((p >> 64) as u64)
        };
        let seed = self.salt ^ (self.frames.len() as u64).rotate_left(32);
        let mut slot = SLOT.map(|c| c ^ seed);
        let mut check = CHECK.map(|c| c ^ seed.rotate_left(29));
        let n = self.frames.len().min(self.lines.len());
        let (frames, lines) = (&self.frames[..n], &self.lines[..n]);
        let mut step = |lane: usize, frame: u64, line: i32| {
            let line = u64::from(line as u32);
            slot[lane] = fold(slot[lane] ^ frame, line ^ LINE_SLOT);
            check[lane] = fold(check[lane] ^ frame, line ^ LINE_CHECK);
        };
        let (frame_quads, line_quads) = (frames.chunks_exact(4), lines.chunks_exact(4));
        let tail = frame_quads.remainder().iter().zip(line_quads.remainder());
        for (f, l) in frame_quads.zip(line_quads) {
            for lane in 0..4 {
                step(lane, f[lane], l[lane]);
            }
        }
        for (lane, (&f, &l)) in tail.enumerate() {
            step(lane, f, l);
        }
        let finish = |lanes: [u64; 4], k: u64| {
            lanes
                .iter()
                .fold(k, |h, &lane| fold(h ^ lane, k.rotate_left(17) | 1))
        };
        (finish(slot, LINE_CHECK), finish(check, LINE_SLOT))
    }
}

/// A key with its two hashes (`StackHandles::hashes`), computed once for a lookup and for the
/// insert that follows a miss.
#[derive(Debug, Clone, Copy)]
pub struct HashedKey<'a> {
    pub key: StackHandles<'a>,
    pub(crate) hashes: (u64, u64),
}

impl<'a> From<StackHandles<'a>> for HashedKey<'a> {
    fn from(key: StackHandles<'a>) -> Self {
        HashedKey {
            key,
            hashes: key.hashes(),
        }
    }
}

/// Test aid: a key over `frames` and `lines` with a fixed salt (the stack cache's tests use it
/// too).
#[cfg(test)]
pub(crate) fn stack_handles<'a>(
    frames: &'a [u64],
    lines: &'a [i32],
    epoch: u64,
) -> StackHandles<'a> {
    StackHandles {
        frames,
        lines,
        salt: 400,
        epoch,
    }
}

#[cfg(test)]
mod tests {
    use super::stack_handles;

    #[test]
    fn near_identical_stacks_differ_in_both_hashes() {
        // A Rails-deep stack and every small change a program makes to one: a line moved, a
        // handle changed, two frames swapped (in one lane or across lanes), a frame gone, or a
        // handle and a line trading bits. Each must differ from all the others in each hash.
        let frames: Vec<u64> = (0..120)
            .map(|i| 0x7f3a_0000_0000 + 40 * (i * 7 % 120))
            .collect();
        let lines: Vec<i32> = (0..120).map(|i| 10 + 3 * i).collect();
        let mut variants = vec![(frames.clone(), lines.clone())];
        for i in 0..120 {
            let mut l = lines.clone();
            l[i] += 1;
            variants.push((frames.clone(), l));
            let mut f = frames.clone();
            f[i] += 40;
            variants.push((f, lines.clone()));
            let mut f = frames.clone();
            f[i] ^= 1 << 48;
            let mut l = lines.clone();
            l[i] ^= 1;
            variants.push((f, l));
            for apart in [1, 4] {
                if i + apart < 120 {
                    let (mut f, mut l) = (frames.clone(), lines.clone());
                    f.swap(i, i + apart);
                    l.swap(i, i + apart);
                    variants.push((f, l));
                }
            }
            variants.push((frames[..i].to_vec(), lines[..i].to_vec()));
        }
        let mut slots = std::collections::HashSet::new();
        let mut checks = std::collections::HashSet::new();
        for (f, l) in &variants {
            let (slot, check) = stack_handles(f, l, 0).hashes();
            assert!(slots.insert(slot), "slot hash repeated");
            assert!(checks.insert(check), "check hash repeated");
        }
        assert_eq!(slots.len(), variants.len());
    }
}
