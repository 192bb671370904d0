//! Runtime (`libcudart`) allocation hooks. Error code when the real runtime is missing:
//! `cudaErrorInitializationError` (3).
//!
//! Safety of every `unsafe` block here: the hook forwards the caller's own arguments to the real
//! function of the same signature, and reads an out-pointer only when it is non-null and the
//! call succeeded.

use std::ffi::{c_int, c_uint, c_void};

use trace::Api;

use super::emit;
use super::table::HookDesc;
use super::{caller_hook, plain_hook, Handle};
use crate::raw::{mem, Depth};

const NO_RUNTIME: c_int = 3;

/// The written pointer, or 0 when the call failed or gave no out-pointer.
///
/// # Safety
/// `p` is null or points to a pointer the real call wrote.
#[inline(always)]
unsafe fn out(p: *mut *mut c_void, r: c_int) -> u64 {
    // Safety: checked non-null; the real call wrote it on success.
    if r == 0 && !p.is_null() {
        unsafe { *p as u64 }
    } else {
        0
    }
}

caller_hook! {
    /// `cudaMalloc`.
    cudaMalloc, Runtime, fn(p: *mut *mut c_void, size: usize) pads(a, b, c) -> c_int, err = NO_RUNTIME,
    |real, ra| {
        let d = Depth::enter();
        let r = unsafe { real(p, size) };
        if d.outer() { emit::alloc(&d, Api::CudaMalloc, mem::DEVICE, unsafe { out(p, r) }, size as u64, 0, r, ra) }
        r
    }
}

caller_hook! {
    /// `cudaFree`.
    cudaFree, Runtime, fn(p: *mut c_void) pads(a, b, c, e) -> c_int, err = NO_RUNTIME,
    |real, ra| {
        let d = Depth::enter();
        let r = unsafe { real(p) };
        // cudaFree(NULL) is the idiomatic "initialise the context" call, not a free.
        if d.outer() && !p.is_null() { emit::free(&d, Api::CudaFree, mem::DEVICE, p as u64, 0, r, ra) }
        r
    }
}

caller_hook! {
    /// `cudaMallocAsync`.
    cudaMallocAsync, Runtime, fn(p: *mut *mut c_void, size: usize, s: Handle) pads(a, b) -> c_int, err = NO_RUNTIME,
    |real, ra| {
        let d = Depth::enter();
        let r = unsafe { real(p, size, s) };
        if d.outer() { emit::alloc(&d, Api::CudaMallocAsync, mem::DEVICE, unsafe { out(p, r) }, size as u64, s as u64, r, ra) }
        r
    }
}

caller_hook! {
    /// `cudaFreeAsync`.
    cudaFreeAsync, Runtime, fn(p: *mut c_void, s: Handle) pads(a, b, c) -> c_int, err = NO_RUNTIME,
    |real, ra| {
        let d = Depth::enter();
        let r = unsafe { real(p, s) };
        if d.outer() { emit::free(&d, Api::CudaFreeAsync, mem::DEVICE, p as u64, s as u64, r, ra) }
        r
    }
}

caller_hook! {
    /// `cudaMallocFromPoolAsync`.
    cudaMallocFromPoolAsync, Runtime, fn(p: *mut *mut c_void, size: usize, pool: Handle, s: Handle) pads(a) -> c_int, err = NO_RUNTIME,
    |real, ra| {
        let d = Depth::enter();
        let r = unsafe { real(p, size, pool, s) };
        if d.outer() { emit::alloc(&d, Api::CudaMallocFromPoolAsync, mem::DEVICE, unsafe { out(p, r) }, size as u64, s as u64, r, ra) }
        r
    }
}

caller_hook! {
    /// `cudaMallocManaged`.
    cudaMallocManaged, Runtime, fn(p: *mut *mut c_void, size: usize, flags: c_uint) pads(a, b) -> c_int, err = NO_RUNTIME,
    |real, ra| {
        let d = Depth::enter();
        let r = unsafe { real(p, size, flags) };
        if d.outer() { emit::alloc(&d, Api::CudaMallocManaged, mem::MANAGED, unsafe { out(p, r) }, size as u64, 0, r, ra) }
        r
    }
}

