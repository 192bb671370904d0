//! Hand-written encoders for the frames a traced process writes by the million: kernel
//! launches, allocations and frees. They produce exactly the bytes of the generic path
//! (`codec::encode_frame_generic`: the record prefix, then bincode's derived `Encode` through a
//! `Vec` writer), but straight into reserved spare capacity of the frame buffer. Profiling the
//! shim's writer thread showed bincode's per-field writer calls and the per-byte `Vec` pushes as
//! half of its work per event. `tests/it/fastframe.rs` compares both paths byte for byte over
//! generated records.

use crate::event::{Alloc, Free, KernelLaunch};

/// Tag, length, prefix (≤ 21 bytes) and a launch body (≤ 58 bytes) always fit.
const CAP: usize = 96;

/// Where prefix bytes go: the frame buffer itself, or a [`Spare`].
pub(crate) trait Sink {
    fn push(&mut self, b: u8);
    fn len(&self) -> usize;
    fn set(&mut self, at: usize, b: u8);
}

impl Sink for Vec<u8> {
    #[inline(always)]
    fn push(&mut self, b: u8) {
        Vec::push(self, b);
    }
    #[inline(always)]
    fn len(&self) -> usize {
        Vec::len(self)
    }
    #[inline(always)]
    fn set(&mut self, at: usize, b: u8) {
        self[at] = b;
    }
}

/// The spare capacity of the frame buffer, written through a raw pointer: a launch frame has
/// at most [`CAP`] bytes, reserved up front, so no per-byte capacity or bounds check is needed.
pub(crate) struct Spare {
    ptr: *mut u8,
    len: usize,
}

impl Sink for Spare {
    #[inline(always)]
    fn push(&mut self, b: u8) {
        debug_assert!(self.len < CAP);
        // Safety: `ptr` points at CAP reserved bytes (see `launch`) and a frame never exceeds CAP.
        unsafe { self.ptr.add(self.len).write(b) };
        self.len += 1;
    }
    #[inline(always)]
    fn len(&self) -> usize {
        self.len
    }
    #[inline(always)]
    fn set(&mut self, at: usize, b: u8) {
        assert!(at < self.len);
        // Safety: `at` was written before, so it is inside the reservation.
        unsafe { self.ptr.add(at).write(b) };
    }
}

impl Spare {
    #[inline(always)]
    fn le<const N: usize>(&mut self, bytes: [u8; N]) {
        debug_assert!(self.len + N <= CAP);
        // Safety: as in `push`.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.ptr.add(self.len), N) };
        self.len += N;
    }

    /// bincode 2 `standard()` unsigned varint: one byte below 251, else a marker byte (251 u16,
    /// 252 u32, 253 u64) and the value little-endian.
    #[inline(always)]
    fn bvarint(&mut self, v: u64) {
        if v < 251 {
            self.push(v as u8);
        } else if v <= u64::from(u16::MAX) {
            self.push(251);
            self.le((v as u16).to_le_bytes());
        } else if v <= u64::from(u32::MAX) {
            self.push(252);
            self.le((v as u32).to_le_bytes());
        } else {
            self.push(253);
            self.le(v.to_le_bytes());
        }
    }

    /// [`bvarint`](Self::bvarint) for a value known to fit 32 bits (no u64 branch).
    #[inline(always)]
    fn bvarint32(&mut self, v: u32) {
        if v < 251 {
            self.push(v as u8);
        } else if v <= u32::from(u16::MAX) {
            self.push(251);
            self.le((v as u16).to_le_bytes());
        } else {
            self.push(252);
            self.le(v.to_le_bytes());
        }
    }

    /// bincode's signed varint: zigzag, then the unsigned form.
    #[inline(always)]
    fn bvarint_signed(&mut self, v: i64) {
        self.bvarint(crate::codec::zigzag(v));
    }
}

