//! The binary framing: preamble, header frame, event frames and the record prefix.
//!
//! `FORMAT.md` is the normative description; this module is its implementation. Everything here
//! is sans-IO: callers hand in byte slices and get bytes appended to a `Vec`.

use bincode::config::Config;
use bincode::enc::write::Writer;
use bincode::error::EncodeError;

use crate::error::TraceError;
use crate::event::*;
use crate::fastframe::{self, Sink};
use crate::fastread;
use crate::header::{Header, FORMAT_VERSION};
pub use crate::prefix::PrefixState;

/// The first eight bytes of every binary trace.
pub const MAGIC: [u8; 8] = *b"MEMTRACE";
/// Flag bit 0: the producer ran on a little-endian machine.
pub const FLAG_LITTLE_ENDIAN: u16 = 1 << 0;
/// Flag bit 1: the producer's pointers (addresses, handles, streams) are 64 bits wide.
pub const FLAG_POINTER_64: u16 = 1 << 1;
/// The flag bits format version 1 defines; the rest are reserved and must be zero.
pub const KNOWN_FLAGS: u16 = FLAG_LITTLE_ENDIAN | FLAG_POINTER_64;
/// Magic + version + flags.
pub const PREAMBLE_LEN: usize = 12;
/// The largest frame body a reader accepts. Larger lengths are corruption, not data: even a
/// segment state with a million blocks stays far below it.
pub const MAX_FRAME_LEN: u64 = 64 << 20;

/// Record prefix bit: a timestamp follows.
pub const PREFIX_HAS_TS: u8 = 1 << 0;
/// Record prefix bit: the timestamp is a zigzag delta from the previous timestamp.
pub const PREFIX_TS_DELTA: u8 = 1 << 1;
/// Record prefix bit: the record has a thread id.
pub const PREFIX_HAS_TID: u8 = 1 << 2;
/// Record prefix bit: the thread id equals the previous one (no bytes follow for it).
pub const PREFIX_TID_SAME: u8 = 1 << 3;
/// Record prefix bit: the record has a device ordinal.
pub const PREFIX_HAS_DEVICE: u8 = 1 << 4;
/// Record prefix bit: the device equals the previous one (no bytes follow for it).
pub const PREFIX_DEVICE_SAME: u8 = 1 << 5;
/// Record prefix bits reserved in version 1.
pub const PREFIX_RESERVED: u8 = 0xC0;

/// `Event::KernelLaunch`'s pinned tag, for [`encode_launch_frame`], which has no `Event` to ask
/// (the byte-for-byte tests against `Event::tag` keep it in step).
const LAUNCH_TAG: u8 = 4;

/// Bincode claims (container preallocations) are capped so that a garbage length inside a frame
/// cannot make the reader allocate without bound.
const DECODE_LIMIT: usize = 256 << 20;

pub(crate) fn encode_config() -> impl Config {
    bincode::config::standard()
}

fn decode_config() -> impl Config {
    bincode::config::standard().with_limit::<DECODE_LIMIT>()
}

/// The flag word this machine writes.
pub fn native_flags() -> u16 {
    let mut flags = 0;
    if cfg!(target_endian = "little") {
        flags |= FLAG_LITTLE_ENDIAN;
    }
    if cfg!(target_pointer_width = "64") {
        flags |= FLAG_POINTER_64;
    }
    flags
}

/// The 12-byte preamble.
pub fn preamble(version: u16, flags: u16) -> [u8; PREAMBLE_LEN] {
    let mut p = [0u8; PREAMBLE_LEN];
    p[..8].copy_from_slice(&MAGIC);
    p[8..10].copy_from_slice(&version.to_le_bytes());
    p[10..12].copy_from_slice(&flags.to_le_bytes());
    p
}

/// Checks a complete preamble; returns (version, flags).
pub fn check_preamble(p: &[u8; PREAMBLE_LEN]) -> Result<(u16, u16), TraceError> {
    if p[..8] != MAGIC {
        return Err(TraceError::BadMagic { found: p[..8].to_vec() });
    }
    let version = u16::from_le_bytes([p[8], p[9]]);
    let flags = u16::from_le_bytes([p[10], p[11]]);
    if version == 0 || version > FORMAT_VERSION {
        return Err(TraceError::UnsupportedVersion { found: version.into(), max: FORMAT_VERSION });
    }
    if flags & !KNOWN_FLAGS != 0 {
        return Err(TraceError::UnsupportedFlags { flags, reserved: flags & !KNOWN_FLAGS });
    }
    Ok((version, flags))
}

