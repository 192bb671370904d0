//! Resolver hooks: `dlsym`, `dlvsym`, `cuGetProcAddress*`, `cudaGetDriverEntryPoint*`.
//!
//! Each calls the real resolver with the caller's exact arguments and then replaces exactly the
//! pointer it returned by our wrapper of the same function, found by pointer identity
//! (`table::wrap`). Asking for a resolver returns the wrapped resolver, so later look-ups stay
//! hooked. `dlsym(RTLD_NEXT | RTLD_DEFAULT, ..)` is passed through by a tail jump, so glibc still
//! sees the original caller: RTLD_NEXT keeps meaning "after the caller", which is what chained
//! interposers rely on.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};

use super::shape::plain_hook;
use super::shape::HookDesc;
use super::table;
use super::{array, driver, launch, runtime};
use crate::raw;
use crate::real;

/// Every hook, grouped by file: what a resolver's pointer is compared against. The resolvers
/// are among them, so that asking a resolver for a resolver returns the wrapped one.
pub const GROUPS: [&[HookDesc]; 5] = [runtime::ALL, driver::ALL, array::ALL, launch::ALL, ALL];

const NO_DRIVER: c_int = 3;
const NO_RUNTIME: c_int = 3;

/// Replace `*pfn` by our wrapper when the call succeeded.
///
/// # Safety
/// `pfn` is null or points to a function pointer the real resolver wrote.
unsafe fn wrap_out(r: c_int, sym: *const c_char, pfn: *mut *mut c_void) {
    if r != 0 || pfn.is_null() || sym.is_null() || raw::is_internal() {
        return;
    }
    // Safety: non-null out-pointer the caller gave the resolver.
    let p = unsafe { *pfn } as usize;
    if p == 0 {
        return;
    }
    // Safety: the resolver contract: a NUL-terminated name.
    let name = unsafe { CStr::from_ptr(sym) };
    let w = catch_unwind(AssertUnwindSafe(|| table::wrap(&GROUPS, p, name))).unwrap_or(p);
    // Safety: as above.
    unsafe { *pfn = w as *mut c_void };
}

