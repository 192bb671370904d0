//! Runtime (`libcudart`) allocation hooks. Error code when the real runtime is missing:
//! `cudaErrorInitializationError` (3).
//!
//! Allocations, frees, pitches, registrations, pool trims and IPC opens are rows of the
//! `memory_hooks!` table below (`hooks/memory.rs`); the one other shape (`cudaFree`, which skips
//! null) is written out after it.
//!
//! The call to the real function is the one unsafe operation every hook shares; it is made, and
//! documented, once in the hook macros (`hooks/shape.rs`), and the out-pointer reads in the
//! table's shapes (`hooks/memory.rs`).

use std::ffi::{c_int, c_uint, c_void};

use trace::Api;

use super::emit;
use super::memory::memory_hooks;
use super::shape::caller_hook;
use super::shape::HookDesc;
use super::{Handle, IpcHandle};
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
    /// `cudaHostRegister`.
    register cudaHostRegister(p: *mut c_void, size: usize, flags: c_uint) pads(a, b) => CudaHostRegister, mem::HOST_REGISTERED;
    /// `cudaMallocPitch`: recorded as pitch × height bytes.
    pitch cudaMallocPitch(p: *mut *mut c_void, pitch: *mut usize, width: usize, height: usize) pads(a) => CudaMallocPitch, mem::DEVICE;
    /// `cudaMemPoolTrimTo`.
    trim cudaMemPoolTrimTo(pool: Handle, keep: usize) pads(a, b, c) => CudaMemPoolTrimTo;
    /// `cudaIpcOpenMemHandle`: an imported allocation (size unknown to the importer).
    ipc_open cudaIpcOpenMemHandle(p: *mut *mut c_void, h: IpcHandle, flags: c_uint) => CudaIpcOpenMemHandle, mem::IPC_IMPORT;
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
