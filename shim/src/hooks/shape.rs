//! The two hook shapes, as macros: `caller_hook!` (records the caller's return address) and
//! `plain_hook!` (arguments untouched, by-value structs included). Both expand to a module with:
//! - `exported`: the symbol the dynamic linker binds the program's calls to; it forwards to the
//!   next definition after the shim (`REAL`);
//! - `resolved`: the wrapper handed out by the resolver hooks; it forwards to exactly the pointer
//!   the real resolver returned (`TARGET`);
//! - `DESC`: its row in the identity table.
//!
//! Every entry point is a naked jump into a Rust function. Recording hooks (`forward_nested`)
//! first check, in a few instructions, whether the call is nested inside another hook, and if so
//! jump straight to the real function (see `forward_check`).

use std::ffi::CStr;

use crate::real::{Lib, Slot};

/// One hooked entry point: its row in the identity table ([`super::table`]).
pub struct HookDesc {
    /// Exact name.
    pub name: &'static CStr,
    /// Where the real one lives.
    pub lib: Lib,
    /// Our exported symbol.
    pub exported: unsafe extern "C" fn(),
    /// Our resolver-side wrapper.
    pub resolved: unsafe extern "C" fn(),
    /// The next definition after the shim.
    pub real: &'static Slot,
    /// What a resolver returned.
    pub target: &'static Slot,
}

/// Passes the caller's return address in the 6th integer argument register, then jumps to the
/// Rust body (whose first five integer arguments are the hook's, padded).
#[cfg(target_arch = "x86_64")]
macro_rules! trampoline {
    () => {
        "mov r9, qword ptr [rsp]\njmp {inner}"
    };
}
#[cfg(target_arch = "aarch64")]
macro_rules! trampoline {
    () => {
        "mov x5, x30\nb {inner}"
    };
}
pub(crate) use trampoline;

/// Jumps to the Rust body, arguments untouched.
#[cfg(target_arch = "x86_64")]
macro_rules! jump {
    () => {
        "jmp {inner}"
    };
}
#[cfg(target_arch = "aarch64")]
macro_rules! jump {
    () => {
        "b {inner}"
    };
}
pub(crate) use jump;

/// The front of a recording hook's entry point (`forward_nested`). When a hook already runs on
/// this thread, or the thread is the shim's own, the call records nothing, so it jumps straight
/// to the real function (`{slot}`: the hook's `REAL` or `TARGET`), arguments and stack untouched:
/// the runtime's launch reaching the driver's `cuLaunchKernel` through a wrapped pointer then
/// costs about ten instructions instead of a second hook. An empty slot falls through (the Rust
/// body resolves it). Only `rax` and `r11` are used: scratch registers that carry no argument
/// of these (non-variadic) functions. The offsets are `raw::Tls`'s `depth` and `internal`
/// (asserted there); the block is the initial-exec TLS block declared in `raw`.
#[cfg(target_arch = "x86_64")]
macro_rules! forward_check {
    () => {
        "mov rax, qword ptr [rip + {slot}]
        test rax, rax
        jz 2f
        mov r11, qword ptr [rip + memtrace_tls_block@GOTTPOFF]
        add r11, qword ptr fs:[0]
        cmp dword ptr [r11], 0
        jne 3f
        cmp byte ptr [r11 + 4], 0
        je 2f
        3:
        jmp rax
        2:"
    };
}
// Elsewhere the Rust body makes the same check (`raw::nested`); the slot is only named here, in
// an assembler comment, because every asm operand must be used.
#[cfg(not(target_arch = "x86_64"))]
macro_rules! forward_check {
    () => {
        "/* {slot} */"
    };
}
pub(crate) use forward_check;

/// A naked entry point: `$jump` to `$inner`, behind the nested-call check for recording hooks.
macro_rules! entry {
    ($jump:expr, $inner:path, $slot:path $(,)?) => {
        core::arch::naked_asm!($jump, inner = sym $inner)
    };
    ($jump:expr, $inner:path, $slot:path, forward_nested) => {
        core::arch::naked_asm!($crate::hooks::shape::forward_check!(), $jump, slot = sym $slot, inner = sym $inner)
    };
}
pub(crate) use entry;

/// Whether the hook records (`forward_nested`).
macro_rules! records {
    () => {
        false
    };
    (forward_nested) => {
        true
    };
}
pub(crate) use records;

/// The start of a recording hook's body, after `$real` is bound: the nested-call check where
/// the entry point does not make it (see `forward_check`), then, on the process's first
/// outermost recording calls, starting the writer and CUPTI before the call is forwarded
/// (`lifecycle::start_before_call`).
macro_rules! recording_prologue {
    ($real:ident($($arg:ident),*)) => {
        if !cfg!(target_arch = "x86_64") && $crate::raw::nested() {
            return $real($($arg),*);
        }
        // Nested calls reach here too while `REAL` is still unresolved (the entry stub lets an
        // empty slot through): only an outermost call starts anything.
        if $crate::lifecycle::STARTING.load(std::sync::atomic::Ordering::Relaxed) && !$crate::raw::nested() {
            $crate::lifecycle::start_before_call();
        }
    };
}
pub(crate) use recording_prologue;

