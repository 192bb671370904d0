//! Integration tests for libmemtrace.so: tiny C programs run under LD_PRELOAD, traces read back
//! with the trace crate. The tests never link the shim itself (its exports would hijack the test
//! binary); they load the built `libmemtrace.so` into child processes only.

/// One test per interception behaviour, against the stub runtime and driver.
mod behaviours;
/// The CUPTI layer against a stub libcupti: kernel execution records and the fallbacks.
mod cupti;
/// Endings that complete the trace: SIGHUP, SIGQUIT, abort, quick_exit, faults.
mod endings;
/// Builds the C stubs and programs, locates the shim, runs programs under it.
mod harness;
/// The host program as it runs without the shim: its end, its ignored signals, its limits.
mod host;
/// Exit paths, signals, fork, threads, markers and configuration.
mod lifecycle;
/// The program's own signal semantics under the shim, a fork child's fresh size limit, an exit
/// wait that runs out.
mod lifecycle_edges;
/// The real libcudart.so.13 from the nvidia-cuda-runtime wheel, with no driver.
mod real_cudart;
/// Traces read back for assertions; counts from memsim's `TraceStats`.
mod stats;
/// The writer's edges: a program that takes the trace's descriptor, a backlog at exit, calls
/// past the size limit.
mod writer_edges;
