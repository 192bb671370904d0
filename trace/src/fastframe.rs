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

/// One frame being written into the spare capacity of the frame buffer, through a raw pointer:
/// a fast-path frame has at most [`CAP`] bytes, reserved by [`Spare::begin`], so no per-byte
/// capacity or bounds check is needed. [`Spare::finish`] sets the length and commits the bytes.
/// Plain methods rather than closures, so that the whole frame inlines into its caller.
pub(crate) struct Spare<'a> {
    buf: &'a mut Vec<u8>,
    ptr: *mut u8,
    len: usize,
}

impl Sink for Spare<'_> {
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

impl<'a> Spare<'a> {
    /// Reserves [`CAP`] bytes after `buf`'s end and writes the tag and a length placeholder.
    #[inline(always)]
    pub(crate) fn begin(tag: u8, buf: &'a mut Vec<u8>) -> Spare<'a> {
        buf.reserve(CAP);
        let start = buf.len();
        // Safety: `reserve` made CAP bytes available after `start`.
        let ptr = unsafe { buf.as_mut_ptr().add(start) };
        let mut s = Spare { buf, ptr, len: 0 };
        s.push(tag);
        s.push(0); // the body length, set by `finish`
        s
    }

    /// Sets the body length and makes the frame part of the buffer.
    #[inline(always)]
    pub(crate) fn finish(mut self) {
        let len = self.len - 2;
        assert!(len < 0x80, "fast-path frame bodies always fit a one-byte length");
        self.set(1, len as u8);
        let end = self.buf.len() + self.len;
        // Safety: all `len` bytes after the old end were written, inside the reservation.
        unsafe { self.buf.set_len(end) };
    }

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
        match u32::try_from(v) {
            Ok(small) => self.bvarint32(small),
            Err(_) => {
                self.push(253);
                self.le(v.to_le_bytes());
            }
        }
    }

    /// [`bvarint`](Self::bvarint) for a value that fits 32 bits.
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
#[inline(always)]
pub(crate) fn launch(s: &mut Spare, l: &KernelLaunch) {
    {
        {
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
        }
    }
}

/// An allocation body (≤ 51 bytes). Unit enums are bincode's variant index, a u32 varint.
#[inline]
pub(crate) fn alloc(s: &mut Spare, a: &Alloc) {
    {
        {
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
        }
    }
}

/// A free body (≤ 51 bytes).
#[inline]
pub(crate) fn free(s: &mut Spare, f: &Free) {
    {
        {
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
        }
    }
}
