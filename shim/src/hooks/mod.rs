//! The exported hooks. Each hooked function gets a module with:
//! - `exported`: the symbol the dynamic linker binds the program's calls to; it forwards to the
//!   next definition after the shim (`REAL`);
//! - `resolved`: the wrapper handed out by the resolver hooks; it forwards to exactly the pointer
//!   the real resolver returned (`TARGET`);
//! - `DESC`: its row in the identity table.
//!
//! Hooks that record a caller module enter through a naked trampoline that passes the return
//! address as an extra trailing argument (no frame pointers or compiler intrinsics needed).

// The exports are C entry points whose safety contract is the CUDA/libc API they stand in for,
// and whose arity is CUDA's.
#![allow(clippy::missing_safety_doc, clippy::too_many_arguments)]

use std::ffi::c_void;

pub mod array;
pub mod control;
pub mod driver;
pub mod emit;
pub mod launch;
pub mod resolve;
pub mod runtime;
pub mod table;

/// `cudaStream_t`, `CUstream`, pools, graphs: opaque handles.
pub type Handle = *mut c_void;

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

/// A hook that records its caller module. At most five integer/pointer arguments.
macro_rules! caller_hook {
    (
        $(#[$doc:meta])*
        $name:ident, $lib:ident, fn($($arg:ident: $ty:ty),*) pads($($pad:ident),*) -> $ret:ty, err = $err:expr,
        |$real:ident, $ra:ident| $body:block
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

            /// The exported symbol.
            #[unsafe(naked)]
            #[cfg_attr(not(test), export_name = stringify!($name))]
            pub unsafe extern "C" fn exported() {
                core::arch::naked_asm!($crate::hooks::trampoline!(), inner = sym exported_inner)
            }

            unsafe extern "C" fn exported_inner($($arg: $ty,)* $($pad: usize,)* ra: usize) -> $ret {
                $(let _ = $pad;)*
                let real = REAL.get($crate::real::Lib::$lib, NAME);
                // Safety: forwarding the caller's own arguments to the real function.
                unsafe { body(real, ra, $($arg),*) }
            }

            /// The wrapper handed out by resolvers.
            #[unsafe(naked)]
            pub unsafe extern "C" fn resolved() {
                core::arch::naked_asm!($crate::hooks::trampoline!(), inner = sym resolved_inner)
            }

            unsafe extern "C" fn resolved_inner($($arg: $ty,)* $($pad: usize,)* ra: usize) -> $ret {
                $(let _ = $pad;)*
                // Safety: as above; TARGET is what the real resolver returned for this name.
                unsafe { body(TARGET.load(), ra, $($arg),*) }
            }

            #[inline(always)]
            unsafe fn body(real: usize, $ra: usize, $($arg: $ty),*) -> $ret {
                if real == 0 {
                    $crate::hooks::emit::missing(NAME);
                    return $err;
                }
                // Safety: `real` is the definition of exactly this entry point (the next one
                // after the shim, or what the real resolver returned for this name).
                let f: Real = unsafe { std::mem::transmute::<usize, Real>(real) };
                // Safety: the one unsafe call of every hook: the caller's own arguments,
                // unchanged, to the real function of the same signature. The caller's
                // obligations under the CUDA API contract are exactly the real function's.
                #[allow(unused_unsafe)]
                let $real = move |$($arg: $ty),*| -> $ret { unsafe { f($($arg),*) } };
                $body
            }

            /// Identity-table row.
            pub const DESC: $crate::hooks::table::HookDesc = $crate::hooks::table::HookDesc {
                name: NAME,
                lib: $crate::real::Lib::$lib,
                exported,
                resolved,
                real: &REAL,
                target: &TARGET,
            };
        }
    };
}
pub(crate) use caller_hook;

/// A hook without a caller module (launches, resolvers, by-value struct arguments).
macro_rules! plain_hook {
    (
        $(#[$doc:meta])*
        $name:ident, $lib:ident, fn($($arg:ident: $ty:ty),*) -> $ret:ty, err = $err:expr,
        |$real:ident| $body:block
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

            /// The exported symbol.
            #[cfg_attr(not(test), export_name = stringify!($name))]
            pub unsafe extern "C" fn exported_fn($($arg: $ty),*) -> $ret {
                let real = REAL.get($crate::real::Lib::$lib, NAME);
                // Safety: forwarding the caller's own arguments.
                unsafe { body(real, $($arg),*) }
            }

            /// The wrapper handed out by resolvers.
            pub unsafe extern "C" fn resolved_fn($($arg: $ty),*) -> $ret {
                // Safety: TARGET is what the real resolver returned for this name.
                unsafe { body(TARGET.load(), $($arg),*) }
            }

            #[inline(always)]
            unsafe fn body(real: usize, $($arg: $ty),*) -> $ret {
                if real == 0 {
                    $crate::hooks::emit::missing(NAME);
                    return $err;
                }
                // Safety: `real` is the definition of exactly this entry point (the next one
                // after the shim, or what the real resolver returned for this name).
                let f: Real = unsafe { std::mem::transmute::<usize, Real>(real) };
                // Safety: the one unsafe call of every hook: the caller's own arguments,
                // unchanged, to the real function of the same signature. The caller's
                // obligations under the CUDA API contract are exactly the real function's.
                #[allow(unused_unsafe)]
                let $real = move |$($arg: $ty),*| -> $ret { unsafe { f($($arg),*) } };
                $body
            }

            /// Identity-table row.
            pub const DESC: $crate::hooks::table::HookDesc = $crate::hooks::table::HookDesc {
                name: NAME,
                lib: $crate::real::Lib::$lib,
                // Safety: only the address is used (for identity and to hand out).
                exported: unsafe { std::mem::transmute::<Real, unsafe extern "C" fn()>(exported_fn as Real) },
                resolved: unsafe { std::mem::transmute::<Real, unsafe extern "C" fn()>(resolved_fn as Real) },
                real: &REAL,
                target: &TARGET,
            };
        }
    };
}
pub(crate) use plain_hook;
