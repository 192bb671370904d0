//! Building raw events from hook arguments. Each entry point runs inside `catch_unwind`: a panic
//! here loses one event, never the host's call (which has already returned). The common path
//! inside it is plain moves, loads and stores, so LLVM inlines the whole guarded closure into the
//! hook (no `do_call` frame, no copy of the event).

use std::ffi::{c_char, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

use trace::Api;

use crate::event::{pack, result16, FuncKind, RawEvent, RawKind};
use crate::lifecycle;
use crate::raw::Depth;

/// The handle or address a successful call wrote through its out-pointer `p` (an 8-byte
/// `CUdeviceptr`, pointer or handle), or 0 when the call failed or `p` is null.
///
/// # Safety
/// `p` is null or valid for reads of 8 bytes once the call succeeded.
#[inline(always)]
pub unsafe fn out<T>(p: *mut T, r: std::ffi::c_int) -> u64 {
    const { assert!(std::mem::size_of::<T>() == 8) };
    if r == 0 && !p.is_null() {
        // Safety: checked non-null; the real call wrote these 8 bytes on success.
        unsafe { p.cast::<u64>().read() }
    } else {
        0
    }
}

#[inline(always)]
fn guarded(f: impl FnOnce()) {
    let _ = catch_unwind(AssertUnwindSafe(f));
}

/// An allocation call returned.
#[inline(always)]
pub fn alloc(d: &Depth, api: Api, mem: u8, addr: u64, size: u64, stream: u64, result: i32, caller: usize) {
    let addr = if result == 0 { addr } else { 0 };
    memory(d, RawKind::Alloc, api, mem, addr, size, stream, result, caller)
}

/// A free call returned.
#[inline(always)]
pub fn free(d: &Depth, api: Api, mem: u8, addr: u64, stream: u64, result: i32, caller: usize) {
    memory(d, RawKind::Free, api, mem, addr, 0, stream, result, caller)
}

/// An allocation or free: one event layout (the table in [`RawEvent`]), inlined into each hook
/// with its kind a constant.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn memory(d: &Depth, kind: RawKind, api: Api, mem: u8, addr: u64, size: u64, stream: u64, result: i32, caller: usize) {
    let ev = RawEvent {
        kind,
        api,
        sub: mem,
        addr,
        size,
        stream,
        result: result16(result),
        caller: caller as u64,
        ..RawEvent::default()
    };
    guarded(|| lifecycle::record(d, ev))
}

/// A VMM call returned.
#[inline]
#[allow(clippy::too_many_arguments)]
pub fn vmm(d: &Depth, api: Api, op: u8, addr: u64, size: u64, handle: u64, offset: u64, result: i32, caller: usize) {
    let ev = RawEvent {
        kind: RawKind::Vmm,
        api,
        sub: op,
        addr,
        size,
        aux: handle,
        offset,
        result: result16(result),
        caller: caller as u64,
        ..RawEvent::default()
    };
    guarded(|| lifecycle::record(d, ev))
}

/// Whether launches are recorded (`MEMTRACE_KERNELS`), without a `OnceLock` check per launch.
static KERNELS: AtomicU8 = AtomicU8::new(UNKNOWN);
const UNKNOWN: u8 = 2;

#[inline(always)]
fn kernels_on() -> bool {
    match KERNELS.load(Ordering::Relaxed) {
        UNKNOWN => kernels_first(),
        v => v == 1,
    }
}

/// The first launch reads the configuration (which may run its one-time load).
#[cold]
#[inline(never)]
fn kernels_first() -> bool {
    catch_unwind(|| {
        let on = crate::config::config().kernels;
        KERNELS.store(u8::from(on), Ordering::Relaxed);
        on
    })
    .unwrap_or(false)
}

/// A launch returned.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub fn launch(
    d: &Depth,
    api: Api,
    func: FuncKind,
    f: u64,
    grid: [u32; 3],
    block: [u32; 3],
    shared: u32,
    stream: u64,
    result: i32,
) {
    // Outside the guarded closure: its first call may read the configuration, and a closure
    // with only the common path in it is inlined whole.
    if !kernels_on() {
        return;
    }
    let ev = RawEvent {
        kind: RawKind::Launch,
        api,
        sub: func as u8,
        addr: f,
        size: pack(grid[0], grid[1]),
        aux: pack(grid[2], block[0]),
        offset: pack(block[1], block[2]),
        caller: u64::from(shared),
        stream,
        result: result16(result),
        ts: 0,
    };
    guarded(|| lifecycle::record(d, ev))
}

/// A pool trim returned.
#[inline]
pub fn trim(d: &Depth, api: Api, pool: u64, keep: u64, result: i32) {
    let ev = RawEvent {
        kind: RawKind::PoolTrim,
        api,
        addr: pool,
        size: keep,
        result: result16(result),
        ..RawEvent::default()
    };
    guarded(|| lifecycle::record(d, ev))
}

/// A marker (user call or NVTX range push). Markers are rare, so copying the text here is fine.
///
/// # Safety
/// `text` is null or a NUL-terminated string.
pub unsafe fn marker(text: *const c_char) {
    if text.is_null() {
        return;
    }
    guarded(|| {
        // Safety: the caller passes a NUL-terminated string (the C API contract).
        let bytes = unsafe { CStr::from_ptr(text) }.to_bytes_with_nul();
        // Fallible: a copy that cannot be allocated drops the marker, where `CString::from`
        // would abort the host.
        let mut copy = Vec::new();
        if copy.try_reserve_exact(bytes.len()).is_err() {
            crate::ring::LOST.fetch_add(1, Ordering::Relaxed); // this marker alone
            return;
        }
        copy.extend_from_slice(bytes);
        // Safety: `bytes` ends in its only NUL, as `CStr` guarantees.
        let owned = unsafe { CString::from_vec_with_nul_unchecked(copy) };
        lifecycle::record_any(RawEvent { kind: RawKind::Marker, aux: owned.into_raw() as u64, ..RawEvent::default() })
    })
}

static MISSING_LOGGED: AtomicBool = AtomicBool::new(false);

/// The real function could not be found: the hook returns the API's error code instead of
/// jumping through a null pointer. Logged once.
#[cold]
pub fn missing(name: &CStr) {
    if !MISSING_LOGGED.swap(true, Ordering::Relaxed) {
        crate::log!(Warn, "no real {name:?} is loaded (neither RTLD_NEXT nor by soname); returning an error code");
    }
}
