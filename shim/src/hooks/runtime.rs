//! Runtime (`libcudart`) allocation hooks. Error code when the real runtime is missing:
//! `cudaErrorInitializationError` (3).
//!
//! The call to the real function is the one unsafe operation every hook shares; it is made, and
//! documented, once in the hook macros (`hooks/shape.rs`). The unsafe blocks left here read
//! out-pointers, each with its own `// Safety:` line.

use std::ffi::{c_int, c_uint, c_void};

use trace::Api;

use super::emit::{self, out};
use super::shape::HookDesc;
use super::shape::{caller_hook, plain_hook};
use super::Handle;
use crate::event::mem;
use crate::raw::Depth;

const NO_RUNTIME: c_int = 3;

caller_hook! {
    /// `cudaMalloc`.
    cudaMalloc, Runtime, fn(p: *mut *mut c_void, size: usize) pads(a, b, c) -> c_int, err = NO_RUNTIME, forward_nested,
    |real, ra| {
        let d = Depth::enter();
        let r = real(p, size);
        // Safety: reads the out-pointer only when it is non-null and the call succeeded.
        if d.outer() { emit::alloc(&d, Api::CudaMalloc, mem::DEVICE, unsafe { out(p, r) }, size as u64, 0, r, ra) }
        r
    }
}

caller_hook! {
    /// `cudaFree`.
    cudaFree, Runtime, fn(p: *mut c_void) pads(a, b, c, e) -> c_int, err = NO_RUNTIME, forward_nested,
    |real, ra| {
        let d = Depth::enter();
        let r = real(p);
        // cudaFree(NULL) is the idiomatic "initialise the context" call, not a free.
        if d.outer() && !p.is_null() { emit::free(&d, Api::CudaFree, mem::DEVICE, p as u64, 0, r, ra) }
        r
    }
}

caller_hook! {
    /// `cudaMallocAsync`.
    cudaMallocAsync, Runtime, fn(p: *mut *mut c_void, size: usize, s: Handle) pads(a, b) -> c_int, err = NO_RUNTIME, forward_nested,
    |real, ra| {
        let d = Depth::enter();
        let r = real(p, size, s);
        // Safety: reads the out-pointer only when it is non-null and the call succeeded.
        if d.outer() { emit::alloc(&d, Api::CudaMallocAsync, mem::DEVICE, unsafe { out(p, r) }, size as u64, s as u64, r, ra) }
        r
    }
}

caller_hook! {
    /// `cudaFreeAsync`.
    cudaFreeAsync, Runtime, fn(p: *mut c_void, s: Handle) pads(a, b, c) -> c_int, err = NO_RUNTIME, forward_nested,
    |real, ra| {
        let d = Depth::enter();
        let r = real(p, s);
        if d.outer() { emit::free(&d, Api::CudaFreeAsync, mem::DEVICE, p as u64, s as u64, r, ra) }
        r
    }
}

caller_hook! {
    /// `cudaMallocAsync_ptsz`.
    cudaMallocAsync_ptsz, Runtime, fn(p: *mut *mut c_void, size: usize, s: Handle) pads(a, b) -> c_int, err = NO_RUNTIME, forward_nested,
    |real, ra| {
        let d = Depth::enter();
        let r = real(p, size, s);
        // Safety: reads the out-pointer only when it is non-null and the call succeeded.
        if d.outer() { emit::alloc(&d, Api::CudaMallocAsync_ptsz, mem::DEVICE, unsafe { out(p, r) }, size as u64, s as u64, r, ra) }
        r
    }
}

caller_hook! {
    /// `cudaFreeAsync_ptsz`.
    cudaFreeAsync_ptsz, Runtime, fn(p: *mut c_void, s: Handle) pads(a, b, c) -> c_int, err = NO_RUNTIME, forward_nested,
    |real, ra| {
        let d = Depth::enter();
        let r = real(p, s);
        if d.outer() { emit::free(&d, Api::CudaFreeAsync_ptsz, mem::DEVICE, p as u64, s as u64, r, ra) }
        r
    }
}

