//! The shapes most allocation hooks of both families take, declared as a table (`memory_hooks!`),
//! one row an entry point. Every row has the same body (`@record`: the real call, then, outside
//! nested calls, its record); a shape only says what its record holds:
//! - `alloc`: a call that returns a block through its out-pointer, given a size;
//! - `free`: a call given the address (or handle) it frees;
//! - `pitch`: a pitched allocation, recorded as pitch × height bytes;
//! - `register`: a host range registered in place (its own address and size);
//! - `ipc_open`: an IPC import through its out-pointer, size unknown, from a handle passed by
//!   value (so a plain hook: no caller module);
//! - `trim`: a pool trimmed to a size it keeps;
//! - `vmm`: a VMM operation on an address range, given its address and size.
//!
//! A row names the entry point, its arguments (with the trampoline pads that fill them up to
//! five; none for `ipc_open`), and what the record holds: the API and, by shape, the memory kind
//! and the stream (`alloc`, `free`), the memory kind (`pitch`, `register`, `ipc_open`) or the
//! VMM operation (`vmm`). The table names the library and its error code once.
//! `tests/behaviours.rs` (`every_alloc_and_free_hook_records_its_own_fields`) checks every
//! row's record. Entry points of other shapes (a free that skips null, arrays, VMM calls with an
//! out-pointer or a handle) are written out in their family's file.

