//! `torch.cuda.memory_stats()` counters (spec §9), with PyTorch's increase/decrease semantics.

use serde_json::{Map, Value};

/// One counter: `current`, `peak`, and the running totals `allocated` and `freed`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stat {
    /// Current value.
    pub current: i64,
    /// High-water mark since creation or the last peak reset.
    pub peak: i64,
    /// Sum of all increases.
    pub allocated: i64,
    /// Sum of all decreases.
    pub freed: i64,
}

impl Stat {
    /// `increase_stat`: the peak moves at the same moment as the current value.
    #[inline]
    pub fn increase(&mut self, n: i64) {
        self.current += n;
        self.peak = self.peak.max(self.current);
        self.allocated += n;
    }

    /// `decrease_stat`.
    #[inline]
    pub fn decrease(&mut self, n: i64) {
        self.current -= n;
        self.freed += n;
    }

    fn reset_peak(&mut self) {
        self.peak = self.current;
    }
}

/// Index of the aggregate entry in a [`StatArray`].
pub const ALL: usize = 0;
/// Index of the small-pool entry.
pub const SMALL_POOL: usize = 1;
/// Index of the large-pool entry.
pub const LARGE_POOL: usize = 2;
const POOL_NAMES: [&str; 3] = ["all", "small_pool", "large_pool"];

/// A counter per pool kind: `[all, small_pool, large_pool]`.
pub type StatArray = [Stat; 3];

/// The allocator statistics, field names as in `memory_stats()`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MemoryStats {
    /// Allocated blocks.
    pub allocation: StatArray,
    /// Native segments (`cudaMalloc`s); expandable mappings are not counted here.
    pub segment: StatArray,
    /// Blocks allocated or waiting for their free to complete.
    pub active: StatArray,
    /// Free blocks inside split segments.
    pub inactive_split: StatArray,
    /// Bytes of allocated blocks (rounded sizes).
    pub allocated_bytes: StatArray,
    /// Bytes of device memory held (segments or mapped pages).
    pub reserved_bytes: StatArray,
    /// Bytes of active blocks.
    pub active_bytes: StatArray,
    /// Bytes of free blocks inside split segments.
    pub inactive_split_bytes: StatArray,
    /// Bytes requested by the program (unrounded).
    pub requested_bytes: StatArray,
    /// Allocations of at least `max_split_size`.
    pub oversize_allocations: Stat,
    /// Segments of at least `max_split_size`.
    pub oversize_segments: Stat,
    /// Allocations that needed `release_cached_blocks` and a retry.
    pub num_alloc_retries: u64,
    /// Allocations that failed.
    pub num_ooms: u64,
    /// `synchronize_and_free_events` calls.
    pub num_sync_all_streams: u64,
    /// `cudaMalloc` and `cuMemMap` calls.
    pub num_device_alloc: u64,
    /// `cudaFree` and `cuMemUnmap` calls.
    pub num_device_free: u64,
    /// `max_split_size` in bytes, −1 when unlimited.
    pub max_split_size: i64,
}

impl MemoryStats {
    /// `reset_peak_memory_stats`: every peak becomes the current value.
    pub fn reset_peaks(&mut self) {
        for arr in self.arrays_mut() {
            arr.iter_mut().for_each(Stat::reset_peak);
        }
        self.oversize_allocations.reset_peak();
        self.oversize_segments.reset_peak();
    }

    fn arrays_mut(&mut self) -> [&mut StatArray; 9] {
        [
            &mut self.allocation,
            &mut self.segment,
            &mut self.active,
            &mut self.inactive_split,
            &mut self.allocated_bytes,
            &mut self.reserved_bytes,
            &mut self.active_bytes,
            &mut self.inactive_split_bytes,
            &mut self.requested_bytes,
        ]
    }

    fn arrays(&self) -> [(&'static str, &StatArray); 9] {
        [
            ("allocation", &self.allocation),
            ("segment", &self.segment),
            ("active", &self.active),
            ("inactive_split", &self.inactive_split),
            ("allocated_bytes", &self.allocated_bytes),
            ("reserved_bytes", &self.reserved_bytes),
            ("active_bytes", &self.active_bytes),
            ("inactive_split_bytes", &self.inactive_split_bytes),
            ("requested_bytes", &self.requested_bytes),
        ]
    }

    /// The flat dict `torch.cuda.memory_stats()` returns ("allocated_bytes.all.peak", …).
    /// `serde_json::Map` keeps keys sorted, as `memory_stats()` does.
    pub fn to_json(&self) -> Value {
        fn put(m: &mut Map<String, Value>, prefix: &str, s: &Stat) {
            m.insert(format!("{prefix}.current"), s.current.into());
            m.insert(format!("{prefix}.peak"), s.peak.into());
            m.insert(format!("{prefix}.allocated"), s.allocated.into());
            m.insert(format!("{prefix}.freed"), s.freed.into());
        }
        let mut m = Map::new();
        for (name, arr) in self.arrays() {
            for (pool, s) in POOL_NAMES.iter().zip(arr) {
                put(&mut m, &format!("{name}.{pool}"), s);
            }
        }
        put(&mut m, "oversize_allocations", &self.oversize_allocations);
        put(&mut m, "oversize_segments", &self.oversize_segments);
        m.insert("num_alloc_retries".into(), self.num_alloc_retries.into());
        m.insert("num_ooms".into(), self.num_ooms.into());
        m.insert("num_sync_all_streams".into(), self.num_sync_all_streams.into());
        m.insert("num_device_alloc".into(), self.num_device_alloc.into());
        m.insert("num_device_free".into(), self.num_device_free.into());
        m.insert("max_split_size".into(), self.max_split_size.into());
        Value::Object(m)
    }
}
