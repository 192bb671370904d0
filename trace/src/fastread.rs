//! Hand-written decoders for the frames replay and stats read by the million: allocations,
//! frees and kernel launches. The read-side mirror of `fastframe`: they accept exactly what the
//! writers produce (bincode `standard()` varints, unit enums as variant indices, `Option` as a
//! 0/1 byte) and return `None` for anything else, unusual or wrong, which then goes through the
//! generic derived decoder, the one that names what is wrong. `tests/it/fastread.rs` checks that
//! both paths decode generated frames to equal values, alone and followed by other bytes (the
//! decoders read through a fixed window that runs past the body, see `Cursor`).

use crate::api::Api;
use crate::event::{Alloc, Category, Free, FreeStage, KernelLaunch, MemoryKind, Origin};

/// How many bytes a hot kind's fields take at the most: ten varints of at most nine bytes, or
/// fewer and smaller (a free: 63). A cursor never reads past this many.
const MOST: usize = 64;
/// The window a cursor reads from: `MOST` bytes and room for a last eight-byte field.
const WINDOW: usize = MOST + 8;

/// A read position in a frame body, over a fixed window that starts with the body: the bytes
/// after the body, or zeros when the input ends sooner. Reads take no bounds checks (the window
/// is larger than any body the decoders read); whether they stayed inside the body is checked
/// once, at the end (`decode`). Trailing bytes are fields a newer writer appended: ignored, as
/// the generic path ignores them.
struct Cursor<'a> {
    b: &'a [u8; WINDOW],
    pos: usize,
}

impl Cursor<'_> {
    #[inline(always)]
    fn byte(&mut self) -> Option<u8> {
        // `pos` stays below `MOST` (see `MOST`); the mask only shows the compiler so.
        debug_assert!(self.pos < MOST, "a hot kind's fields take at most {MOST} bytes");
        let v = self.b[self.pos % MOST];
        self.pos += 1;
        Some(v)
    }

    #[inline(always)]
    fn le<const N: usize>(&mut self) -> Option<[u8; N]> {
        debug_assert!(self.pos < MOST, "a hot kind's fields take at most {MOST} bytes");
        let at = self.pos % MOST;
        self.pos += N;
        self.b[at..at + N].try_into().ok()
    }

    /// An unsigned varint of a field of at most `max_marker`'s width: 251 marks a u16, 252 a
    /// u32, 253 a u64 (little-endian after the marker).
    #[inline(always)]
    fn varint(&mut self, max_marker: u8) -> Option<u64> {
        match self.byte()? {
            b if b < 251 => Some(u64::from(b)),
            251 if max_marker >= 251 => Some(u64::from(u16::from_le_bytes(self.le()?))),
            252 if max_marker >= 252 => Some(u64::from(u32::from_le_bytes(self.le()?))),
            253 if max_marker >= 253 => Some(u64::from_le_bytes(self.le()?)),
            _ => None,
        }
    }

    #[inline(always)]
    fn u64(&mut self) -> Option<u64> {
        self.varint(253)
    }

    #[inline(always)]
    fn u32(&mut self) -> Option<u32> {
        self.varint(252).map(|v| v as u32)
    }

    #[inline(always)]
    fn i64(&mut self) -> Option<i64> {
        self.u64().map(crate::codec::unzigzag)
    }

    #[inline(always)]
    fn i32(&mut self) -> Option<i32> {
        // bincode decodes an i32 as the zigzag of a u32 varint.
        self.u32().map(|v| ((v >> 1) as i32) ^ -((v & 1) as i32))
    }

    #[inline(always)]
    fn api(&mut self) -> Option<Api> {
        self.varint(251).map(|v| Api::from_code(v as u16))
    }

    /// bincode's `Option`: a 0 byte, or a 1 byte and the value.
    #[inline(always)]
    fn opt<T>(&mut self, value: impl FnOnce(&mut Self) -> Option<T>) -> Option<Option<T>> {
        match self.byte()? {
            0 => Some(None),
            1 => value(self).map(Some),
            _ => None,
        }
    }

    /// A unit enum's variant index (a u32 varint).
    #[inline(always)]
    fn variant(&mut self) -> Option<u32> {
        self.u32()
    }
}

