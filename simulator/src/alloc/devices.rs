//! Per-device allocators for multi-GPU traces.

use std::collections::BTreeMap;

use super::config::AllocatorConfig;
use super::native::Allocator;
use super::version::TorchVersion;

/// One [`Allocator`] per device, created on first use with the same configuration.
#[derive(Debug, Clone)]
pub struct Devices {
    cfg: AllocatorConfig,
    version: TorchVersion,
    capacity: Option<u64>,
    map: BTreeMap<i32, Allocator>,
}

impl Devices {
    /// No devices yet; each starts empty with `cfg`, `version` and `capacity`.
    pub fn new(cfg: AllocatorConfig, version: TorchVersion, capacity: Option<u64>) -> Self {
        Devices { cfg, version, capacity, map: BTreeMap::new() }
    }

    /// The allocator of `device`, created if this is its first use.
    pub fn device(&mut self, device: i32) -> &mut Allocator {
        let (cfg, version, capacity) = (&self.cfg, self.version, self.capacity);
        self.map.entry(device).or_insert_with(|| Allocator::new(cfg.clone(), version, capacity))
    }

    /// The allocator of `device`, if it has been used.
    pub fn get(&self, device: i32) -> Option<&Allocator> {
        self.map.get(&device)
    }

    /// Devices used so far, in index order.
    pub fn iter(&self) -> impl Iterator<Item = (i32, &Allocator)> {
        self.map.iter().map(|(&d, a)| (d, a))
    }
}
