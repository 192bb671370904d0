//! Driver array hooks: `cuArrayCreate_v2`, `cuArray3DCreate_v2`, `cuMipmappedArrayCreate` and
//! their destroys. Arrays are device memory whose exact size the driver does not report (rows
//! and tiles are padded to a layout it chooses), so each is recorded as a device allocation of
//! its lower bound, width × height × depth × channels × element bytes (summed over mip levels),
//! at the address of its handle (a host pointer, which under unified addressing cannot collide
//! with a device address). Formats whose element size is not a whole number of bytes per
//! channel (NV12, block-compressed, packed) are recorded with size 0: known to exist, size
//! unknown. The `_v1` entry points (32-bit descriptors, pre-CUDA 3.2 binaries) are not hooked.
//!
//! The call to the real function is made, and documented, once in the hook macros
//! (`hooks/shape.rs`); the unsafe blocks left here read the caller's descriptor and the
//! out-handle, each with its own `// Safety:` line.

use std::ffi::{c_int, c_uint, c_void};

use trace::Api;

use super::emit::{self, out};
use super::shape::caller_hook;
use super::shape::HookDesc;
use crate::event::mem;
use crate::raw::Depth;

const NO_DRIVER: c_int = 3;

/// `CUDA_ARRAY_DESCRIPTOR` (v2).
#[repr(C)]
pub struct ArrayDesc {
    /// Width in elements.
    pub width: usize,
    /// Height in elements (0 for a 1D array).
    pub height: usize,
    /// `CUarray_format`.
    pub format: c_uint,
    /// Channels per element (1, 2 or 4).
    pub channels: c_uint,
}

/// `CUDA_ARRAY3D_DESCRIPTOR` (v2).
#[repr(C)]
pub struct Array3dDesc {
    /// Width in elements.
    pub width: usize,
    /// Height (0 for 1D).
    pub height: usize,
    /// Depth (0 for 1D/2D).
    pub depth: usize,
    /// `CUarray_format`.
    pub format: c_uint,
    /// Channels per element.
    pub channels: c_uint,
    /// `CUDA_ARRAY3D_*` flags.
    pub flags: c_uint,
}

/// Bytes per channel of a `CUarray_format`, for the formats where that is a whole number.
pub fn channel_bytes(format: c_uint) -> Option<u64> {
    match format {
        0x01 | 0x08 => Some(1),        // UNSIGNED_INT8, SIGNED_INT8
        0x02 | 0x09 | 0x10 => Some(2), // UNSIGNED_INT16, SIGNED_INT16, HALF
        0x03 | 0x0a | 0x20 => Some(4), // UNSIGNED_INT32, SIGNED_INT32, FLOAT
        _ => None,
    }
}

/// The lower bound of an array's size; 0 when the format's element size is not known.
pub fn array_bytes(width: usize, height: usize, depth: usize, format: c_uint, channels: c_uint, levels: u32) -> u64 {
    let Some(b) = channel_bytes(format) else { return 0 };
    let dim = |v: usize, l: u32| (v as u64 >> l).max(1);
    (0..levels.max(1))
        .map(|l| dim(width, l) * dim(height, l) * dim(depth, l))
        .fold(0u64, |a, n| a.saturating_add(n))
        .saturating_mul(u64::from(channels.max(1)))
        .saturating_mul(b)
}

impl ArrayDesc {
    /// The lower bound of this 2D array's size ([`array_bytes`]).
    pub fn bytes(&self, levels: u32) -> u64 {
        array_bytes(self.width, self.height, 0, self.format, self.channels, levels)
    }
}

impl Array3dDesc {
    /// The lower bound of this array's size over `levels` mip levels ([`array_bytes`]).
    pub fn bytes(&self, levels: u32) -> u64 {
        array_bytes(self.width, self.height, self.depth, self.format, self.channels, levels)
    }
}

/// An array create: the device allocation of its lower bound (`$levels` mip levels of the
/// descriptor's size) at the handle it wrote. Not `forward_nested`, as these hooks always were.
macro_rules! create_hook {
    (
        $(#[$doc:meta])*
        $name:ident($desc:ty $(, $arg:ident: $aty:ty)*) pads($($pad:ident),*) => $api:ident, levels $levels:expr
    ) => {
        caller_hook! {
            $(#[$doc])*
            $name, Driver, fn(h: *mut *mut c_void, d: *const $desc $(, $arg: $aty)*) pads($($pad),*) -> c_int, err = NO_DRIVER,
            |real, ra| {
                let dp = Depth::enter();
                let r = real(h, d $(, $arg)*);
                if dp.outer() {
                    // Safety: the caller's descriptor, valid for the call.
                    let size = unsafe { d.as_ref() }.map_or(0, |d| d.bytes($levels));
                    // Safety: see `out`.
                    emit::alloc(&dp, Api::$api, mem::DEVICE, unsafe { out(h, r) }, size, 0, r, ra)
                }
                r
            }
        }
    };
}

create_hook! {
    /// `cuArrayCreate_v2`.
    cuArrayCreate_v2(ArrayDesc) pads(a, b, c) => CuArrayCreate_v2, levels 1
}
create_hook! {
    /// `cuArray3DCreate_v2`.
    cuArray3DCreate_v2(Array3dDesc) pads(a, b, c) => CuArray3DCreate_v2, levels 1
}
create_hook! {
    /// `cuMipmappedArrayCreate`: every level counted.
    cuMipmappedArrayCreate(Array3dDesc, levels: c_uint) pads(a, b) => CuMipmappedArrayCreate, levels levels
}

macro_rules! destroy_hook {
    ($name:ident, $api:ident) => {
        caller_hook! {
            /// An array destroy: the free of the handle.
            $name, Driver, fn(h: *mut c_void) pads(a, b, c, e) -> c_int, err = NO_DRIVER, forward_nested,
            |real, ra| {
                let d = Depth::enter();
                let r = real(h);
                if d.outer() { emit::free(&d, Api::$api, mem::DEVICE, h as u64, 0, r, ra) }
                r
            }
        }
    };
}

destroy_hook!(cuArrayDestroy, CuArrayDestroy);
destroy_hook!(cuMipmappedArrayDestroy, CuMipmappedArrayDestroy);

/// Array hooks.
pub const ALL: &[HookDesc] = &[
    cuArrayCreate_v2::DESC,
    cuArray3DCreate_v2::DESC,
    cuMipmappedArrayCreate::DESC,
    cuArrayDestroy::DESC,
    cuMipmappedArrayDestroy::DESC,
];

#[cfg(test)]
mod tests {
    use super::array_bytes;

    #[test]
    fn lower_bounds() {
        let check = |dims: (usize, usize, usize), format, channels, levels, want: u64| {
            assert_eq!(array_bytes(dims.0, dims.1, dims.2, format, channels, levels), want, "{dims:?} {format:#x}");
        };
        check((100, 0, 0), 0x20, 1, 1, 400); // 1D float
        check((64, 32, 0), 0x01, 4, 1, 64 * 32 * 4); // 2D uchar4
        check((8, 8, 8), 0x10, 2, 1, 8 * 8 * 8 * 2 * 2); // 3D half2
        check((8, 4, 0), 0x20, 1, 4, (32 + 8 + 2 + 1) * 4); // mip levels 8x4, 4x2, 2x1, 1x1
        check((1024, 1024, 0), 0xb0, 1, 1, 0); // NV12: size unknown
    }
}