caller_hook! {
    /// `cudaMallocHost`.
    cudaMallocHost, Runtime, fn(p: *mut *mut c_void, size: usize) pads(a, b, c) -> c_int, err = NO_RUNTIME,
    |real, ra| {
        let d = Depth::enter();
        let r = unsafe { real(p, size) };
        if d.outer() { emit::alloc(&d, Api::CudaMallocHost, mem::PINNED_HOST, unsafe { out(p, r) }, size as u64, 0, r, ra) }
        r
    }
}

caller_hook! {
    /// `cudaHostAlloc`.
    cudaHostAlloc, Runtime, fn(p: *mut *mut c_void, size: usize, flags: c_uint) pads(a, b) -> c_int, err = NO_RUNTIME,
    |real, ra| {
        let d = Depth::enter();
        let r = unsafe { real(p, size, flags) };
        if d.outer() { emit::alloc(&d, Api::CudaHostAlloc, mem::PINNED_HOST, unsafe { out(p, r) }, size as u64, 0, r, ra) }
        r
    }
}

caller_hook! {
    /// `cudaFreeHost`.
    cudaFreeHost, Runtime, fn(p: *mut c_void) pads(a, b, c, e) -> c_int, err = NO_RUNTIME,
    |real, ra| {
        let d = Depth::enter();
        let r = unsafe { real(p) };
        if d.outer() { emit::free(&d, Api::CudaFreeHost, mem::PINNED_HOST, p as u64, 0, r, ra) }
        r
    }
}

caller_hook! {
    /// `cudaHostRegister`.
    cudaHostRegister, Runtime, fn(p: *mut c_void, size: usize, flags: c_uint) pads(a, b) -> c_int, err = NO_RUNTIME,
    |real, ra| {
        let d = Depth::enter();
        let r = unsafe { real(p, size, flags) };
        if d.outer() { emit::alloc(&d, Api::CudaHostRegister, mem::HOST_REGISTERED, p as u64, size as u64, 0, r, ra) }
        r
    }
}

caller_hook! {
    /// `cudaHostUnregister`.
    cudaHostUnregister, Runtime, fn(p: *mut c_void) pads(a, b, c, e) -> c_int, err = NO_RUNTIME,
    |real, ra| {
        let d = Depth::enter();
        let r = unsafe { real(p) };
        if d.outer() { emit::free(&d, Api::CudaHostUnregister, mem::HOST_REGISTERED, p as u64, 0, r, ra) }
        r
    }
}

caller_hook! {
    /// `cudaMallocPitch`: recorded as pitch × height bytes.
    cudaMallocPitch, Runtime, fn(p: *mut *mut c_void, pitch: *mut usize, width: usize, height: usize) pads(a) -> c_int, err = NO_RUNTIME,
    |real, ra| {
        let d = Depth::enter();
        let r = unsafe { real(p, pitch, width, height) };
        if d.outer() {
            let pitch_v = if r == 0 && !pitch.is_null() { unsafe { *pitch } } else { width };
            emit::alloc(&d, Api::CudaMallocPitch, mem::DEVICE, unsafe { out(p, r) }, (pitch_v * height) as u64, 0, r, ra)
        }
        r
    }
}

caller_hook! {
    /// `cudaMemPoolTrimTo`.
    cudaMemPoolTrimTo, Runtime, fn(pool: Handle, keep: usize) pads(a, b, c) -> c_int, err = NO_RUNTIME,
    |real, _ra| {
        let d = Depth::enter();
        let r = unsafe { real(pool, keep) };
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
    cudaIpcOpenMemHandle, Runtime, fn(p: *mut *mut c_void, h: IpcHandle, flags: c_uint) -> c_int, err = NO_RUNTIME,
    |real| {
        let d = Depth::enter();
        let r = unsafe { real(p, h, flags) };
        if d.outer() { emit::alloc(&d, Api::CudaIpcOpenMemHandle, mem::IPC_IMPORT, unsafe { out(p, r) }, 0, 0, r, 0) }
        r
    }
}

caller_hook! {
    /// `cudaIpcCloseMemHandle`.
    cudaIpcCloseMemHandle, Runtime, fn(p: *mut c_void) pads(a, b, c, e) -> c_int, err = NO_RUNTIME,
    |real, ra| {
        let d = Depth::enter();
        let r = unsafe { real(p) };
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