#[inline(always)]
fn category(i: u32) -> Option<Category> {
    Category::ALL.get(i as usize).copied()
}

#[inline(always)]
fn memory_kind(i: u32) -> Option<MemoryKind> {
    MemoryKind::ALL.get(i as usize).copied()
}

#[inline(always)]
fn origin(i: u32) -> Option<Origin> {
    Some(match i {
        0 => Origin::Request,
        1 => Origin::Outcome,
        _ => return None,
    })
}

#[inline(always)]
fn free_stage(i: u32) -> Option<FreeStage> {
    Some(match i {
        0 => FreeStage::Immediate,
        1 => FreeStage::Requested,
        2 => FreeStage::Completed,
        _ => return None,
    })
}

/// Decodes the body `following[..len]` with `fields`, through a window of `following` (the
/// input from the body's start on) when that is long enough, or else of a zero-padded copy.
/// `None` when `fields` declines, or when it read past the body's end: the generic path then
/// reads the body. A body with bytes after the fields read (a newer writer's) adds 1 to
/// `extended`: one compare of the two positions the end check has already.
#[inline(always)]
fn decode<T>(
    following: &[u8],
    len: usize,
    extended: &mut u64,
    fields: impl FnOnce(&mut Cursor) -> Option<T>,
) -> Option<T> {
    let padded;
    let b = match following.first_chunk::<WINDOW>() {
        Some(w) => w,
        None => {
            let mut p = [0u8; WINDOW];
            p[..following.len()].copy_from_slice(following);
            padded = p;
            &padded
        }
    };
    let mut c = Cursor { b, pos: 0 };
    let v = fields(&mut c)?;
    if c.pos > len {
        return None;
    }
    *extended += u64::from(c.pos < len);
    Some(v)
}

/// An allocation body, `following[..len]`, or `None` for the generic path (see [`decode`], also
/// for `extended`).
#[inline(always)]
pub(crate) fn alloc(following: &[u8], len: usize, extended: &mut u64) -> Option<Alloc> {
    decode(
        following,
        len,
        extended,
        #[inline(always)]
        |c| {
            Some(Alloc {
                addr: c.u64()?,
                size: c.u64()?,
                stream: c.i64()?,
                mem: c.variant().and_then(memory_kind)?,
                api: c.api()?,
                result: c.i32()?,
                origin: c.variant().and_then(origin)?,
                category: c.opt(|c| c.variant().and_then(category))?,
                caller: c.opt(Cursor::u32)?,
                stack: c.opt(Cursor::u32)?,
            })
        },
    )
}

/// A free body, `following[..len]`, or `None` for the generic path (see [`decode`]).
#[inline(always)]
pub(crate) fn free(following: &[u8], len: usize, extended: &mut u64) -> Option<Free> {
    decode(
        following,
        len,
        extended,
        #[inline(always)]
        |c| {
            Some(Free {
                addr: c.u64()?,
                size: c.opt(Cursor::u64)?,
                stream: c.i64()?,
                mem: c.variant().and_then(memory_kind)?,
                api: c.api()?,
                result: c.i32()?,
                origin: c.variant().and_then(origin)?,
                stage: c.variant().and_then(free_stage)?,
                caller: c.opt(Cursor::u32)?,
                stack: c.opt(Cursor::u32)?,
            })
        },
    )
}

/// A launch body, `following[..len]`, or `None` for the generic path (see [`decode`]).
#[inline(always)]
pub(crate) fn launch(following: &[u8], len: usize, extended: &mut u64) -> Option<KernelLaunch> {
    decode(
        following,
        len,
        extended,
        #[inline(always)]
        |c| {
            Some(KernelLaunch {
                api: c.api()?,
                name: c.opt(Cursor::u32)?,
                grid: [c.u32()?, c.u32()?, c.u32()?],
                block: [c.u32()?, c.u32()?, c.u32()?],
                shared_mem: c.u32()?,
                stream: c.i64()?,
                result: c.i32()?,
            })
        },
    )
}
