//! Kernel launch hooks (runtime, driver, graphs). No caller module: launches are counted and
//! named, not attributed. Launch hooks only record; the kernel name is resolved by the writer.
//!
//! The call to the real function is made, and documented, once in the hook macros
//! (`hooks/shape.rs`); the unsafe blocks left here read the caller's launch configuration, each
//! with its own `// Safety:` line.

use std::ffi::{c_int, c_uint, c_void};

use trace::Api;

use super::emit;
use super::shape::plain_hook;
use super::shape::HookDesc;
use super::Handle;
use crate::event::FuncKind;
use crate::raw::Depth;

const NO_RUNTIME: c_int = 3;
const NO_DRIVER: c_int = 3;

/// `dim3`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Dim3 {
    /// x.
    pub x: c_uint,
    /// y.
    pub y: c_uint,
    /// z.
    pub z: c_uint,
}

impl Dim3 {
    fn arr(self) -> [u32; 3] {
        [self.x, self.y, self.z]
    }
}

/// The leading fields of `cudaLaunchConfig_t`.
#[repr(C)]
pub struct CudaLaunchConfig {
    /// Grid.
    pub grid: Dim3,
    /// Block.
    pub block: Dim3,
    /// Dynamic shared memory.
    pub dynamic_smem: usize,
    /// Stream.
    pub stream: Handle,
}

/// The leading fields of `CUlaunchConfig`.
#[repr(C)]
pub struct CuLaunchConfig {
    /// Grid x, y, z.
    pub grid: [c_uint; 3],
    /// Block x, y, z.
    pub block: [c_uint; 3],
    /// Dynamic shared memory.
    pub shared: c_uint,
    /// Stream.
    pub stream: Handle,
}

macro_rules! runtime_launch {
    ($name:ident, $api:ident) => {
        plain_hook! {
            /// A runtime launch `(func, grid, block, args, shared, stream)`.
            $name, Runtime, fn(f: *const c_void, g: Dim3, b: Dim3, args: *mut *mut c_void, shared: usize, s: Handle) -> c_int,
            err = NO_RUNTIME, forward_nested,
            |real| {
                let d = Depth::enter();
                let r = real(f, g, b, args, shared, s);
                if d.outer() {
                    emit::launch(&d, Api::$api, FuncKind::HostStub, f as u64, g.arr(), b.arr(), shared as u32, s as u64, r)
                }
                r
            }
        }
    };
}

runtime_launch!(cudaLaunchKernel, CudaLaunchKernel);
runtime_launch!(cudaLaunchKernel_ptsz, CudaLaunchKernel_ptsz);
runtime_launch!(__cudaLaunchKernel, __CudaLaunchKernel);
runtime_launch!(__cudaLaunchKernel_ptsz, __CudaLaunchKernel_ptsz);
runtime_launch!(cudaLaunchCooperativeKernel, CudaLaunchCooperativeKernel);
runtime_launch!(cudaLaunchCooperativeKernel_ptsz, CudaLaunchCooperativeKernel_ptsz);

macro_rules! runtime_launch_ex {
    ($name:ident, $api:ident) => {
        plain_hook! {
            /// `cudaLaunchKernelExC(config, func, args)`.
            $name, Runtime, fn(cfg: *const CudaLaunchConfig, f: *const c_void, args: *mut *mut c_void) -> c_int,
            err = NO_RUNTIME, forward_nested,
            |real| {
                let d = Depth::enter();
                let r = real(cfg, f, args);
                if d.outer() && !cfg.is_null() {
                    // Safety: non-null (checked); the caller's launch configuration, valid during the call.
                    let c = unsafe { &*cfg };
                    emit::launch(&d, Api::$api, FuncKind::HostStub, f as u64, c.grid.arr(), c.block.arr(), c.dynamic_smem as u32, c.stream as u64, r)
                }
                r
            }
        }
    };
}

runtime_launch_ex!(cudaLaunchKernelExC, CudaLaunchKernelExC);
runtime_launch_ex!(cudaLaunchKernelExC_ptsz, CudaLaunchKernelExC_ptsz);

macro_rules! graph_launch {
    ($name:ident, $lib:ident, $api:ident, $err:expr) => {
        plain_hook! {
            /// A graph launch `(graphExec, stream)`: counted as one launch.
            $name, $lib, fn(g: Handle, s: Handle) -> c_int, err = $err, forward_nested,
            |real| {
                let d = Depth::enter();
                let r = real(g, s);
                if d.outer() { emit::launch(&d, Api::$api, FuncKind::Graph, g as u64, [0; 3], [0; 3], 0, s as u64, r) }
                r
            }
        }
    };
}

graph_launch!(cudaGraphLaunch, Runtime, CudaGraphLaunch, NO_RUNTIME);
graph_launch!(cudaGraphLaunch_ptsz, Runtime, CudaGraphLaunch_ptsz, NO_RUNTIME);
graph_launch!(cuGraphLaunch, Driver, CuGraphLaunch, NO_DRIVER);
graph_launch!(cuGraphLaunch_ptsz, Driver, CuGraphLaunch_ptsz, NO_DRIVER);

