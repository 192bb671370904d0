//! Driver (`libcuda.so.1`) allocation and VMM hooks. Error code when the real driver is missing:
//! `CUDA_ERROR_NOT_INITIALIZED` (3).
//!
//! Allocations, frees, pitches, registrations, pool trims, IPC opens and VMM calls on an address
//! range are rows of the `memory_hooks!` table below (`hooks/memory.rs`); the other shapes (VMM
//! calls with an out-pointer or a handle, a shareable-handle import) are written out after it.
//!
//! The call to the real function is the one unsafe operation every hook shares; it is made, and
//! documented, once in the hook macros (`hooks/shape.rs`). The unsafe blocks left here read
//! out-pointers, each with its own `// Safety:` line.

use std::ffi::{c_int, c_uint, c_ulonglong, c_void};

use trace::Api;

use super::emit::{self, out};
use super::memory::memory_hooks;
use super::shape::caller_hook;
use super::shape::HookDesc;
use super::{Handle, IpcHandle};
use crate::event::{mem, vmm};
use crate::raw::Depth;

const NO_DRIVER: c_int = 3;

memory_hooks! {
    Driver, err = NO_DRIVER;
    /// `cuMemAlloc_v2`.
    alloc cuMemAlloc_v2(p: *mut u64, size: usize) pads(a, b, c) => CuMemAlloc_v2, mem::DEVICE, stream 0;
    /// `cuMemFree_v2`.
    free cuMemFree_v2(p: u64) pads(a, b, c, e) => CuMemFree_v2, mem::DEVICE, stream 0;
    /// `cuMemAllocAsync`.
    alloc cuMemAllocAsync(p: *mut u64, size: usize, s: Handle) pads(a, b) => CuMemAllocAsync, mem::DEVICE, stream s as u64;
    /// `cuMemAllocAsync_ptsz`.
    alloc cuMemAllocAsync_ptsz(p: *mut u64, size: usize, s: Handle) pads(a, b) => CuMemAllocAsync_ptsz, mem::DEVICE, stream s as u64;
    /// `cuMemFreeAsync`.
    free cuMemFreeAsync(p: u64, s: Handle) pads(a, b, c) => CuMemFreeAsync, mem::DEVICE, stream s as u64;
    /// `cuMemFreeAsync_ptsz`.
    free cuMemFreeAsync_ptsz(p: u64, s: Handle) pads(a, b, c) => CuMemFreeAsync_ptsz, mem::DEVICE, stream s as u64;
    /// `cuMemAllocFromPoolAsync`.
    alloc cuMemAllocFromPoolAsync(p: *mut u64, size: usize, pool: Handle, s: Handle) pads(a) => CuMemAllocFromPoolAsync, mem::DEVICE, stream s as u64;
    /// `cuMemAllocFromPoolAsync_ptsz`.
    alloc cuMemAllocFromPoolAsync_ptsz(p: *mut u64, size: usize, pool: Handle, s: Handle) pads(a) => CuMemAllocFromPoolAsync_ptsz, mem::DEVICE, stream s as u64;
    /// `cuIpcCloseMemHandle`.
    free cuIpcCloseMemHandle(p: u64) pads(a, b, c, e) => CuIpcCloseMemHandle, mem::IPC_IMPORT, stream 0;
    /// `cuMemAllocManaged`.
    alloc cuMemAllocManaged(p: *mut u64, size: usize, flags: c_uint) pads(a, b) => CuMemAllocManaged, mem::MANAGED, stream 0;
    /// `cuMemHostAlloc`.
    alloc cuMemHostAlloc(p: *mut *mut c_void, size: usize, flags: c_uint) pads(a, b) => CuMemHostAlloc, mem::PINNED_HOST, stream 0;
    /// `cuMemAllocHost_v2`.
    alloc cuMemAllocHost_v2(p: *mut *mut c_void, size: usize) pads(a, b, c) => CuMemAllocHost_v2, mem::PINNED_HOST, stream 0;
    /// `cuMemFreeHost`.
    free cuMemFreeHost(p: *mut c_void) pads(a, b, c, e) => CuMemFreeHost, mem::PINNED_HOST, stream 0;
    /// `cuMemHostUnregister`.
    free cuMemHostUnregister(p: *mut c_void) pads(a, b, c, e) => CuMemHostUnregister, mem::HOST_REGISTERED, stream 0;
    /// `cuMemRelease`: the physical handle.
    free cuMemRelease(p: u64) pads(a, b, c, e) => CuMemRelease, mem::PHYSICAL, stream 0;
    /// `cuMemAllocPitch_v2`: recorded as pitch × height bytes.
    pitch cuMemAllocPitch_v2(p: *mut u64, pitch: *mut usize, width: usize, height: usize, elem: c_uint) pads() => CuMemAllocPitch_v2, mem::DEVICE;
    /// `cuMemHostRegister_v2`.
    register cuMemHostRegister_v2(p: *mut c_void, size: usize, flags: c_uint) pads(a, b) => CuMemHostRegister_v2, mem::HOST_REGISTERED;
    /// `cuMemPoolTrimTo`.
    trim cuMemPoolTrimTo(pool: Handle, keep: usize) pads(a, b, c) => CuMemPoolTrimTo;
    /// `cuIpcOpenMemHandle_v2`.
    ipc_open cuIpcOpenMemHandle_v2(p: *mut u64, h: IpcHandle, flags: c_uint) => CuIpcOpenMemHandle_v2, mem::IPC_IMPORT;
    /// `cuMemAddressFree`.
    vmm cuMemAddressFree(p: u64, size: usize) pads(a, b, c) => CuMemAddressFree, vmm::ADDRESS_FREE;
    /// `cuMemUnmap`.
    vmm cuMemUnmap(p: u64, size: usize) pads(a, b, c) => CuMemUnmap, vmm::UNMAP;
    /// `cuMemSetAccess`.
    vmm cuMemSetAccess(p: u64, size: usize, desc: *const c_void, count: usize) pads(a) => CuMemSetAccess, vmm::SET_ACCESS;
}

