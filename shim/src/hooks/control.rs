//! Process-level exports: the start of `main` and the exit wrappers, which record the exit status
//! and flush first, markers, NVTX ranges.

use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::real::{Lib, Slot};
use crate::{lifecycle, state};

type ExitFn = unsafe extern "C" fn(c_int) -> !;

static REAL_EXIT: Slot = Slot::new();
static REAL_UEXIT: Slot = Slot::new();
static REAL_UEXIT2: Slot = Slot::new();
static REAL_QEXIT: Slot = Slot::new();

/// Ends the process with no libc: where the real function that would cannot be found.
fn exit_group(status: c_int) -> ! {
    // Safety: the exit_group syscall never returns and needs no libc state.
    unsafe { libc::syscall(libc::SYS_exit_group, status) };
    unreachable!("exit_group returned");
}

fn die(slot: &Slot, name: &std::ffi::CStr, status: c_int) -> ! {
    let p = slot.get(Lib::Libc, name);
    if p == 0 {
        exit_group(status);
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

type MainFn = unsafe extern "C" fn(c_int, *mut *mut c_char, *mut *mut c_char) -> c_int;
type StartMainFn =
    unsafe extern "C" fn(MainFn, c_int, *mut *mut c_char, *mut c_void, *mut c_void, *mut c_void, *mut c_void) -> c_int;

static REAL_START_MAIN: Slot = Slot::new();
/// The program's `main`, which [`main_returning`] calls.
static PROGRAM_MAIN: AtomicUsize = AtomicUsize::new(0);

/// `__libc_start_main`, which a program's `_start` calls before anything else runs: start the
/// program with its `main` called through [`main_returning`]. Why: a return from `main` ends the
/// process through libc's internal `exit`, which no export sees, and so its status went
/// unrecorded; Python's is such a return (`sys.exit(3)` and an uncaught exception's 1 included).
/// The other arguments are passed on untouched (glibc's `init`, `fini`, `rtld_fini` and stack
/// end, whatever the program was linked against).
#[cfg_attr(not(test), export_name = "__libc_start_main")]
pub unsafe extern "C" fn libc_start_main(
    main: MainFn,
    argc: c_int,
    argv: *mut *mut c_char,
    init: *mut c_void,
    fini: *mut c_void,
    rtld_fini: *mut c_void,
    stack_end: *mut c_void,
) -> c_int {
    let p = REAL_START_MAIN.get(Lib::Libc, c"__libc_start_main");
    if p == 0 {
        // No libc to start the program with: nothing could run it, with or without the shim.
        let msg = b"memtrace: the real __libc_start_main was not found; cannot start the program\n";
        // Safety: write(2) needs no libc state; the buffer is valid.
        unsafe { libc::write(2, msg.as_ptr().cast(), msg.len()) };
        exit_group(127);
    }
    PROGRAM_MAIN.store(main as usize, Ordering::Release);
    // Safety: the next definition of this name (libc's, or another preloaded interposer's),
    // with glibc's x86_64/aarch64 signature, the only targets this crate builds for (`shape.rs`).
    let real: StartMainFn = unsafe { std::mem::transmute::<usize, StartMainFn>(p) };
    // Safety: the caller's arguments, with `main` replaced by a function of the same signature.
    unsafe { real(main_returning, argc, argv, init, fini, rtld_fini, stack_end) }
}

/// The program's `main`, its returned status remembered for `ProcessExit` (as `exit`'s is);
/// libc then exits with it, and our atexit handler completes the trace.
unsafe extern "C" fn main_returning(argc: c_int, argv: *mut *mut c_char, envp: *mut *mut c_char) -> c_int {
    // Safety: stored by `libc_start_main` from the program's own `main` before libc calls this.
    let main: MainFn = unsafe { std::mem::transmute::<usize, MainFn>(PROGRAM_MAIN.load(Ordering::Acquire)) };
    // Safety: libc's arguments for `main`, passed on.
    let status = unsafe { main(argc, argv, envp) };
    // A forked child owns a trace of its own (`state::reset_in_child`); a vfork child, which
    // cannot return from `main`, is the only process here that owns none.
    if state::is_owner() {
        state::EXIT_STATUS.store(i64::from(status), Ordering::Release);
    }
    status
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
