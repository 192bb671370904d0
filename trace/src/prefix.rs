//! The record prefix every frame starts with: timestamp, thread and device, each delta-coded
//! against the previous frame's (FORMAT.md §1.4).

use crate::codec::{
    get_uvarint, unzigzag, uvarint_into, zigzag, VarintError, PREFIX_DEVICE_SAME, PREFIX_HAS_DEVICE, PREFIX_HAS_TID,
    PREFIX_HAS_TS, PREFIX_RESERVED, PREFIX_TID_SAME, PREFIX_TS_DELTA,
};
use crate::fastframe::Sink;

/// The delta state shared by consecutive record prefixes: the last timestamp, thread and device
/// any frame (known tag or not) carried.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PrefixState {
    pub(crate) ts: Option<u64>,
    pub(crate) tid: Option<u32>,
    pub(crate) device: Option<u32>,
}

impl PrefixState {
    #[inline(always)]
    pub(crate) fn encode(&self, ts_ns: Option<u64>, tid: Option<u32>, device: Option<u32>, buf: &mut impl Sink) {
        let flags_at = buf.len();
        buf.push(0);
        let mut flags = 0u8;
        if let Some(ts) = ts_ns {
            flags |= PREFIX_HAS_TS;
            match self.ts {
                Some(prev) => {
                    flags |= PREFIX_TS_DELTA;
                    uvarint_into(buf, zigzag(ts.wrapping_sub(prev) as i64));
                }
                None => uvarint_into(buf, ts),
            }
        }
        encode_same(tid, PREFIX_HAS_TID, PREFIX_TID_SAME, self.tid, &mut flags, buf);
        encode_same(device, PREFIX_HAS_DEVICE, PREFIX_DEVICE_SAME, self.device, &mut flags, buf);
        buf.set(flags_at, flags);
    }

    pub(crate) fn commit(&mut self, ts: Option<u64>, tid: Option<u32>, device: Option<u32>) {
        if ts.is_some() {
            self.ts = ts;
        }
        if tid.is_some() {
            self.tid = tid;
        }
        if device.is_some() {
            self.device = device;
        }
    }

    /// Parses a prefix and advances the state.
    #[inline(always)]
    pub(crate) fn decode(&mut self, body: &[u8]) -> Result<Prefix, String> {
        self.decode_common(body).map_or_else(|| self.decode_checked(body), Ok)
    }

    /// The prefixes a trace is made of, read straight: a timestamp delta, and a thread and
    /// device that are absent or the same as before. `None` for anything else (the checked
    /// path reads it, or names what is wrong); the state is then unchanged.
    #[inline(always)]
    pub(crate) fn decode_common(&mut self, body: &[u8]) -> Option<Prefix> {
        let (&flags, rest) = body.split_first()?;
        // One table lookup says the flags are of this shape; a thread or device is then either
        // absent or the one before, so the state keeps it.
        if !COMMON_FLAGS[usize::from(flags)] {
            return None;
        }
        let tid = if flags & PREFIX_HAS_TID != 0 { Some(self.tid?) } else { None };
        let device = if flags & PREFIX_HAS_DEVICE != 0 { Some(self.device?) } else { None };
        let (raw, n) = get_uvarint(rest).ok()?;
        let ts = self.ts?.wrapping_add(unzigzag(raw) as u64);
        self.ts = Some(ts);
        Some(Prefix { ts: Some(ts), tid, device, len: 1 + n })
    }

    #[cold]
    fn decode_checked(&mut self, body: &[u8]) -> Result<Prefix, String> {
        let Some(&flags) = body.first() else {
            return Err("empty frame body (the record prefix byte is missing)".into());
        };
        if flags & PREFIX_RESERVED != 0 {
            return Err(format!("record prefix byte {flags:#04x} sets reserved bits {PREFIX_RESERVED:#04x}"));
        }
        let mut pos = 1;
        let mut next = |what: &str| -> Result<u64, String> {
            let (v, n) = get_uvarint(&body[pos..]).map_err(|e| match e {
                VarintError::Incomplete => format!("frame body ends inside the {what} varint"),
                VarintError::Overflow => format!("{what} varint exceeds 64 bits"),
            })?;
            pos += n;
            Ok(v)
        };
        let ts = if flags & PREFIX_HAS_TS != 0 {
            let raw = next("timestamp")?;
            if flags & PREFIX_TS_DELTA != 0 {
                let prev = self.ts.ok_or("timestamp delta with no earlier timestamp in the trace")?;
                Some(prev.wrapping_add(unzigzag(raw) as u64))
            } else {
                Some(raw)
            }
        } else if flags & PREFIX_TS_DELTA != 0 {
            return Err("timestamp-delta bit set without the has-timestamp bit".into());
        } else {
            None
        };
        let tid = decode_same(flags, PREFIX_HAS_TID, PREFIX_TID_SAME, self.tid, "thread id", &mut next)?;
        let device = decode_same(flags, PREFIX_HAS_DEVICE, PREFIX_DEVICE_SAME, self.device, "device", &mut next)?;
        self.commit(ts, tid, device);
        Ok(Prefix { ts, tid, device, len: pos })
    }
}

