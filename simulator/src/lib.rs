//! memsim library: an exact, sans-IO model of PyTorch's CUDA caching allocator, trace replay,
//! snapshot import/export and collocation.

pub mod alloc;
pub mod profile;
pub mod snapshot;