/// Appends `v` as an unsigned LEB128 varint.
#[inline]
pub fn put_uvarint(buf: &mut Vec<u8>, v: u64) {
    uvarint_into(buf, v);
}

#[inline(always)]
pub(crate) fn uvarint_into(out: &mut impl Sink, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Why a varint could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VarintError {
    /// The bytes ran out inside the varint.
    Incomplete,
    /// More than 64 bits (an 11th byte, or a 10th byte above 1).
    Overflow,
}

/// Reads an unsigned LEB128 varint from the start of `b`; returns the value and its length.
#[inline(always)]
pub fn get_uvarint(b: &[u8]) -> Result<(u64, usize), VarintError> {
    // Lengths, tags, thread and device ids and most timestamp deltas take one or two bytes:
    // those inline at every call, the rest out of line.
    match *b {
        [b0, ..] if b0 < 0x80 => Ok((u64::from(b0), 1)),
        [b0, b1, ..] if b1 < 0x80 => Ok((u64::from(b0 & 0x7f) | (u64::from(b1) << 7), 2)),
        _ => get_uvarint_long(b),
    }
}

#[inline(never)]
fn get_uvarint_long(b: &[u8]) -> Result<(u64, usize), VarintError> {
    let mut v: u64 = 0;
    for (i, &byte) in b.iter().enumerate().take(10) {
        if i == 9 && byte > 1 {
            return Err(VarintError::Overflow);
        }
        v |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Ok((v, i + 1));
        }
    }
    if b.len() >= 10 {
        Err(VarintError::Overflow)
    } else {
        Err(VarintError::Incomplete)
    }
}

/// Zigzag: small magnitudes of either sign become small unsigned numbers.
#[inline]
pub fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

/// Inverse of [`zigzag`].
#[inline]
pub fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

struct VecWriter<'a>(&'a mut Vec<u8>);

impl Writer for VecWriter<'_> {
    #[inline]
    fn write(&mut self, bytes: &[u8]) -> Result<(), EncodeError> {
        self.0.extend_from_slice(bytes);
        Ok(())
    }
}

fn bincode_into<T: bincode::Encode>(buf: &mut Vec<u8>, v: &T) -> Result<(), TraceError> {
    bincode::encode_into_writer(v, VecWriter(buf), encode_config())
        .map_err(|e| TraceError::Encode { what: "record".into(), message: e.to_string() })
}

/// Appends the header frame (varint length + bincode body). The header is written with
/// `format_version` = [`FORMAT_VERSION`] whatever the caller's value.
pub fn encode_header_frame(header: &Header, buf: &mut Vec<u8>) -> Result<(), TraceError> {
    let mut h = header.clone();
    h.format_version = FORMAT_VERSION;
    let mut body = Vec::with_capacity(256);
    bincode_into(&mut body, &h)?;
    put_uvarint(buf, body.len() as u64);
    buf.extend_from_slice(&body);
    Ok(())
}

/// Decodes a header frame body, ignoring trailing bytes a newer writer may have appended.
pub fn decode_header_body(body: &[u8], offset: u64) -> Result<Header, TraceError> {
    decode_header_extended(body, offset).map(|(h, _)| h)
}

/// [`decode_header_body`], also saying whether the body held bytes after the fields this
/// version reads (a newer writer's, ignored).
pub(crate) fn decode_header_extended(body: &[u8], offset: u64) -> Result<(Header, bool), TraceError> {
    bincode::decode_from_slice::<Header, _>(body, decode_config())
        .map(|(h, read)| (h, read < body.len()))
        .map_err(|e| TraceError::CorruptFrame { offset, reason: format!("header body does not decode: {}", why(&e)) })
}

/// A decode error in words: bincode's own `Display` is its `Debug` (`Utf8 { inner: ... }`).
fn why(e: &bincode::error::DecodeError) -> String {
    use bincode::error::DecodeError as E;
    match e {
        E::UnexpectedEnd { .. } => "the body ends before its last field".into(),
        E::LimitExceeded => "a length past the decoder's limit".into(),
        E::Utf8 { inner } => format!("a string is not UTF-8 ({inner})"),
        E::UnexpectedVariant { type_name, found, .. } => {
            format!("{found} is not a known value of {}", type_name.rsplit("::").next().unwrap_or(type_name))
        }
        E::InvalidBooleanValue(v) => format!("{v} is not a boolean (0 or 1)"),
        E::InvalidCharEncoding(b) => format!("{b:?} is not a character"),
        E::OutsideUsizeRange(v) => format!("{v} does not fit this machine's usize"),
        E::InvalidIntegerType { expected, found: bincode::error::IntegerType::Reserved } => {
            format!("a reserved integer marker byte where a {} belongs", format!("{expected:?}").to_lowercase())
        }
        E::InvalidIntegerType { expected, found } => format!(
            "a {} where a {} belongs",
            format!("{found:?}").to_lowercase(),
            format!("{expected:?}").to_lowercase()
        ),
        other => format!("{other:?}"),
    }
}

