//! Process-level exports: exit wrappers that flush first, markers, NVTX ranges.

use std::ffi::{c_char, c_int};
use std::sync::atomic::Ordering;

use crate::real::{Lib, Slot};
use crate::{lifecycle, state};

type ExitFn = unsafe extern "C" fn(c_int) -> !;

static REAL_EXIT: Slot = Slot::new();
static REAL_UEXIT: Slot = Slot::new();
static REAL_UEXIT2: Slot = Slot::new();
static REAL_QEXIT: Slot = Slot::new();

fn die(slot: &Slot, name: &std::ffi::CStr, status: c_int) -> ! {
    let p = slot.get(Lib::Libc, name);
    if p == 0 {
        // Safety: the exit_group syscall never returns and needs no libc state.
        unsafe { libc::syscall(libc::SYS_exit_group, status) };
        unreachable!("exit_group returned");
    }
    // Safety: the real libc function of this exact name and signature.
    let f: ExitFn = unsafe { std::mem::transmute::<usize, ExitFn>(p) };
    // Safety: forwarding the caller's status.
    unsafe { f(status) }
}

/// `exit`: remember the status for `ProcessExit`, then run the real `exit` (whose atexit
/// handlers include ours, which completes the trace).
#[cfg_attr(not(test), export_name = "exit")]
pub unsafe extern "C" fn exit_export(status: c_int) -> ! {
    if state::is_owner() {
        state::EXIT_STATUS.store(i64::from(status), Ordering::Release);
    }
    die(&REAL_EXIT, c"exit", status)
}

/// `quick_exit`: as `exit`, remember the status, then run the real one (whose at_quick_exit
/// handlers include ours, which completes the trace). C11 allows it in a signal handler, which
/// cannot be told from here: with `MEMTRACE_CUPTI=1` the completion then flushes CUPTI, not
/// async-signal-safe, inside that handler (as `_exit` does; a known gap, `shim/README.md`).
#[cfg_attr(not(test), export_name = "quick_exit")]
pub unsafe extern "C" fn quick_exit_export(status: c_int) -> ! {
    if state::is_owner() {
        state::EXIT_STATUS.store(i64::from(status), Ordering::Release);
    }
    die(&REAL_QEXIT, c"quick_exit", status)
}

/// `_exit`: bypasses atexit, so complete the trace first. Async-signal-safe and so called from
/// signal handlers, which cannot be told from here: with `MEMTRACE_CUPTI=1` the completion
/// flushes CUPTI, not async-signal-safe, there too (a known gap, `shim/README.md`).
#[cfg_attr(not(test), export_name = "_exit")]
pub unsafe extern "C" fn underscore_exit(status: c_int) -> ! {
    let _ = std::panic::catch_unwind(|| lifecycle::finish(Some(status), None));
    die(&REAL_UEXIT, c"_exit", status)
}

/// `_Exit`: as `_exit`.
#[cfg_attr(not(test), export_name = "_Exit")]
pub unsafe extern "C" fn underscore_exit2(status: c_int) -> ! {
    let _ = std::panic::catch_unwind(|| lifecycle::finish(Some(status), None));
    die(&REAL_UEXIT2, c"_Exit", status)
}

/// Record a marker: `iter:<n>`, `phase:<forward|backward|optimizer|data|other>` or free text.
///
/// From Python:
/// ```python
/// import ctypes
/// mark = ctypes.CDLL(None).memtrace_mark   # resolves in the preloaded libmemtrace.so
/// mark.argtypes = [ctypes.c_char_p]
/// mark(b"iter:3")
/// ```
/// Without the shim preloaded the attribute lookup raises `AttributeError`; guard it with
/// `getattr(ctypes.CDLL(None), "memtrace_mark", None)`.
#[cfg_attr(not(test), export_name = "memtrace_mark")]
pub unsafe extern "C" fn memtrace_mark(text: *const c_char) {
    // Safety: the caller passes a C string, per this function's C contract.
    unsafe { crate::hooks::emit::marker(text) };
}

type PushFn = unsafe extern "C" fn(*const c_char) -> c_int;
type PopFn = unsafe extern "C" fn() -> c_int;
static REAL_PUSH: Slot = Slot::new();
static REAL_POP: Slot = Slot::new();

/// `nvtxRangePushA`: recorded as a marker with the range text, then forwarded (when an NVTX
/// library is loaded; otherwise returns -1, NVTX's error value).
#[cfg_attr(not(test), export_name = "nvtxRangePushA")]
pub unsafe extern "C" fn nvtx_range_push_a(text: *const c_char) -> c_int {
    // Safety: the caller passes a C string, per this function's C contract.
    unsafe { crate::hooks::emit::marker(text) };
    let p = REAL_PUSH.get(Lib::Nvtx, c"nvtxRangePushA");
    if p == 0 {
        return -1;
    }
    // Safety: the real nvtxRangePushA.
    let f: PushFn = unsafe { std::mem::transmute::<usize, PushFn>(p) };
    // Safety: forwarding the caller's argument.
    unsafe { f(text) }
}

/// `nvtxRangePop`: forwarded.
#[cfg_attr(not(test), export_name = "nvtxRangePop")]
pub unsafe extern "C" fn nvtx_range_pop() -> c_int {
    let p = REAL_POP.get(Lib::Nvtx, c"nvtxRangePop");
    if p == 0 {
        return -1;
    }
    // Safety: the real nvtxRangePop.
    let f: PopFn = unsafe { std::mem::transmute::<usize, PopFn>(p) };
    // Safety: no arguments.
    unsafe { f() }
}