/// The resolvers of the `cuGetProcAddress` family, a row each: the real call with the caller's
/// arguments, then the pointer it wrote replaced by our wrapper. One body for all seven; the
/// table also makes [`ALL`], in row order.
macro_rules! entry_point_hooks {
    (
        $(
            $(#[$doc:meta])*
            $name:ident, $lib:ident, err = $err:expr,
            fn($sym:ident: $sty:ty, $pfn:ident: $pty:ty $(, $arg:ident: $ty:ty)*);
        )*
    ) => {
        $(
            plain_hook! {
                $(#[$doc])*
                $name, $lib, fn($sym: $sty, $pfn: $pty $(, $arg: $ty)*) -> c_int, err = $err,
                |real| {
                    let r = real($sym, $pfn $(, $arg)*);
                    // Safety: `pfn` is the out-pointer the real resolver just wrote (or null).
                    unsafe { wrap_out(r, $sym, $pfn) };
                    r
                }
            }
        )*

        /// Resolver hooks that resolvers can hand out.
        pub const ALL: &[HookDesc] = &[$($name::DESC),*];
    };
}

// `cuGetProcAddress` is declared with the `_v2` arity: an older four-argument driver ignores the
// extra argument, so forwarding it is harmless. Likewise `cudaGetDriverEntryPoint` with CUDA 12's.
entry_point_hooks! {
    /// `cuGetProcAddress`.
    cuGetProcAddress, Driver, err = NO_DRIVER, fn(sym: *const c_char, pfn: *mut *mut c_void, ver: c_int, flags: u64, st: *mut c_int);
    /// `cuGetProcAddress_v2`.
    cuGetProcAddress_v2, Driver, err = NO_DRIVER, fn(sym: *const c_char, pfn: *mut *mut c_void, ver: c_int, flags: u64, st: *mut c_int);
    /// `cuGetProcAddress_ptsz`.
    cuGetProcAddress_ptsz, Driver, err = NO_DRIVER, fn(sym: *const c_char, pfn: *mut *mut c_void, ver: c_int, flags: u64, st: *mut c_int);
    /// `cudaGetDriverEntryPoint`.
    cudaGetDriverEntryPoint, Runtime, err = NO_RUNTIME, fn(sym: *const c_char, pfn: *mut *mut c_void, flags: u64, st: *mut c_int);
    /// `cudaGetDriverEntryPointByVersion`.
    cudaGetDriverEntryPointByVersion, Runtime, err = NO_RUNTIME, fn(sym: *const c_char, pfn: *mut *mut c_void, ver: c_uint, flags: u64, st: *mut c_int);
    /// `cudaGetDriverEntryPoint_ptsz`.
    cudaGetDriverEntryPoint_ptsz, Runtime, err = NO_RUNTIME, fn(sym: *const c_char, pfn: *mut *mut c_void, flags: u64, st: *mut c_int);
    /// `cudaGetDriverEntryPointByVersion_ptsz`.
    cudaGetDriverEntryPointByVersion_ptsz, Runtime, err = NO_RUNTIME, fn(sym: *const c_char, pfn: *mut *mut c_void, ver: c_uint, flags: u64, st: *mut c_int);
}

/// Only names that could be hooked are worth an identity check.
fn worth_wrapping(name: *const c_char) -> bool {
    if name.is_null() {
        return false;
    }
    // Safety: dlsym's contract: a NUL-terminated symbol name.
    let b = unsafe { CStr::from_ptr(name) }.to_bytes();
    b.starts_with(b"cu") || b.starts_with(b"__cuda")
}

/// What `dlsym`/`dlvsym` returned for `name`, replaced by our wrapper when it is a hooked
/// function.
fn wrapped_symbol(r: *mut c_void, name: *const c_char) -> *mut c_void {
    if r.is_null() || raw::is_internal() || !worth_wrapping(name) {
        return r;
    }
    // Safety: checked non-null by worth_wrapping; dlsym's contract: a NUL-terminated name.
    let n = unsafe { CStr::from_ptr(name) };
    catch_unwind(AssertUnwindSafe(|| table::wrap(&GROUPS, r as usize, n) as *mut c_void)).unwrap_or(r)
}

/// The body of `dlsym` for explicit handles.
unsafe extern "C" fn dlsym_hook(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    let p = real::real_dlsym_addr();
    if p == 0 {
        return std::ptr::null_mut();
    }
    // Safety: libc's dlsym, found by name in libc's own table.
    let f: real::DlsymFn = unsafe { std::mem::transmute::<usize, real::DlsymFn>(p) };
    // Safety: forwarding the caller's arguments.
    let r = unsafe { f(handle, name) };
    wrapped_symbol(r, name)
}

/// The body of `dlvsym` for explicit handles.
unsafe extern "C" fn dlvsym_hook(handle: *mut c_void, name: *const c_char, version: *const c_char) -> *mut c_void {
    let p = real::real_dlvsym_addr();
    if p == 0 {
        return std::ptr::null_mut();
    }
    // Safety: libc's dlvsym, found by name in libc's own table.
    let f: real::DlvsymFn = unsafe { std::mem::transmute::<usize, real::DlvsymFn>(p) };
    // Safety: forwarding the caller's arguments.
    let r = unsafe { f(handle, name, version) };
    wrapped_symbol(r, name)
}

extern "C" fn init_dlsym() -> usize {
    catch_unwind(real::real_dlsym_addr).unwrap_or(0)
}

extern "C" fn init_dlvsym() -> usize {
    catch_unwind(real::real_dlvsym_addr).unwrap_or(0)
}

/// An x86-64 entry point for `dlsym` or `dlvsym`: RTLD_DEFAULT (0) and RTLD_NEXT (-1) tail-jump
/// to libc's function with the caller's return address intact, because libc looks both up
/// relative to the caller (its scope, or the objects after it); explicit handles go through the
/// hook, which wraps what it returns. Before libc's function is known, `init`
/// finds it, with the three argument registers saved (three pushes also keep the stack aligned
/// for the call; `dlsym` has only two arguments, and its third register is saved for nothing).
#[cfg(target_arch = "x86_64")]
macro_rules! dl_entry {
    ($(#[$doc:meta])* $fn:ident, $symbol:literal, hook = $hook:path, real = $real:path, init = $init:path) => {
        $(#[$doc])*
        #[unsafe(naked)]
        #[cfg_attr(not(test), export_name = $symbol)]
        pub unsafe extern "C" fn $fn() {
            core::arch::naked_asm!(
                "test rdi, rdi",
                "je 2f",
                "cmp rdi, -1",
                "je 2f",
                "jmp {hook}",
                "2:",
                "mov rax, qword ptr [rip + {real}]",
                "test rax, rax",
                "je 3f",
                "jmp rax",
                "3:",
                "push rdi",
                "push rsi",
                "push rdx",
                "call {init}",
                "pop rdx",
                "pop rsi",
                "pop rdi",
                "test rax, rax",
                "je 4f",
                "jmp rax",
                "4:",
                "xor eax, eax",
                "ret",
                hook = sym $hook,
                real = sym $real,
                init = sym $init,
            )
        }
    };
}

#[cfg(target_arch = "x86_64")]
dl_entry!(
    /// `dlsym` (see `dl_entry!`); explicit handles go through [`dlsym_hook`].
    dlsym_export, "dlsym", hook = dlsym_hook, real = real::REAL_DLSYM, init = init_dlsym
);
#[cfg(target_arch = "x86_64")]
dl_entry!(
    /// `dlvsym` (see `dl_entry!`); explicit handles go through [`dlvsym_hook`].
    dlvsym_export, "dlvsym", hook = dlvsym_hook, real = real::REAL_DLVSYM, init = init_dlvsym
);

/// `dlsym` on targets without the tail-jump stub: RTLD_NEXT is resolved relative to the shim.
#[cfg(not(target_arch = "x86_64"))]
#[cfg_attr(not(test), export_name = "dlsym")]
pub unsafe extern "C" fn dlsym_export(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    // Safety: forwarding the caller's arguments.
    unsafe { dlsym_hook(handle, name) }
}

/// `dlvsym` on targets without the tail-jump stub.
#[cfg(not(target_arch = "x86_64"))]
#[cfg_attr(not(test), export_name = "dlvsym")]
pub unsafe extern "C" fn dlvsym_export(handle: *mut c_void, name: *const c_char, v: *const c_char) -> *mut c_void {
    // Safety: forwarding the caller's arguments.
    unsafe { dlvsym_hook(handle, name, v) }
}