caller_hook! {
    /// `cudaMallocFromPoolAsync_ptsz`.
    cudaMallocFromPoolAsync_ptsz, Runtime, fn(p: *mut *mut c_void, size: usize, pool: Handle, s: Handle) pads(a) -> c_int, err = NO_RUNTIME, forward_nested,
    |real, ra| {
        let d = Depth::enter();
        let r = real(p, size, pool, s);
        // Safety: reads the out-pointer only when it is non-null and the call succeeded.
        if d.outer() { emit::alloc(&d, Api::CudaMallocFromPoolAsync_ptsz, mem::DEVICE, unsafe { out(p, r) }, size as u64, s as u64, r, ra) }
        r
    }
}

caller_hook! {
    /// `cudaMallocFromPoolAsync`.
    cudaMallocFromPoolAsync, Runtime, fn(p: *mut *mut c_void, size: usize, pool: Handle, s: Handle) pads(a) -> c_int, err = NO_RUNTIME, forward_nested,
    |real, ra| {
        let d = Depth::enter();
        let r = real(p, size, pool, s);
        // Safety: reads the out-pointer only when it is non-null and the call succeeded.
        if d.outer() { emit::alloc(&d, Api::CudaMallocFromPoolAsync, mem::DEVICE, unsafe { out(p, r) }, size as u64, s as u64, r, ra) }
        r
    }
}

caller_hook! {
    /// `cudaMallocManaged`.
    cudaMallocManaged, Runtime, fn(p: *mut *mut c_void, size: usize, flags: c_uint) pads(a, b) -> c_int, err = NO_RUNTIME, forward_nested,
    |real, ra| {
        let d = Depth::enter();
        let r = real(p, size, flags);
        // Safety: reads the out-pointer only when it is non-null and the call succeeded.
        if d.outer() { emit::alloc(&d, Api::CudaMallocManaged, mem::MANAGED, unsafe { out(p, r) }, size as u64, 0, r, ra) }
        r
    }
}

caller_hook! {
    /// `cudaMallocHost`.
    cudaMallocHost, Runtime, fn(p: *mut *mut c_void, size: usize) pads(a, b, c) -> c_int, err = NO_RUNTIME, forward_nested,
    |real, ra| {
        let d = Depth::enter();
        let r = real(p, size);
        // Safety: reads the out-pointer only when it is non-null and the call succeeded.
        if d.outer() { emit::alloc(&d, Api::CudaMallocHost, mem::PINNED_HOST, unsafe { out(p, r) }, size as u64, 0, r, ra) }
        r
    }
}

caller_hook! {
    /// `cudaHostAlloc`.
    cudaHostAlloc, Runtime, fn(p: *mut *mut c_void, size: usize, flags: c_uint) pads(a, b) -> c_int, err = NO_RUNTIME, forward_nested,
    |real, ra| {
        let d = Depth::enter();
        let r = real(p, size, flags);
        // Safety: reads the out-pointer only when it is non-null and the call succeeded.
        if d.outer() { emit::alloc(&d, Api::CudaHostAlloc, mem::PINNED_HOST, unsafe { out(p, r) }, size as u64, 0, r, ra) }
        r
    }
}

caller_hook! {
    /// `cudaFreeHost`.
    cudaFreeHost, Runtime, fn(p: *mut c_void) pads(a, b, c, e) -> c_int, err = NO_RUNTIME, forward_nested,
    |real, ra| {
        let d = Depth::enter();
        let r = real(p);
        if d.outer() { emit::free(&d, Api::CudaFreeHost, mem::PINNED_HOST, p as u64, 0, r, ra) }
        r
    }
}

caller_hook! {
    /// `cudaHostRegister`.
    cudaHostRegister, Runtime, fn(p: *mut c_void, size: usize, flags: c_uint) pads(a, b) -> c_int, err = NO_RUNTIME, forward_nested,
    |real, ra| {
        let d = Depth::enter();
        let r = real(p, size, flags);
        if d.outer() { emit::alloc(&d, Api::CudaHostRegister, mem::HOST_REGISTERED, p as u64, size as u64, 0, r, ra) }
        r
    }
}