caller_hook! {
    /// `cuMemImportFromShareableHandle`: the imported physical handle (size unknown here).
    cuMemImportFromShareableHandle, Driver, fn(h: *mut u64, os: *mut c_void, kind: c_int) pads(a, b) -> c_int, err = NO_DRIVER, forward_nested,
    |real, ra| {
        let d = Depth::enter();
        let r = real(h, os, kind);
        // Safety: reads the out-pointer only when it is non-null and the call succeeded.
        if d.outer() { emit::alloc(&d, Api::CuMemImportFromShareableHandle, mem::IPC_IMPORT, unsafe { out(h, r) }, 0, 0, r, ra) }
        r
    }
}

caller_hook! {
    /// `cuMemAddressReserve`.
    cuMemAddressReserve, Driver, fn(p: *mut u64, size: usize, align: usize, addr: u64, flags: c_ulonglong) pads() -> c_int, err = NO_DRIVER, forward_nested,
    |real, ra| {
        let d = Depth::enter();
        let r = real(p, size, align, addr, flags);
        // Safety: reads the out-pointer only when it is non-null and the call succeeded.
        if d.outer() { emit::vmm(&d, Api::CuMemAddressReserve, vmm::RESERVE, unsafe { out(p, r) }, size as u64, 0, 0, r, ra) }
        r
    }
}

caller_hook! {
    /// `cuMemCreate`: physical memory, recorded as an allocation of the handle.
    cuMemCreate, Driver, fn(h: *mut u64, size: usize, prop: *const c_void, flags: c_ulonglong) pads(a) -> c_int, err = NO_DRIVER, forward_nested,
    |real, ra| {
        let d = Depth::enter();
        let r = real(h, size, prop, flags);
        // Safety: reads the out-pointer only when it is non-null and the call succeeded.
        if d.outer() { emit::alloc(&d, Api::CuMemCreate, mem::PHYSICAL, unsafe { out(h, r) }, size as u64, 0, r, ra) }
        r
    }
}

caller_hook! {
    /// `cuMemMap`.
    cuMemMap, Driver, fn(p: u64, size: usize, offset: usize, h: u64, flags: c_ulonglong) pads() -> c_int, err = NO_DRIVER, forward_nested,
    |real, ra| {
        let d = Depth::enter();
        let r = real(p, size, offset, h, flags);
        if d.outer() { emit::vmm(&d, Api::CuMemMap, vmm::MAP, p, size as u64, h, offset as u64, r, ra) }
        r
    }
}

/// Driver allocation and VMM hooks.
pub const ALL: &[HookDesc] = &[
    cuMemAlloc_v2::DESC,
    cuMemFree_v2::DESC,
    cuMemAllocAsync::DESC,
    cuMemAllocAsync_ptsz::DESC,
    cuMemFreeAsync::DESC,
    cuMemFreeAsync_ptsz::DESC,
    cuMemAllocFromPoolAsync::DESC,
    cuMemAllocFromPoolAsync_ptsz::DESC,
    cuMemAllocManaged::DESC,
    cuMemAllocPitch_v2::DESC,
    cuMemHostAlloc::DESC,
    cuMemAllocHost_v2::DESC,
    cuMemFreeHost::DESC,
    cuMemHostRegister_v2::DESC,
    cuMemHostUnregister::DESC,
    cuMemPoolTrimTo::DESC,
    cuIpcOpenMemHandle_v2::DESC,
    cuIpcCloseMemHandle::DESC,
    cuMemImportFromShareableHandle::DESC,
    cuMemAddressReserve::DESC,
    cuMemAddressFree::DESC,
    cuMemCreate::DESC,
    cuMemRelease::DESC,
    cuMemMap::DESC,
    cuMemUnmap::DESC,
    cuMemSetAccess::DESC,
];