/// `cuLaunchKernel`-shaped driver launches: a function, grid, block, shared memory and stream,
/// then the kernel parameters and whatever follows them (`extra` for `cuLaunchKernel`, nothing
/// for the cooperative launch).
macro_rules! driver_launch {
    ($(#[$doc:meta])* $name:ident, $api:ident, params($($p:ident: $pty:ty),*)) => {
        plain_hook! {
            $(#[$doc])*
            $name, Driver, fn(f: Handle, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
                shared: c_uint, s: Handle, $($p: $pty),*) -> c_int,
            err = NO_DRIVER, forward_nested,
            |real| {
                let d = Depth::enter();
                let r = real(f, gx, gy, gz, bx, by, bz, shared, s, $($p),*);
                if d.outer() {
                    emit::launch(&d, Api::$api, FuncKind::CuFunction, f as u64, [gx, gy, gz], [bx, by, bz], shared, s as u64, r)
                }
                r
            }
        }
    };
}

driver_launch!(
    /// `cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra)`.
    cuLaunchKernel, CuLaunchKernel, params(params: *mut *mut c_void, extra: *mut *mut c_void)
);
driver_launch!(
    /// `cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra)`.
    cuLaunchKernel_ptsz, CuLaunchKernel_ptsz, params(params: *mut *mut c_void, extra: *mut *mut c_void)
);
driver_launch!(
    /// `cuLaunchCooperativeKernel(f, gx, gy, gz, bx, by, bz, shared, stream, params)`.
    cuLaunchCooperativeKernel, CuLaunchCooperativeKernel, params(params: *mut *mut c_void)
);
driver_launch!(
    /// `cuLaunchCooperativeKernel(f, gx, gy, gz, bx, by, bz, shared, stream, params)`.
    cuLaunchCooperativeKernel_ptsz, CuLaunchCooperativeKernel_ptsz, params(params: *mut *mut c_void)
);

macro_rules! driver_launch_ex {
    ($name:ident, $api:ident) => {
        plain_hook! {
            /// `cuLaunchKernelEx(config, f, params, extra)`.
            $name, Driver, fn(cfg: *const CuLaunchConfig, f: Handle, params: *mut *mut c_void, extra: *mut *mut c_void) -> c_int,
            err = NO_DRIVER, forward_nested,
            |real| {
                let d = Depth::enter();
                let r = real(cfg, f, params, extra);
                if d.outer() && !cfg.is_null() {
                    // Safety: non-null (checked); the caller's launch configuration, valid during the call.
                    let c = unsafe { &*cfg };
                    emit::launch(&d, Api::$api, FuncKind::CuFunction, f as u64, c.grid, c.block, c.shared, c.stream as u64, r)
                }
                r
            }
        }
    };
}

driver_launch_ex!(cuLaunchKernelEx, CuLaunchKernelEx);
driver_launch_ex!(cuLaunchKernelEx_ptsz, CuLaunchKernelEx_ptsz);

plain_hook! {
    /// `cuLaunch(f)`: the legacy launch of a 1×1×1 grid; the block shape was set earlier with
    /// `cuFuncSetBlockShape` and is recorded as unknown (0×0×0).
    cuLaunch, Driver, fn(f: Handle) -> c_int, err = NO_DRIVER, forward_nested,
    |real| {
        let d = Depth::enter();
        let r = real(f);
        if d.outer() { emit::launch(&d, Api::CuLaunch, FuncKind::CuFunction, f as u64, [1, 1, 1], [0; 3], 0, 0, r) }
        r
    }
}

plain_hook! {
    /// `cuLaunchGrid(f, w, h)`: block shape unknown (0×0×0), as for `cuLaunch`.
    cuLaunchGrid, Driver, fn(f: Handle, w: c_int, h: c_int) -> c_int, err = NO_DRIVER, forward_nested,
    |real| {
        let d = Depth::enter();
        let r = real(f, w, h);
        if d.outer() { emit::launch(&d, Api::CuLaunchGrid, FuncKind::CuFunction, f as u64, [w as u32, h as u32, 1], [0; 3], 0, 0, r) }
        r
    }
}

plain_hook! {
    /// `cuLaunchGridAsync(f, w, h, stream)`: block shape unknown, as for `cuLaunch`.
    cuLaunchGridAsync, Driver, fn(f: Handle, w: c_int, h: c_int, s: Handle) -> c_int, err = NO_DRIVER, forward_nested,
    |real| {
        let d = Depth::enter();
        let r = real(f, w, h, s);
        if d.outer() {
            emit::launch(&d, Api::CuLaunchGridAsync, FuncKind::CuFunction, f as u64, [w as u32, h as u32, 1], [0; 3], 0, s as u64, r)
        }
        r
    }
}

/// Launch hooks.
pub const ALL: &[HookDesc] = &[
    cudaLaunchKernel::DESC,
    cudaLaunchKernel_ptsz::DESC,
    __cudaLaunchKernel::DESC,
    __cudaLaunchKernel_ptsz::DESC,
    cudaLaunchCooperativeKernel::DESC,
    cudaLaunchCooperativeKernel_ptsz::DESC,
    cudaLaunchKernelExC::DESC,
    cudaLaunchKernelExC_ptsz::DESC,
    cudaGraphLaunch::DESC,
    cudaGraphLaunch_ptsz::DESC,
    cuGraphLaunch::DESC,
    cuGraphLaunch_ptsz::DESC,
    cuLaunchKernel::DESC,
    cuLaunchKernel_ptsz::DESC,
    cuLaunchCooperativeKernel::DESC,
    cuLaunchCooperativeKernel_ptsz::DESC,
    cuLaunchKernelEx::DESC,
    cuLaunchKernelEx_ptsz::DESC,
    cuLaunch::DESC,
    cuLaunchGrid::DESC,
    cuLaunchGridAsync::DESC,
];
