//! Building raw events from hook arguments. Each entry point runs inside `catch_unwind`: a panic
//! here loses one event, never the host's call (which has already returned).

use std::ffi::{c_char, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};

use trace::Api;

use crate::raw::{Depth, FuncKind, RawEvent, RawKind};
use crate::state;

#[inline(always)]
fn guarded(f: impl FnOnce()) {
    let _ = catch_unwind(AssertUnwindSafe(f));
}

/// An allocation call returned.
#[inline]
pub fn alloc(d: &Depth, api: Api, mem: u8, addr: u64, size: u64, stream: u64, result: i32, caller: usize) {
    guarded(|| {
        state::record(RawEvent {
            kind: RawKind::Alloc as u8,
            api: api.code(),
            tid: d.tid(),
            sub: mem,
            addr: if result == 0 { addr } else { 0 },
            size,
            stream,
            result,
            caller: caller as u64,
            ..RawEvent::default()
        })
    })
}

/// A free call returned.
#[inline]
pub fn free(d: &Depth, api: Api, mem: u8, addr: u64, stream: u64, result: i32, caller: usize) {
    guarded(|| {
        state::record(RawEvent {
            kind: RawKind::Free as u8,
            api: api.code(),
            tid: d.tid(),
            sub: mem,
            addr,
            stream,
            result,
            caller: caller as u64,
            ..RawEvent::default()
        })
    })
}

/// A VMM call returned.
#[inline]
#[allow(clippy::too_many_arguments)]
pub fn vmm(d: &Depth, api: Api, op: u8, addr: u64, size: u64, handle: u64, offset: u64, result: i32, caller: usize) {
    guarded(|| {
        state::record(RawEvent {
            kind: RawKind::Vmm as u8,
            api: api.code(),
            tid: d.tid(),
            sub: op,
            addr,
            size,
            aux: handle,
            offset,
            result,
            caller: caller as u64,
            ..RawEvent::default()
        })
    })
}

/// A launch returned.
#[inline]
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
    guarded(|| {
        if !state::config().kernels {
            return;
        }
        state::record(RawEvent {
            kind: RawKind::Launch as u8,
            api: api.code(),
            tid: d.tid(),
            sub: func as u8,
            aux: f,
            grid,
            block,
            shared,
            stream,
            result,
            ..RawEvent::default()
        })
    })
}

/// A pool trim returned.
#[inline]
pub fn trim(d: &Depth, api: Api, pool: u64, keep: u64, result: i32) {
    guarded(|| {
        state::record(RawEvent {
            kind: RawKind::PoolTrim as u8,
            api: api.code(),
            tid: d.tid(),
            addr: pool,
            size: keep,
            result,
            ..RawEvent::default()
        })
    })
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
        let owned = CString::from(unsafe { CStr::from_ptr(text) });
        state::record(RawEvent {
            kind: RawKind::Marker as u8,
            tid: crate::raw::tid(),
            aux: owned.into_raw() as u64,
            ..RawEvent::default()
        })
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