/// Everything a hook is, whatever its shape: the module `$name` holding its slots, its name, the
/// Rust body that calls the real function (after the recording prologue, for recording hooks),
/// its identity-table row, and its two entry points (the exported symbol and the wrapper handed
/// out by resolvers), each a naked `via` jump to a Rust function that calls the body with its
/// slot's function. `$pad`s fill the argument registers the jump leaves unused; `$ra` is the
/// caller's return address, for hooks that record it.
macro_rules! hook_parts {
    (
        $(#[$doc:meta])*
        $name:ident, $lib:ident, fn($($arg:ident: $ty:ty),*) pads($($pad:ident),*) -> $ret:ty, err = $err:expr,
        fwd($($fwd:ident)?), ra($($ra:ident)?), via($($via:tt)*), |$real:ident| $body:block
    ) => {
        $(#[$doc])*
        #[allow(non_snake_case, clippy::missing_safety_doc)]
        pub mod $name {
            #[allow(unused_imports)]
            use super::*;

            /// The next definition after the shim.
            pub static REAL: $crate::real::Slot = $crate::real::Slot::new();
            /// What a resolver returned for this function.
            pub static TARGET: $crate::real::Slot = $crate::real::Slot::new();
            /// The exact entry-point name.
            pub const NAME: &std::ffi::CStr = match std::ffi::CStr::from_bytes_with_nul(concat!(stringify!($name), "\0").as_bytes()) {
                Ok(c) => c,
                Err(_) => panic!("hook names are NUL-free"),
            };
            type Real = unsafe extern "C" fn($($ty),*) -> $ret;

            #[inline(always)]
            unsafe fn body(real: usize, $($ra: usize,)? $($arg: $ty),*) -> $ret {
                if real == 0 {
                    $crate::hooks::emit::missing(NAME);
                    return $err;
                }
                // Safety: `real` is the definition of exactly this entry point (the next one after
                // the shim, or what the real resolver returned for this name).
                let f: Real = unsafe { std::mem::transmute::<usize, Real>(real) };
                // Safety: the one unsafe call of every hook: the caller's own arguments, unchanged,
                // to the real function of the same signature. The caller's obligations under the
                // CUDA API contract are exactly the real function's.
                #[allow(unused_unsafe)]
                let $real = move |$($arg: $ty),*| -> $ret { unsafe { f($($arg),*) } };
                if $crate::hooks::shape::records!($($fwd)?) {
                    $crate::hooks::shape::recording_prologue!($real($($arg),*));
                }
                $body
            }

            /// Identity-table row.
            pub const DESC: $crate::hooks::shape::HookDesc = $crate::hooks::shape::HookDesc {
                name: NAME,
                lib: $crate::real::Lib::$lib,
                exported,
                resolved,
                real: &REAL,
                target: &TARGET,
            };

            /// The exported symbol.
            #[unsafe(naked)]
            #[cfg_attr(not(test), export_name = stringify!($name))]
            pub unsafe extern "C" fn exported() {
                $crate::hooks::shape::entry!($($via)*, exported_fn, REAL $(, $fwd)?)
            }

            /// The exported symbol's body.
            pub unsafe extern "C" fn exported_fn($($arg: $ty,)* $($pad: usize,)* $($ra: usize)?) -> $ret {
                $(let _ = $pad;)*
                let real = REAL.get($crate::real::Lib::$lib, NAME);
                // Safety: forwarding the caller's own arguments to the real function.
                unsafe { body(real, $($ra,)? $($arg),*) }
            }

            /// The wrapper handed out by resolvers.
            #[unsafe(naked)]
            pub unsafe extern "C" fn resolved() {
                $crate::hooks::shape::entry!($($via)*, resolved_fn, TARGET $(, $fwd)?)
            }

            /// The resolver wrapper's body.
            pub unsafe extern "C" fn resolved_fn($($arg: $ty,)* $($pad: usize,)* $($ra: usize)?) -> $ret {
                $(let _ = $pad;)*
                // Safety: TARGET is what the real resolver returned for this name.
                unsafe { body(TARGET.load(), $($ra,)? $($arg),*) }
            }
        }
    };
}
pub(crate) use hook_parts;

/// A hook that records its caller module. At most five integer/pointer arguments: the entry
/// points pass the return address in the sixth (`trampoline`). A trailing `forward_nested`
/// after `err = …` marks a recording hook (see `forward_check`); resolver hooks never take it,
/// because a pointer handed out inside another call must still be wrapped.
macro_rules! caller_hook {
    (
        $(#[$doc:meta])*
        $name:ident, $lib:ident, fn($($arg:ident: $ty:ty),*) pads($($pad:ident),*) -> $ret:ty, err = $err:expr
        $(, $fwd:ident)?,
        |$real:ident, $ra:ident| $body:block
    ) => {
        $crate::hooks::shape::hook_parts! {
            $(#[$doc])*
            $name, $lib, fn($($arg: $ty),*) pads($($pad),*) -> $ret, err = $err, fwd($($fwd)?), ra($ra),
            via($crate::hooks::shape::trampoline!()), |$real| $body
        }
    };
}
pub(crate) use caller_hook;

/// A hook without a caller module (launches, resolvers, by-value struct arguments). The entry
/// points are naked jumps to Rust functions of the same signature (behind the nested-call check
/// for `forward_nested` hooks), so the arguments, including by-value structs and stack
/// arguments, are never touched on the way.
macro_rules! plain_hook {
    (
        $(#[$doc:meta])*
        $name:ident, $lib:ident, fn($($arg:ident: $ty:ty),*) -> $ret:ty, err = $err:expr
        $(, $fwd:ident)?,
        |$real:ident| $body:block
    ) => {
        $crate::hooks::shape::hook_parts! {
            $(#[$doc])*
            $name, $lib, fn($($arg: $ty),*) pads() -> $ret, err = $err, fwd($($fwd)?), ra(),
            via($crate::hooks::shape::jump!()), |$real| $body
        }
    };
}
pub(crate) use plain_hook;