/// Appends one event frame for `rec` and advances the delta state. On error `buf` and the state
/// are unchanged.
pub fn encode_frame(state: &mut PrefixState, rec: &Record, buf: &mut Vec<u8>) -> Result<(), TraceError> {
    let (tag, ts, tid, dev) = (rec.event.tag(), rec.ts_ns, rec.tid, rec.device);
    // The frames written by the million have hand-written encoders (`fastframe`).
    macro_rules! fast {
        ($body:path, $ev:expr) => {{
            let mut s = fastframe::Spare::begin(tag, buf);
            state.encode(ts, tid, dev, &mut s);
            $body(&mut s, $ev);
            s.finish();
        }};
    }
    match &rec.event {
        Event::KernelLaunch(l) => fast!(fastframe::launch, l),
        Event::Alloc(a) => fast!(fastframe::alloc, a),
        Event::Free(f) => fast!(fastframe::free, f),
        _ => return encode_frame_generic(state, rec, buf),
    }
    state.commit(ts, tid, dev);
    Ok(())
}

/// The frame [`encode_frame`] writes for a `Record` holding `Event::KernelLaunch(l)`, without
/// the record: a producer that writes launches by the million need not build and drop one each.
#[inline(always)]
pub fn encode_launch_frame(
    state: &mut PrefixState,
    ts_ns: Option<u64>,
    tid: Option<u32>,
    device: Option<u32>,
    l: &KernelLaunch,
    buf: &mut Vec<u8>,
) {
    let mut s = fastframe::Spare::begin(LAUNCH_TAG, buf);
    state.encode(ts_ns, tid, device, &mut s);
    fastframe::launch(&mut s, l);
    s.finish();
    state.commit(ts_ns, tid, device);
}

/// [`encode_frame`] for every kind, through bincode's derived encoders. Public only so that the
/// integration tests can check the hand-written encoders against it byte for byte.
#[doc(hidden)]
pub fn encode_frame_generic(state: &mut PrefixState, rec: &Record, buf: &mut Vec<u8>) -> Result<(), TraceError> {
    let start = buf.len();
    buf.push(rec.event.tag());
    buf.push(0); // length placeholder; most bodies fit one varint byte
    let body_start = buf.len();
    state.encode(rec.ts_ns, rec.tid, rec.device, buf);
    if let Err(e) = encode_event(&rec.event, buf) {
        buf.truncate(start);
        return Err(e);
    }
    let body_len = buf.len() - body_start;
    if body_len < 0x80 {
        buf[start + 1] = body_len as u8;
    } else {
        let mut len = Vec::with_capacity(10);
        put_uvarint(&mut len, body_len as u64);
        buf.splice(start + 1..start + 2, len);
    }
    state.commit(rec.ts_ns, rec.tid, rec.device);
    Ok(())
}

fn encode_event(ev: &Event, buf: &mut Vec<u8>) -> Result<(), TraceError> {
    match ev {
        Event::Alloc(v) => bincode_into(buf, v),
        Event::Free(v) => bincode_into(buf, v),
        Event::Vmm(v) => bincode_into(buf, v),
        Event::KernelLaunch(v) => bincode_into(buf, v),
        Event::KernelExec(v) => bincode_into(buf, v),
        Event::MemInfo(v) => bincode_into(buf, v),
        Event::Marker(v) => bincode_into(buf, v),
        Event::Name(v) => bincode_into(buf, v),
        Event::Stack(v) => bincode_into(buf, v),
        Event::Oom(v) => bincode_into(buf, v),
        Event::Control(v) => bincode_into(buf, v),
        Event::PoolTrim(v) => bincode_into(buf, v),
        Event::SegmentState(v) => bincode_into(buf, v),
        Event::SnapshotPoint(v) => bincode_into(buf, v),
        Event::ProcessExit(v) => bincode_into(buf, v),
        Event::MemActivity(v) => bincode_into(buf, v),
    }
}