caller_hook! {
    /// `cudaHostUnregister`.
    cudaHostUnregister, Runtime, fn(p: *mut c_void) pads(a, b, c, e) -> c_int, err = NO_RUNTIME, forward_nested,
    |real, ra| {
        let d = Depth::enter();
        let r = real(p);
        if d.outer() { emit::free(&d, Api::CudaHostUnregister, mem::HOST_REGISTERED, p as u64, 0, r, ra) }
        r
    }
}

caller_hook! {
    /// `cudaMallocPitch`: recorded as pitch × height bytes.
    cudaMallocPitch, Runtime, fn(p: *mut *mut c_void, pitch: *mut usize, width: usize, height: usize) pads(a) -> c_int, err = NO_RUNTIME, forward_nested,
    |real, ra| {
        let d = Depth::enter();
        let r = real(p, pitch, width, height);
        if d.outer() {
            // Safety: the pitch out-pointer, read only when non-null and the call succeeded.
            let pitch_v = if r == 0 && !pitch.is_null() { unsafe { *pitch } } else { width };
            // Safety: reads the out-pointer only when it is non-null and the call succeeded.
            emit::alloc(&d, Api::CudaMallocPitch, mem::DEVICE, unsafe { out(p, r) }, (pitch_v * height) as u64, 0, r, ra)
        }
        r
    }
}

caller_hook! {
    /// `cudaMemPoolTrimTo`.
    cudaMemPoolTrimTo, Runtime, fn(pool: Handle, keep: usize) pads(a, b, c) -> c_int, err = NO_RUNTIME, forward_nested,
    |real, _ra| {
        let d = Depth::enter();
        let r = real(pool, keep);
        if d.outer() { emit::trim(&d, Api::CudaMemPoolTrimTo, pool as u64, keep as u64, r) }
        r
    }
}

/// `cudaIpcMemHandle_t`: 64 opaque bytes, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IpcHandle {
    /// Opaque.
    pub reserved: [u8; 64],
}

plain_hook! {
    /// `cudaIpcOpenMemHandle`: an imported allocation (size unknown to the importer).
    cudaIpcOpenMemHandle, Runtime, fn(p: *mut *mut c_void, h: IpcHandle, flags: c_uint) -> c_int, err = NO_RUNTIME, forward_nested,
    |real| {
        let d = Depth::enter();
        let r = real(p, h, flags);
        // Safety: reads the out-pointer only when it is non-null and the call succeeded.
        if d.outer() { emit::alloc(&d, Api::CudaIpcOpenMemHandle, mem::IPC_IMPORT, unsafe { out(p, r) }, 0, 0, r, 0) }
        r
    }
}

caller_hook! {
    /// `cudaIpcCloseMemHandle`.
    cudaIpcCloseMemHandle, Runtime, fn(p: *mut c_void) pads(a, b, c, e) -> c_int, err = NO_RUNTIME, forward_nested,
    |real, ra| {
        let d = Depth::enter();
        let r = real(p);
        if d.outer() { emit::free(&d, Api::CudaIpcCloseMemHandle, mem::IPC_IMPORT, p as u64, 0, r, ra) }
        r
    }
}

/// Runtime allocation hooks.
pub const ALL: &[HookDesc] = &[
    cudaMalloc::DESC,
    cudaFree::DESC,
    cudaMallocAsync::DESC,
    cudaFreeAsync::DESC,
    cudaMallocFromPoolAsync::DESC,
    cudaMallocAsync_ptsz::DESC,
    cudaFreeAsync_ptsz::DESC,
    cudaMallocFromPoolAsync_ptsz::DESC,
    cudaMallocManaged::DESC,
    cudaMallocHost::DESC,
    cudaHostAlloc::DESC,
    cudaFreeHost::DESC,
    cudaHostRegister::DESC,
    cudaHostUnregister::DESC,
    cudaMallocPitch::DESC,
    cudaMemPoolTrimTo::DESC,
    cudaIpcOpenMemHandle::DESC,
    cudaIpcCloseMemHandle::DESC,
];
