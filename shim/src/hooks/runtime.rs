//! Runtime (`libcudart`) allocation hooks. Error code when the real runtime is missing:
//! `cudaErrorInitializationError` (3).
//!
//! Allocations through an out-pointer and frees of an address are rows of the `memory_hooks!`
//! table below (`hooks/memory.rs`); the other shapes are written out after it.
//!
//! The call to the real function is the one unsafe operation every hook shares; it is made, and
//! documented, once in the hook macros (`hooks/shape.rs`). The unsafe blocks left here read
//! out-pointers, each with its own `// Safety:` line.

use std::ffi::{c_int, c_uint, c_void};

use trace::Api;

use super::emit::{self, out};
use super::memory::memory_hooks;
use super::shape::HookDesc;
use super::shape::{caller_hook, plain_hook};
use super::Handle;
use crate::event::mem;
use crate::raw::Depth;

const NO_RUNTIME: c_int = 3;

memory_hooks! {
    Runtime, err = NO_RUNTIME;
    /// `cudaMalloc`.
    alloc cudaMalloc(p: *mut *mut c_void, size: usize) pads(a, b, c) => CudaMalloc, mem::DEVICE, stream 0;
    /// `cudaMallocAsync`.
    alloc cudaMallocAsync(p: *mut *mut c_void, size: usize, s: Handle) pads(a, b) => CudaMallocAsync, mem::DEVICE, stream s as u64;
    /// `cudaFreeAsync`.
    free cudaFreeAsync(p: *mut c_void, s: Handle) pads(a, b, c) => CudaFreeAsync, mem::DEVICE, stream s as u64;
    /// `cudaMallocAsync_ptsz`.
    alloc cudaMallocAsync_ptsz(p: *mut *mut c_void, size: usize, s: Handle) pads(a, b) => CudaMallocAsync_ptsz, mem::DEVICE, stream s as u64;
    /// `cudaFreeAsync_ptsz`.
    free cudaFreeAsync_ptsz(p: *mut c_void, s: Handle) pads(a, b, c) => CudaFreeAsync_ptsz, mem::DEVICE, stream s as u64;
    /// `cudaMallocFromPoolAsync_ptsz`.
    alloc cudaMallocFromPoolAsync_ptsz(p: *mut *mut c_void, size: usize, pool: Handle, s: Handle) pads(a) => CudaMallocFromPoolAsync_ptsz, mem::DEVICE, stream s as u64;
    /// `cudaMallocFromPoolAsync`.
    alloc cudaMallocFromPoolAsync(p: *mut *mut c_void, size: usize, pool: Handle, s: Handle) pads(a) => CudaMallocFromPoolAsync, mem::DEVICE, stream s as u64;
    /// `cudaMallocManaged`.
    alloc cudaMallocManaged(p: *mut *mut c_void, size: usize, flags: c_uint) pads(a, b) => CudaMallocManaged, mem::MANAGED, stream 0;
    /// `cudaMallocHost`.
    alloc cudaMallocHost(p: *mut *mut c_void, size: usize) pads(a, b, c) => CudaMallocHost, mem::PINNED_HOST, stream 0;
    /// `cudaHostAlloc`.
    alloc cudaHostAlloc(p: *mut *mut c_void, size: usize, flags: c_uint) pads(a, b) => CudaHostAlloc, mem::PINNED_HOST, stream 0;
    /// `cudaFreeHost`.
    free cudaFreeHost(p: *mut c_void) pads(a, b, c, e) => CudaFreeHost, mem::PINNED_HOST, stream 0;
    /// `cudaHostUnregister`.
    free cudaHostUnregister(p: *mut c_void) pads(a, b, c, e) => CudaHostUnregister, mem::HOST_REGISTERED, stream 0;
    /// `cudaIpcCloseMemHandle`.
    free cudaIpcCloseMemHandle(p: *mut c_void) pads(a, b, c, e) => CudaIpcCloseMemHandle, mem::IPC_IMPORT, stream 0;
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