/// What one frame held.
#[derive(Debug, Clone, PartialEq)]
pub enum Decoded {
    /// A record of a kind this version knows.
    Record(Record),
    /// A frame with a tag this version does not know; skipped.
    Unknown {
        /// Its tag.
        tag: u8,
    },
}

/// Decodes an event struct; trailing bytes are fields a newer writer appended (FORMAT.md §1.9):
/// ignored by design, and counted in `extended` so that the reader can say so.
fn body<T: bincode::Decode<()>>(bytes: &[u8], kind: &str, offset: u64, extended: &mut u64) -> Result<T, TraceError> {
    bincode::decode_from_slice::<T, _>(bytes, decode_config())
        .map(|(v, read)| {
            *extended += u64::from(read < bytes.len());
            v
        })
        .map_err(|e| TraceError::CorruptFrame { offset, reason: format!("{kind} body does not decode: {}", why(&e)) })
}

/// A frame whose record prefix does not decode; a second trace's magic read as a frame (tag
/// `M`, length `E`, a body from `MTRACE` on: two traces concatenated) is named as such.
#[cold]
fn prefix_error(tag: u8, body: &[u8], offset: u64, reason: String) -> TraceError {
    if tag == MAGIC[0] && body.starts_with(&MAGIC[2..]) {
        return TraceError::SecondHeader { offset };
    }
    TraceError::CorruptFrame { offset, reason }
}

/// Decodes one frame body (everything after tag and length). `offset` is the frame's byte offset,
/// used in errors.
#[inline]
pub fn decode_frame(state: &mut PrefixState, tag: u8, bytes: &[u8], offset: u64) -> Result<Decoded, TraceError> {
    decode_frame_with(state, tag, bytes, bytes.len(), true, offset, &mut 0)
}

/// [`decode_frame`] through the derived decoders only, never the hand-written fast path: what the
/// fast path is tested against (`tests/it/fastread.rs`).
pub fn decode_frame_generic(
    state: &mut PrefixState,
    tag: u8,
    bytes: &[u8],
    offset: u64,
) -> Result<Decoded, TraceError> {
    decode_frame_with(state, tag, bytes, bytes.len(), false, offset, &mut 0)
}

