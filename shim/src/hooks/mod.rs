//! The exported hooks, one file per family (runtime, driver, arrays, launches, resolvers), built
//! from the two shapes in [`shape`]; most allocation and free hooks of the runtime and the driver
//! through the two recording shapes in [`memory`]. Hooks that record a caller module pass the
//! return address on the way as an extra trailing argument (no frame pointers or compiler
//! intrinsics needed).
//! [`emit`] turns a returned call into a raw event; [`table`] recognises a resolver's pointer
//! by identity.

// The exports are C entry points whose safety contract is the CUDA/libc API they stand in for,
// and whose arity is CUDA's.
#![allow(clippy::missing_safety_doc, clippy::too_many_arguments)]

use std::ffi::c_void;

pub mod array;
pub mod control;
pub mod driver;
pub mod emit;
pub mod launch;
pub mod memory;
pub mod resolve;
pub mod runtime;
pub mod shape;
pub mod table;

/// `cudaStream_t`, `CUstream`, pools, graphs: opaque handles.
pub type Handle = *mut c_void;

/// `cudaIpcMemHandle_t` and `CUipcMemHandle` (the same type): 64 opaque bytes, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IpcHandle {
    /// Opaque.
    pub reserved: [u8; 64],
}
