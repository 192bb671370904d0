//! memsim library: an exact, sans-IO model of PyTorch's CUDA caching allocator, trace replay,
//! snapshot import/export and collocation. The library does no file I/O except where a function
//! takes a path by name (snapshot and trace conversion); the `memsim` binary owns the rest.

pub mod alloc;
pub mod colocate;
pub mod conversions;
pub mod family;
pub mod fit;
pub mod margin;
pub mod perfetto;
pub mod profile;
pub mod replay;
pub mod report;
pub mod snapshot;
pub mod stats;
pub mod units;
pub mod utilization;
