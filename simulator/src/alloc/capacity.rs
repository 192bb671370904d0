//! Changing the device capacity during a replay (collocation: other processes take memory).

use super::native::Allocator;

impl Allocator {
    /// Set the device memory the allocator may use from now on. Memory already reserved stays;
    /// only later `cudaMalloc`s and mappings are checked against the new limit.
    pub fn set_capacity(&mut self, capacity: Option<u64>) {
        self.capacity = capacity;
    }
}
