//! What a batch read turns records into ([`MapRecord`]), and the path that hands the hot kinds
//! (allocations and frees) to it field by field, with no [`Record`] built around them.
//!
//! Why: a replay's decoding thread sorts each record into a small step and drops the rest. A
//! record built only to be taken apart again is 112 bytes written and moved twice per record
//! (docs/benchmarks.md, twenty-fifth session).

use super::summary::{note_api, Stops};
use crate::api::Api;
use crate::codec::{self, PrefixState, MAX_FRAME_LEN};
use crate::event::{Alloc, Event, Free, Record};
use crate::fastread;

/// Turns each record of [`Reader::next_records_with`](super::Reader::next_records_with) into an
/// item. [`record`](Self::record) takes every record; [`alloc`](Self::alloc) and
/// [`free`](Self::free) take the allocations and frees the fast decoder reads (most of them), as
/// their prefix and body, and by default build the record and hand it to `record`. A mapper that
/// overrides them must map them as `record` maps the record they make. Every `FnMut(Record) -> T`
/// is one.
pub trait MapRecord<T> {
    /// The item of a record.
    fn record(&mut self, r: Record) -> T;

    /// The item of the record `Record { ts_ns, tid, device, event: Event::Alloc(a) }`.
    #[inline(always)]
    fn alloc(&mut self, ts_ns: Option<u64>, tid: Option<u32>, device: Option<u32>, a: Alloc) -> T {
        self.record(Record { ts_ns, tid, device, event: Event::Alloc(a) })
    }

    /// The item of the record `Record { ts_ns, tid, device, event: Event::Free(f) }`.
    #[inline(always)]
    fn free(&mut self, ts_ns: Option<u64>, tid: Option<u32>, device: Option<u32>, f: Free) -> T {
        self.record(Record { ts_ns, tid, device, event: Event::Free(f) })
    }
}

impl<T, F: FnMut(Record) -> T> MapRecord<T> for F {
    #[inline(always)]
    fn record(&mut self, r: Record) -> T {
        self(r)
    }
}

/// Hands `emit` the item of the frame with tag `tag` and body `following[..len]` (`following`:
/// the input from the body on) when it is an allocation or a free with a common prefix that the
/// fast decoder reads; the prefix state advances and its API is noted in `stops`. `false`
/// otherwise, with the state as it was: the general decoder then reads the frame.
// The decoding loop's own state, passed apart (inlined into it, each stays where the loop keeps it).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(super) fn map_hot<T>(
    state: &mut PrefixState,
    tag: u8,
    following: &[u8],
    len: usize,
    extended: &mut u64,
    stops: &mut Stops,
    map: &mut impl MapRecord<T>,
    emit: &mut impl FnMut(T),
) -> bool {
    if tag != 1 && tag != 2 {
        return false;
    }
    let before = state.ts;
    let Some(p) = state.decode_common(&following[..len]) else { return false };
    let (body, left) = (&following[p.len..], len - p.len);
    let api: Api;
    // Two arms written out, not one `Option` of (api, item) mapped from either decoder: that
    // fold keeps the item from being built where `emit` stores it (+28 M instructions on the
    // benchmark replay's decoding thread, 299.5 → 327.3 M).
    let item = if tag == 1 {
        match fastread::alloc(body, left, extended) {
            Some(a) => {
                api = a.api;
                map.alloc(p.ts, p.tid, p.device, a)
            }
            None => {
                state.ts = before;
                return false;
            }
        }
    } else {
        match fastread::free(body, left, extended) {
            Some(f) => {
                api = f.api;
                map.free(p.ts, p.tid, p.device, f)
            }
            None => {
                state.ts = before;
                return false;
            }
        }
    };
    note_api(api, stops);
    emit(item);
    true
}

/// The frame at the start of `buf` when it is whole: its tag, where its body starts (after the
/// tag and the length varint) and the body's length. `None` when it is not whole or not well
/// formed (tag 0, a length too large): the general path reads those and says what is wrong.
#[inline(always)]
pub(super) fn whole_frame(buf: &[u8]) -> Option<(u8, usize, usize)> {
    let (&tag, rest) = buf.split_first()?;
    if tag == 0 {
        return None;
    }
    let (len, n) = codec::get_uvarint(rest).ok()?;
    if len > MAX_FRAME_LEN {
        return None;
    }
    rest.get(n..n + len as usize)?;
    Some((tag, 1 + n, len as usize))
}

/// The offset in `frames` (whole frames, decoded from `state`) of the first whose body has bytes
/// after the fields this version reads: a batch counts them without looking for where, and one
/// that has some asks here, once.
#[cold]
pub(super) fn first_extended(mut state: PrefixState, frames: &[u8]) -> Option<usize> {
    let mut used = 0;
    while let Some((tag, at, len)) = whole_frame(&frames[used..]) {
        let mut extended = 0;
        let decoded = codec::decode_frame_with(&mut state, tag, &frames[used + at..], len, true, 0, &mut extended);
        if decoded.is_err() || extended > 0 {
            return decoded.is_ok().then_some(used);
        }
        used += at + len;
    }
    None
}
