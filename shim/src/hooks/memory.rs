//! The two shapes most allocation hooks of both families take, each written once, and declared
//! as a table (`memory_hooks!`), one row an entry point:
//! - `alloc`: a call that returns a block through its out-pointer, given a size;
//! - `free`: a call given the address (or handle) it frees.
//!
//! A row names the entry point, its arguments (with the trampoline pads that fill them up to
//! five), and what the record holds: the API, the memory kind and the stream. The table names
//! the library and its error code once. `tests/behaviours.rs`
//! (`every_alloc_and_free_hook_records_its_own_fields`) checks every row's record. Entry points
//! of other shapes (a free that skips null, a pitch, a registration, IPC opens, VMM) are written
//! out in their family's file.

/// Allocation and free hooks of one library, a row each (see the module docs):
///
/// ```text
/// memory_hooks! {
///     Runtime, err = NO_RUNTIME;
///     /// `cudaMallocAsync`.
///     alloc cudaMallocAsync(p: *mut *mut c_void, size: usize, s: Handle) pads(a, b) => CudaMallocAsync, mem::DEVICE, stream s as u64;
/// }
/// ```
macro_rules! memory_hooks {
    (
        $lib:ident, err = $err:expr;
        $(
            $(#[$doc:meta])*
            $kind:ident $name:ident($($sig:tt)*) pads($($pad:ident),*) => $api:ident, $mem:expr, stream $stream:expr;
        )*
    ) => {
        $(
            $crate::hooks::memory::memory_hooks! {
                @$kind $(#[$doc])* $name, $lib, $err, ($($sig)*), ($($pad),*), $api, $mem, $stream
            }
        )*
    };
    // A block of `$size` bytes returned through the out-pointer `$p`: once the real call has
    // returned, and outside nested calls, its address, `$size` and `$stream` are recorded.
    (
        @alloc $(#[$doc:meta])* $name:ident, $lib:ident, $err:expr,
        ($p:ident: $pt:ty, $size:ident: usize $(, $arg:ident: $aty:ty)*), ($($pad:ident),*),
        $api:ident, $mem:expr, $stream:expr
    ) => {
        $crate::hooks::shape::caller_hook! {
            $(#[$doc])*
            $name, $lib, fn($p: $pt, $size: usize $(, $arg: $aty)*) pads($($pad),*) -> std::ffi::c_int, err = $err, forward_nested,
            |real, ra| {
                let d = $crate::raw::Depth::enter();
                let r = real($p, $size $(, $arg)*);
                // Safety: reads the out-pointer only when it is non-null and the call succeeded.
                if d.outer() { $crate::hooks::emit::alloc(&d, ::trace::Api::$api, $mem, unsafe { $crate::hooks::emit::out($p, r) }, $size as u64, $stream, r, ra) }
                r
            }
        }
    };
    // A free of the address or handle `$p`: once the real call has returned, and outside nested
    // calls, the free of `$p` on `$stream` is recorded.
    (
        @free $(#[$doc:meta])* $name:ident, $lib:ident, $err:expr,
        ($p:ident: $pt:ty $(, $arg:ident: $aty:ty)*), ($($pad:ident),*),
        $api:ident, $mem:expr, $stream:expr
    ) => {
        $crate::hooks::shape::caller_hook! {
            $(#[$doc])*
            $name, $lib, fn($p: $pt $(, $arg: $aty)*) pads($($pad),*) -> std::ffi::c_int, err = $err, forward_nested,
            |real, ra| {
                let d = $crate::raw::Depth::enter();
                let r = real($p $(, $arg)*);
                if d.outer() { $crate::hooks::emit::free(&d, ::trace::Api::$api, $mem, $p as u64, $stream, r, ra) }
                r
            }
        }
    };
}
pub(crate) use memory_hooks;
