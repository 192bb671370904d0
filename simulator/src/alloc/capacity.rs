//! Changing the device capacity during a replay (collocation: other processes take memory).

use super::native::Allocator;

impl Allocator {
    /// Set the device memory the allocator may use from now on. Memory already reserved stays;
    /// only later `cudaMalloc`s and mappings are checked against the new limit.
    pub fn set_capacity(&mut self, capacity: Option<u64>) {
        self.capacity = capacity;
    }

    /// Set the device's total memory, the base of a memory fraction (PyTorch's `total_memory`
    /// from `cudaMemGetInfo`): a fraction in force is re-read against it.
    pub fn set_total_memory(&mut self, total: u64) {
        self.total_memory = total;
        self.fraction_enforced = true;
        self.allowed_max = self.fraction.map(|f| (f * total as f64) as u64);
    }

    /// Leave a memory fraction unenforced: the device's total, its base, is unknown (a replay
    /// without a capacity). The fraction is still recorded ([`Allocator::memory_fraction`]).
    pub fn leave_fraction_unenforced(&mut self) {
        self.fraction_enforced = false;
        self.allowed_max = None;
    }
}