/// Appends a whole frame (tag, one-byte length, prefix, body) for a body of at most
/// `CAP - 2 - 21` bytes. `prefix` writes the record prefix, `body` the event.
#[inline(always)]
fn frame(tag: u8, prefix: impl FnOnce(&mut Spare), body: impl FnOnce(&mut Spare), buf: &mut Vec<u8>) {
    buf.reserve(CAP);
    let start = buf.len();
    // Safety: `reserve` made CAP bytes available after `start`.
    let mut s = Spare { ptr: unsafe { buf.as_mut_ptr().add(start) }, len: 0 };
    s.push(tag);
    s.push(0); // the body length, set below
    prefix(&mut s);
    body(&mut s);
    let len = s.len - 2;
    assert!(len < 0x80, "fast-path frame bodies always fit a one-byte length");
    s.set(1, len as u8);
    // Safety: all `s.len` bytes after `start` were written above, inside the reservation.
    unsafe { buf.set_len(start + s.len) };
}

/// bincode's `Option<u32>`: a 0 byte, or a 1 byte and the value.
#[inline(always)]
fn opt_u32(s: &mut Spare, v: Option<u32>) {
    match v {
        None => s.push(0),
        Some(n) => {
            s.push(1);
            s.bvarint32(n);
        }
    }
}

/// A launch body (≤ 58 bytes): api, name, grid, block, shared memory, stream, result.
#[inline]
pub(crate) fn launch(tag: u8, l: &KernelLaunch, prefix: impl FnOnce(&mut Spare), buf: &mut Vec<u8>) {
    frame(
        tag,
        prefix,
        |s| {
            s.bvarint32(u32::from(l.api.code()));
            opt_u32(s, l.name);
            // Unrolled: a chained iterator here cost an `Option` check per step.
            let ([g0, g1, g2], [b0, b1, b2]) = (l.grid, l.block);
            s.bvarint32(g0);
            s.bvarint32(g1);
            s.bvarint32(g2);
            s.bvarint32(b0);
            s.bvarint32(b1);
            s.bvarint32(b2);
            s.bvarint32(l.shared_mem);
            s.bvarint_signed(l.stream);
            s.bvarint_signed(i64::from(l.result));
        },
        buf,
    );
}

/// An allocation body (≤ 51 bytes). Unit enums are bincode's variant index, a u32 varint.
#[inline]
pub(crate) fn alloc(tag: u8, a: &Alloc, prefix: impl FnOnce(&mut Spare), buf: &mut Vec<u8>) {
    frame(
        tag,
        prefix,
        |s| {
            s.bvarint(a.addr);
            s.bvarint(a.size);
            s.bvarint_signed(a.stream);
            s.bvarint(a.mem as u64);
            s.bvarint(u64::from(a.api.code()));
            s.bvarint_signed(i64::from(a.result));
            s.bvarint(a.origin as u64);
            match a.category {
                None => s.push(0),
                Some(c) => {
                    s.push(1);
                    s.bvarint(c as u64);
                }
            }
            opt_u32(s, a.caller);
            opt_u32(s, a.stack);
        },
        buf,
    );
}

/// A free body (≤ 51 bytes).
#[inline]
pub(crate) fn free(tag: u8, f: &Free, prefix: impl FnOnce(&mut Spare), buf: &mut Vec<u8>) {
    frame(
        tag,
        prefix,
        |s| {
            s.bvarint(f.addr);
            match f.size {
                None => s.push(0),
                Some(n) => {
                    s.push(1);
                    s.bvarint(n);
                }
            }
            s.bvarint_signed(f.stream);
            s.bvarint(f.mem as u64);
            s.bvarint(u64::from(f.api.code()));
            s.bvarint_signed(i64::from(f.result));
            s.bvarint(f.origin as u64);
            s.bvarint(f.stage as u64);
            opt_u32(s, f.caller);
            opt_u32(s, f.stack);
        },
        buf,
    );
}
