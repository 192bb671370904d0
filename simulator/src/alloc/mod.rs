//! The caching-allocator model (sans-IO): an exact model of PyTorch's native CUDA caching
//! allocator (`DeviceCachingAllocator`), per `../shared/reference/pytorch-caching-allocator.md`.
//!
//! - `config`: `PYTORCH_CUDA_ALLOC_CONF` parsing and snapshot settings;
//! - `chosen`: which configuration a replay follows (override, recorded string or settings);
//! - `shown`: a snapshot's configuration as replayed, its string with the fields written in;
//! - `rounding`: `round_size`, `get_allocation_size` and the constants;
//! - `free_index`: the free-block index of a pool (best fit by size, then address);
//! - `native`: malloc/free, best fit, split/merge, the OOM chain, GC, `empty_cache`;
//! - `expandable`: expandable segments (reservations, page mapping and unmapping);
//! - `state`: seeding a mid-run starting state and snapshot-style views;
//! - `stats`: `memory_stats()` counters;
//! - `addr_map`: the map by address of the live blocks (and of a replay's classifier's numbers);

pub(crate) mod addr_map;
mod block;
mod capacity;
mod chosen;
mod config;
mod expandable;
mod free_index;
mod native;
mod release;
mod request;
pub mod rounding;
mod shown;
mod state;
mod stats;
mod version;

pub use chosen::{choose, ChooseError, ChosenConfig, ConfigSource, RecordedConfig};
pub use config::{AllocatorConfig, Backend, ConfigError};
pub use native::{Allocator, DEFAULT_TOTAL_MEMORY, MAX_SEGMENT};
pub use request::{
    BlockView, BlockViewState, DeviceEvent, ExistingBlock, ExistingSegment, OomInfo, Outcome, ReplayError, Request,
    SeedError, SegmentView,
};
pub use stats::{MemoryStats, Stat, StatArray};
pub use version::{TorchVersion, VersionError};