/// Allocation and free hooks of one library, a row each (see the module docs):
///
/// ```text
/// memory_hooks! {
///     Runtime, err = NO_RUNTIME;
///     /// `cudaMallocAsync`.
///     alloc cudaMallocAsync(p: *mut *mut c_void, size: usize, s: Handle) pads(a, b) => CudaMallocAsync, mem::DEVICE, stream s as u64;
///     /// `cudaMemPoolTrimTo`.
///     trim cudaMemPoolTrimTo(pool: Handle, keep: usize) pads(a, b, c) => CudaMemPoolTrimTo;
/// }
/// ```
macro_rules! memory_hooks {
    (
        $lib:ident, err = $err:expr;
        $(
            $(#[$doc:meta])*
            $kind:ident $name:ident($($sig:tt)*) $(pads($($pad:ident),*))? => $api:ident $(, $what:expr $(, stream $stream:expr)?)?;
        )*
    ) => {
        $(
            $crate::hooks::memory::memory_hooks! {
                @$kind $(#[$doc])* $name, $lib, $err, ($($sig)*), ($($($pad),*)?), $api, ($($what)?), ($($($stream)?)?)
            }
        )*
    };
    // The one body of every row: the real call, then, once it has returned and outside nested
    // calls, `$record` (which names the depth guard `$d`, the result `$r` and, for caller hooks,
    // the caller's return address `$ra`, all bound here). `$hook` is the entry shape:
    // `caller_hook` (with its `pads(…)`) or `plain_hook`.
    (
        @record $(#[$doc:meta])* $hook:ident($($pads:tt)*) $name:ident, $lib:ident, $err:expr,
        ($($arg:ident: $aty:ty),*), |$d:ident, $r:ident $(, $ra:ident)?| $record:expr
    ) => {
        $crate::hooks::shape::$hook! {
            $(#[$doc])*
            $name, $lib, fn($($arg: $aty),*) $($pads)* -> std::ffi::c_int, err = $err, forward_nested,
            |real $(, $ra)?| {
                let $d = $crate::raw::Depth::enter();
                let $r = real($($arg),*);
                if $d.outer() { $record }
                $r
            }
        }
    };
    // A block of `$size` bytes returned through the out-pointer `$p`: its address, `$size` and
    // `$stream`.
    (
        @alloc $(#[$doc:meta])* $name:ident, $lib:ident, $err:expr,
        ($p:ident: $pt:ty, $size:ident: usize $(, $arg:ident: $aty:ty)*), ($($pad:ident),*),
        $api:ident, ($mem:expr), ($stream:expr)
    ) => {
        $crate::hooks::memory::memory_hooks! {
            @record $(#[$doc])* caller_hook(pads($($pad),*)) $name, $lib, $err, ($p: $pt, $size: usize $(, $arg: $aty)*),
            |d, r, ra| {
                // Safety: reads the out-pointer only when it is non-null and the call succeeded.
                $crate::hooks::emit::alloc(&d, ::trace::Api::$api, $mem, unsafe { $crate::hooks::emit::out($p, r) }, $size as u64, $stream, r, ra)
            }
        }
    };
    // A free of the address or handle `$p` on `$stream`.
    (
        @free $(#[$doc:meta])* $name:ident, $lib:ident, $err:expr,
        ($p:ident: $pt:ty $(, $arg:ident: $aty:ty)*), ($($pad:ident),*),
        $api:ident, ($mem:expr), ($stream:expr)
    ) => {
        $crate::hooks::memory::memory_hooks! {
            @record $(#[$doc])* caller_hook(pads($($pad),*)) $name, $lib, $err, ($p: $pt $(, $arg: $aty)*),
            |d, r, ra| $crate::hooks::emit::free(&d, ::trace::Api::$api, $mem, $p as u64, $stream, r, ra)
        }
    };
    // A pitched allocation through the out-pointer `$p`: the pitch the call wrote (the width when
    // it failed or `$pitch` is null) × `$height` bytes, saturated (an overflow must not panic
    // across the FFI boundary), on stream 0.
    (
        @pitch $(#[$doc:meta])* $name:ident, $lib:ident, $err:expr,
        ($p:ident: $pt:ty, $pitch:ident: *mut usize, $width:ident: usize, $height:ident: usize $(, $arg:ident: $aty:ty)*),
        ($($pad:ident),*), $api:ident, ($mem:expr), ()
    ) => {
        $crate::hooks::memory::memory_hooks! {
            @record $(#[$doc])* caller_hook(pads($($pad),*)) $name, $lib, $err,
            ($p: $pt, $pitch: *mut usize, $width: usize, $height: usize $(, $arg: $aty)*),
            |d, r, ra| {
                // Safety: the pitch out-pointer, read only when non-null and the call succeeded.
                let pv = if r == 0 && !$pitch.is_null() { unsafe { *$pitch } } else { $width };
                // Safety: reads the out-pointer only when it is non-null and the call succeeded.
                $crate::hooks::emit::alloc(&d, ::trace::Api::$api, $mem, unsafe { $crate::hooks::emit::out($p, r) }, pv.saturating_mul($height) as u64, 0, r, ra)
            }
        }
    };
    // A host range registered in place: its own address `$p` and `$size`, on stream 0.
    (
        @register $(#[$doc:meta])* $name:ident, $lib:ident, $err:expr,
        ($p:ident: $pt:ty, $size:ident: usize $(, $arg:ident: $aty:ty)*), ($($pad:ident),*),
        $api:ident, ($mem:expr), ()
    ) => {
        $crate::hooks::memory::memory_hooks! {
            @record $(#[$doc])* caller_hook(pads($($pad),*)) $name, $lib, $err, ($p: $pt, $size: usize $(, $arg: $aty)*),
            |d, r, ra| $crate::hooks::emit::alloc(&d, ::trace::Api::$api, $mem, $p as u64, $size as u64, 0, r, ra)
        }
    };
    // An IPC import through the out-pointer `$p`, the handle passed by value: a plain hook (the
    // arguments untouched, no caller module); size 0, stream 0.
    (
        @ipc_open $(#[$doc:meta])* $name:ident, $lib:ident, $err:expr,
        ($p:ident: $pt:ty $(, $arg:ident: $aty:ty)*), (), $api:ident, ($mem:expr), ()
    ) => {
        $crate::hooks::memory::memory_hooks! {
            @record $(#[$doc])* plain_hook() $name, $lib, $err, ($p: $pt $(, $arg: $aty)*),
            |d, r| {
                // Safety: reads the out-pointer only when it is non-null and the call succeeded.
                $crate::hooks::emit::alloc(&d, ::trace::Api::$api, $mem, unsafe { $crate::hooks::emit::out($p, r) }, 0, 0, r, 0)
            }
        }
    };
    // A pool trimmed to `$keep` bytes (no caller module recorded).
    (
        @trim $(#[$doc:meta])* $name:ident, $lib:ident, $err:expr,
        ($pool:ident: $pt:ty, $keep:ident: usize), ($($pad:ident),*), $api:ident, (), ()
    ) => {
        $crate::hooks::memory::memory_hooks! {
            @record $(#[$doc])* caller_hook(pads($($pad),*)) $name, $lib, $err, ($pool: $pt, $keep: usize),
            |d, r, _ra| $crate::hooks::emit::trim(&d, ::trace::Api::$api, $pool as u64, $keep as u64, r)
        }
    };
    // The VMM operation `$op` on the range `$p`, `$size` bytes (no handle, no offset).
    (
        @vmm $(#[$doc:meta])* $name:ident, $lib:ident, $err:expr,
        ($p:ident: u64, $size:ident: usize $(, $arg:ident: $aty:ty)*), ($($pad:ident),*),
        $api:ident, ($op:expr), ()
    ) => {
        $crate::hooks::memory::memory_hooks! {
            @record $(#[$doc])* caller_hook(pads($($pad),*)) $name, $lib, $err, ($p: u64, $size: usize $(, $arg: $aty)*),
            |d, r, ra| $crate::hooks::emit::vmm(&d, ::trace::Api::$api, $op, $p, $size as u64, 0, 0, r, ra)
        }
    };
}
pub(crate) use memory_hooks;