/// [`decode_frame`] of the body `following[..len]`, where `following` is the input from the
/// body's start on: the hand-written decoders (`fast`) read through a fixed window of it, which
/// may run past the body. Without `fast`, the derived decoders only. A known kind's body with
/// bytes after its fields adds 1 to `extended`.
#[inline(always)]
pub(crate) fn decode_frame_with(
    state: &mut PrefixState,
    tag: u8,
    following: &[u8],
    len: usize,
    fast: bool,
    offset: u64,
    extended: &mut u64,
) -> Result<Decoded, TraceError> {
    if tag == 0 {
        return Err(TraceError::CorruptFrame { offset, reason: "tag 0 is invalid (tags start at 1)".into() });
    }
    let bytes = &following[..len];
    let prefix = state.decode(bytes).map_err(|reason| prefix_error(tag, bytes, offset, reason))?;
    let rest = &bytes[prefix.len..];
    let fast = fast.then(|| (&following[prefix.len..], rest.len()));
    let event = match tag {
        // The hot kinds go through `fastread`, and through the derived decoder only when it
        // declines (which then names what is wrong).
        1 => Event::Alloc(match fast.and_then(|(f, len)| fastread::alloc(f, len, extended)) {
            Some(a) => a,
            None => body(rest, "alloc", offset, extended)?,
        }),
        2 => Event::Free(match fast.and_then(|(f, len)| fastread::free(f, len, extended)) {
            Some(f) => f,
            None => body(rest, "free", offset, extended)?,
        }),
        3 => Event::Vmm(body(rest, "vmm", offset, extended)?),
        4 => Event::KernelLaunch(match fast.and_then(|(f, len)| fastread::launch(f, len, extended)) {
            Some(l) => l,
            None => body(rest, "launch", offset, extended)?,
        }),
        5 => Event::KernelExec(body(rest, "kernel_exec", offset, extended)?),
        6 => Event::MemInfo(body(rest, "mem_info", offset, extended)?),
        7 => Event::Marker(body(rest, "marker", offset, extended)?),
        8 => Event::Name(body(rest, "name", offset, extended)?),
        9 => Event::Stack(body(rest, "stack", offset, extended)?),
        10 => Event::Oom(body(rest, "oom", offset, extended)?),
        11 => Event::Control(body(rest, "control", offset, extended)?),
        12 => Event::PoolTrim(body(rest, "pool_trim", offset, extended)?),
        13 => Event::SegmentState(body(rest, "segment_state", offset, extended)?),
        14 => Event::SnapshotPoint(body(rest, "snapshot_point", offset, extended)?),
        15 => Event::ProcessExit(body(rest, "process_exit", offset, extended)?),
        16 => Event::MemActivity(body(rest, "mem_activity", offset, extended)?),
        tag => return Ok(Decoded::Unknown { tag }),
    };
    Ok(Decoded::Record(Record { ts_ns: prefix.ts, tid: prefix.tid, device: prefix.device, event }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints() {
        let check = |v: u64, expect: &[u8]| {
            let mut b = Vec::new();
            put_uvarint(&mut b, v);
            assert_eq!(b, expect, "encoding {v}");
            assert_eq!(get_uvarint(&b), Ok((v, expect.len())), "decoding {v}");
            assert_eq!(get_uvarint(&b[..b.len() - 1]), Err(VarintError::Incomplete), "prefix of {v}");
        };
        check(0, &[0]);
        check(127, &[0x7f]);
        check(128, &[0x80, 0x01]);
        check(300, &[0xac, 0x02]);
        check(u64::MAX, &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]);
        assert_eq!(
            get_uvarint(&[0xff; 9].iter().chain(&[0x02]).copied().collect::<Vec<_>>()),
            Err(VarintError::Overflow)
        );
        assert_eq!(get_uvarint(&[0x80; 11]), Err(VarintError::Overflow));
    }

    /// The worked example of FORMAT.md §1.8, byte for byte.
    #[test]
    fn format_md_worked_example() {
        let rec = |ts, event| Record { ts_ns: Some(ts), tid: Some(7), device: Some(0), event };
        let mut state = PrefixState::default();
        let mut buf = Vec::new();
        encode_frame(&mut state, &rec(1000, Event::MemInfo(MemInfo { free: 0, total: 0 })), &mut buf).unwrap();
        buf.clear();
        let launch = KernelLaunch::succeeded(crate::Api::__CudaLaunchKernel, Some(5), [128, 1, 1], [256, 1, 1], 0);
        encode_frame(&mut state, &rec(1250, Event::KernelLaunch(launch)), &mut buf).unwrap();
        let expect = [
            0x04, 0x11, 0x3F, 0xF4, 0x03, 0x62, 0x01, 0x05, 0x80, 0x01, 0x01, 0xFB, 0x00, 0x01, 0x01, 0x01, 0x00, 0x00,
            0x00,
        ];
        assert_eq!(buf, expect);
    }

    #[test]
    fn zigzag_values() {
        for (v, z) in [(0i64, 0u64), (-1, 1), (1, 2), (-2, 3), (i64::MAX, u64::MAX - 1), (i64::MIN, u64::MAX)] {
            assert_eq!(zigzag(v), z);
            assert_eq!(unzigzag(z), v);
        }
    }

    #[test]
    fn prefix_deltas_and_same_bits() {
        let ev = Event::MemInfo(MemInfo { free: 1, total: 2 });
        let recs = [
            Record { ts_ns: Some(1000), tid: Some(7), device: Some(0), event: ev.clone() },
            Record { ts_ns: Some(900), tid: Some(7), device: None, event: ev.clone() },
            Record { ts_ns: None, tid: Some(8), device: Some(0), event: ev.clone() },
            Record { ts_ns: Some(u64::MAX), tid: None, device: Some(1), event: ev.clone() },
        ];
        let mut enc = PrefixState::default();
        let mut dec = PrefixState::default();
        let mut prefixes = Vec::new();
        for r in &recs {
            let mut buf = Vec::new();
            encode_frame(&mut enc, r, &mut buf).unwrap();
            prefixes.push(buf[2]);
            match decode_frame(&mut dec, buf[0], &buf[2..], 0).unwrap() {
                Decoded::Record(got) => assert_eq!(&got, r),
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(
            prefixes,
            [
                PREFIX_HAS_TS | PREFIX_HAS_TID | PREFIX_HAS_DEVICE,
                PREFIX_HAS_TS | PREFIX_TS_DELTA | PREFIX_HAS_TID | PREFIX_TID_SAME,
                PREFIX_HAS_TID | PREFIX_HAS_DEVICE | PREFIX_DEVICE_SAME,
                PREFIX_HAS_TS | PREFIX_TS_DELTA | PREFIX_HAS_DEVICE,
            ]
        );
    }
}
