//! Device memory a trace holds outside the caching allocator: another module's own requests
//! (NCCL's buffers), VMM physical handles, managed memory. The model places none of it, but the
//! device holds it beside the allocator's segments, so the need counts it: left out, a verdict
//! said FITS on a device the job had filled. What counts is what it adds at the device's busiest
//! moment (the most of reserved + held at once), not its own peak on top of the allocator's:
//! the two need not coincide.

use hashbrown::HashMap;

use crate::alloc::Allocator;
use crate::units::saturated;

/// The live device memory outside the allocator, per device, with its peaks.
#[derive(Debug, Default)]
pub(super) struct OutsideHeld {
    /// Bytes held by (device, physical handle, trace address).
    live: HashMap<(u32, bool, u64), u64>,
    /// Bytes held now and at most, per device, sorted by device.
    devices: Vec<(u32, Held)>,
}

#[derive(Debug, Default, Clone, Copy)]
struct Held {
    /// Wider than any sum of u64 sizes: a damaged trace's sizes near 2^64 must neither wrap it
    /// nor, saturated and then freed, take it below what is still held.
    now: u128,
    peak: u64,
    /// The most of (the allocator's reserved bytes + held bytes) at once, taken whenever
    /// either rises while something is held.
    joint: u64,
}

impl OutsideHeld {
    /// An allocation of `size` bytes at `addr`, while the allocator reserves `reserved` on the
    /// device; one over a live address replaces it.
    pub(super) fn alloc(&mut self, device: u32, physical: bool, addr: u64, size: u64, reserved: u64) {
        let old = self.live.insert((device, physical, addr), size).unwrap_or(0);
        let h = super::per_device(&mut self.devices, device, Held::default);
        h.now = h.now - u128::from(old) + u128::from(size);
        h.peak = h.peak.max(saturated(h.now));
        h.joint = h.joint.max(saturated(h.now + u128::from(reserved)));
    }

    /// The release of the memory at `addr` (nothing, when the trace never showed it allocated).
    pub(super) fn free(&mut self, device: u32, physical: bool, addr: u64) {
        if let Some(size) = self.live.remove(&(device, physical, addr)) {
            let h = super::per_device(&mut self.devices, device, Held::default);
            h.now -= u128::from(size);
        }
    }

    /// The allocator on `device` reserves `reserved` now: a new joint peak when memory is held
    /// beside it. Nothing to do, and one test, when nothing is held (every symbolic trace).
    #[inline(always)]
    pub(super) fn note_reserved(&mut self, device: u32, reserved: u64) {
        if !self.live.is_empty() {
            self.note_joint(device, reserved);
        }
    }

    #[cold]
    fn note_joint(&mut self, device: u32, reserved: u64) {
        if let Some((_, h)) = self.devices.iter_mut().find(|(d, _)| *d == device) {
            h.joint = h.joint.max(saturated(h.now + u128::from(reserved)));
        }
    }

    /// A free of an address no request holds: the release of managed memory held here, when it
    /// is (the shim records every `cudaFree` as device memory: it cannot tell them apart).
    #[inline]
    pub(super) fn release_unknown(&mut self, device: u32, addr: u64) -> bool {
        if self.live.is_empty() || !self.live.contains_key(&(device, false, addr)) {
            return false;
        }
        self.free(device, false, addr);
        true
    }

    /// Limit `alloc`, on `device` of `capacity`, to what the memory held there leaves (the one
    /// rule of every place a capacity reaches an allocator); its total memory, the base of a
    /// memory fraction, stays the device's.
    pub(super) fn limit(&self, device: u32, alloc: &mut Allocator, capacity: Option<u64>) {
        if let Some(c) = capacity {
            alloc.set_capacity(Some(c.saturating_sub(self.now(device))));
        }
    }

    /// Bytes held on `device` now.
    pub(super) fn now(&self, device: u32) -> u64 {
        self.devices.iter().find(|(d, _)| *d == device).map_or(0, |(_, h)| saturated(h.now))
    }

    /// The most bytes held at once on any one device.
    pub(super) fn peak(&self) -> u64 {
        self.devices.iter().map(|(_, h)| h.peak).max().unwrap_or(0)
    }

    /// What the held memory adds to the reserved peak `reserved_peak` (the most reserved on any
    /// one device): the most of (reserved + held) at once on any one device, less that peak.
    pub(super) fn beside_peak(&self, reserved_peak: u64) -> u64 {
        match self.devices.iter().map(|(_, h)| h.joint).max().unwrap_or(0) {
            // A saturated joint peak is no number to subtract from: what it adds is saturated too.
            u64::MAX => u64::MAX,
            joint => joint.saturating_sub(reserved_peak),
        }
    }
}