/// Which flag bytes `decode_common` reads: a timestamp delta, and a thread and a device each
/// either absent or the same as before (no reserved bit).
static COMMON_FLAGS: [bool; 256] = {
    const fn same(flags: u8, has: u8, same: u8) -> bool {
        (flags & has == 0) == (flags & same == 0)
    }
    const fn common(flags: u8) -> bool {
        flags
            & !(PREFIX_HAS_TS
                | PREFIX_TS_DELTA
                | PREFIX_HAS_TID
                | PREFIX_TID_SAME
                | PREFIX_HAS_DEVICE
                | PREFIX_DEVICE_SAME)
            == 0
            && flags & (PREFIX_HAS_TS | PREFIX_TS_DELTA) == (PREFIX_HAS_TS | PREFIX_TS_DELTA)
            && same(flags, PREFIX_HAS_TID, PREFIX_TID_SAME)
            && same(flags, PREFIX_HAS_DEVICE, PREFIX_DEVICE_SAME)
    }
    let mut table = [false; 256];
    let mut i = 0;
    while i < 256 {
        table[i] = common(i as u8);
        i += 1;
    }
    table
};

/// A decoded record prefix.
pub(crate) struct Prefix {
    pub(crate) ts: Option<u64>,
    pub(crate) tid: Option<u32>,
    pub(crate) device: Option<u32>,
    /// Bytes it took.
    pub(crate) len: usize,
}

/// Writes a thread or device that may be the same as the previous frame's (the counterpart of
/// [`decode_same`]): nothing when absent; else sets `has` in `flags`, and `same` too when it
/// equals `prev`, or otherwise appends the value as a varint. Kept in this shape (flags by
/// reference, set in the order the inline code set them) so the writer's machine code is
/// unchanged.
#[inline(always)]
fn encode_same(value: Option<u32>, has: u8, same: u8, prev: Option<u32>, flags: &mut u8, buf: &mut impl Sink) {
    if let Some(v) = value {
        *flags |= has;
        if prev == Some(v) {
            *flags |= same;
        } else {
            uvarint_into(buf, u64::from(v));
        }
    }
}

fn decode_same(
    flags: u8,
    has: u8,
    same: u8,
    prev: Option<u32>,
    what: &str,
    next: &mut impl FnMut(&str) -> Result<u64, String>,
) -> Result<Option<u32>, String> {
    match (flags & has != 0, flags & same != 0) {
        (false, false) => Ok(None),
        (false, true) => Err(format!("{what}-same bit set without the has-{what} bit")),
        (true, true) => prev.map(Some).ok_or_else(|| format!("{what} marked same as previous, but none came before")),
        (true, false) => {
            let v = next(what)?;
            u32::try_from(v).map(Some).map_err(|_| format!("{what} {v} does not fit in 32 bits"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The read for common flag bytes gives what the checked read gives, in value and state, for
    /// every flag byte, every state a trace can be in and timestamps of every varint length.
    #[test]
    fn the_common_read_equals_the_checked_read() {
        let states = [
            PrefixState::default(),
            PrefixState { ts: Some(1_000), tid: None, device: None },
            PrefixState { ts: Some(u64::MAX - 3), tid: Some(7), device: None },
            PrefixState { ts: Some(5), tid: None, device: Some(1) },
            PrefixState { ts: Some(9_999_999), tid: Some(u32::MAX), device: Some(0) },
        ];
        let tails: [&[u8]; 6] = [&[], &[0x05], &[0x85, 0x01, 0x07], &[0xff; 11], &[0x80], &[0x03, 0x02, 0x01]];
        let (mut common, mut both) = (0, 0);
        for flags in 0..=255u8 {
            for state in &states {
                for tail in tails {
                    let body = [&[flags][..], tail].concat();
                    let (mut fast, mut checked) = (state.clone(), state.clone());
                    let got = fast.decode(&body);
                    let want = checked.decode_checked(&body);
                    let view = |p: Result<Prefix, String>| p.map(|p| (p.ts, p.tid, p.device, p.len));
                    let what = format!("flags {flags:#04x}, state {state:?}, tail {tail:?}");
                    assert_eq!(view(got), view(want), "{what}");
                    assert_eq!(fast, checked, "state after {what}");
                    if COMMON_FLAGS[usize::from(flags)] {
                        common += 1;
                        both += usize::from(state.clone().decode_common(&body).is_some());
                    }
                }
            }
        }
        // The common read took part: all four flag bytes it reads, on the states that allow it.
        assert_eq!(common, 4 * states.len() * tails.len());
        assert!(both > 0);
    }
}
