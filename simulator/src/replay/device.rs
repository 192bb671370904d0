//! One device's replay state: its allocator and what a replay reads from it at each request.

use crate::alloc::{Allocator, Outcome};

use super::report::Fragmentation;

pub(super) struct DeviceState {
    pub(super) alloc: Allocator,
    pub(super) at_peak: Fragmentation,
    pub(super) peak_reserved_seen: u64,
    pub(super) live_by_category: [u64; 7],
    pub(super) categories_at_peak: [u64; 7],
    pub(super) peak_allocated_seen: u64,
    /// The device's total memory the program's own memory fraction asks for: the most the
    /// fraction had to allow (what a reservation took the reserved bytes to, a failed
    /// allocation's need, a start state) over the fraction in force then. A job that sets
    /// `set_per_process_memory_fraction(0.1)` and reserves 6 GiB needs a 60 GiB device. As in
    /// PyTorch, the fraction is checked only when the allocator reserves: a request served from
    /// the cache after the fraction was lowered asks nothing of it.
    pub(super) fraction_need: u64,
    /// The latest request's outcome, reused so that a request allocates nothing.
    pub(super) outcome: Outcome,
}

impl DeviceState {
    pub(super) fn new(alloc: Allocator) -> DeviceState {
        DeviceState {
            alloc,
            at_peak: Fragmentation::default(),
            peak_reserved_seen: 0,
            live_by_category: [0; 7],
            categories_at_peak: [0; 7],
            peak_allocated_seen: 0,
            fraction_need: 0,
            outcome: Outcome::default(),
        }
    }

    /// Takes the picture at a new reserved or allocated peak; returns (reserved, allocated) now.
    #[inline(always)]
    pub(super) fn note_peaks(&mut self) -> (u64, u64) {
        let stats = self.alloc.stats();
        let reserved = stats.reserved_bytes[0].current.max(0) as u64;
        let allocated = stats.allocated_bytes[0].current.max(0) as u64;
        if reserved > self.peak_reserved_seen {
            // Constant time: a new peak is set at every segment growth of a rising run.
            self.peak_reserved_seen = reserved;
            self.at_peak = Fragmentation {
                reserved_minus_allocated: reserved.saturating_sub(allocated),
                largest_free_block: self.alloc.largest_free_block(),
                segments: self.alloc.mapped_ranges(),
            };
        }
        if allocated > self.peak_allocated_seen {
            self.peak_allocated_seen = allocated;
            self.categories_at_peak = self.live_by_category;
        }
        (reserved, allocated)
    }

    /// `reserved` bytes the memory fraction in force must allow: the device total that allows
    /// them (nothing for 0).
    #[inline(always)]
    pub(super) fn note_fraction_need(&mut self, reserved: u64) {
        if let Some(f) = self.alloc.memory_fraction() {
            if reserved > 0 {
                self.fraction_need = self.fraction_need.max(total_allowing(reserved, f));
            }
        }
    }
}

impl super::Replayer {
    /// The device total the program's memory fraction asks for so far, on its busiest device in
    /// that respect (0 without a fraction): see [`super::ReplayReport::fraction_need_bytes`].
    pub fn fraction_need_bytes(&self) -> u64 {
        self.devices.iter().map(|(_, d)| d.fraction_need).max().unwrap_or(0)
    }
}

/// The least device total whose share `f` lets an allocator reserve `reserved` bytes, as the
/// allocator computes its limit (`allowed_max`, `f × total` truncated): the quotient rounded up,
/// then past any total the product's rounding still leaves short. A fraction of 0 allows
/// nothing: no device is large enough (`u64::MAX`).
fn total_allowing(reserved: u64, f: f64) -> u64 {
    if f <= 0.0 {
        return u64::MAX;
    }
    let allows = |total: u64| (f * total as f64) as u64 >= reserved;
    let mut total = (reserved as f64 / f).ceil() as u64;
    // A step of at least one unit in the last place of `total` as a float.
    while total < u64::MAX && !allows(total) {
        total = total.saturating_add((total >> 52).max(1));
    }
    total
}
