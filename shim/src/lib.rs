//! `libmemtrace.so`: records every CUDA device allocation, free and kernel launch of a process
//! it is preloaded into.
//!
//! ```text
//! LD_PRELOAD=/path/to/libmemtrace.so MEMTRACE_OUT=runs/%p.mtrace python train.py
//! ```
//!
//! Architecture:
//! - [`hooks`]: the exported entry points: naked stubs that forward a nested call (one made
//!   inside another hook, or by the shim itself) straight to the real function, else jump into
//!   the Rust body. That calls the real function, then (outermost call only) fills a 64-byte
//!   [`event::RawEvent`] straight into its thread's preallocated single-producer ring ([`ring`],
//!   through the thread-local block in [`raw`]),
//!   stamped with the invariant TSC where there is one ([`clock`]). Resolver hooks (`dlsym`,
//!   `cuGetProcAddress*`, `cudaGetDriverEntryPoint*`) hand out wrappers by pointer identity, so
//!   library-internal and Triton-style driver calls are seen too.
//! - [`writer`]: one background thread sweeps the rings (a lone ring is encoded in place, several
//!   are merged by time), turns raw events into trace frames, resolves caller modules and kernel
//!   names, writes the file, and prints the exit summary.
//! - [`lifecycle`]: lazy start, exit/signal/fork handling, the load-time constructor.
//! - [`state`]: the process-wide flags the writer and the lifecycle share.
//! - [`real`]: finding real functions (libc's own `dlsym`, RTLD_NEXT, RTLD_NOLOAD by soname).
//! - [`config`]: the `MEMTRACE_*` table, read once.
//! - [`cupti`]: the optional CUPTI activity layer (kernel execution records).
//!
//! Nothing here may harm the host: every hook returns the real function's result, panics are
//! caught, the hot path neither allocates (after a thread's first event) nor locks, and a full
//! ring drops (and counts) events after a bounded wait rather than blocking.
//!
//! The modules form no import cycle (checked by `tests/test_structure.py`): `event`, `clock`,
//! `log` and `state` at the bottom; `config`, `ring`, `raw`, `real`; then `writer`; then
//! `lifecycle`; then `hooks`.

#![deny(clippy::undocumented_unsafe_blocks)]

pub mod clock;
pub mod config;
pub mod cupti;
pub mod event;
pub mod hooks;
pub mod lifecycle;
pub mod log;
pub mod raw;
pub mod real;
pub mod ring;
pub mod state;
pub mod writer;
