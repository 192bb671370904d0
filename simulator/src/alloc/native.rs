//! The device allocator: `malloc`, `free`, best fit, split/merge, the OOM chain and releasing
//! cached memory (spec §4–§9). Releasing cached segments is `release.rs`, expandable segments
//! `expandable.rs`, seeding and views `state.rs`.

use std::collections::BTreeMap;

use super::addr_map::AddrMap;
use super::block::{key, unkey, Arena, Block, Pool, State, NIL};
use super::config::AllocatorConfig;
use super::request::{DeviceEvent, OomInfo, Outcome, ReplayError, Request};
use super::rounding::{get_allocation_size, is_small, round_size, K_LARGE_BUFFER};
use super::stats::{MemoryStats, StatArray, ALL, LARGE_POOL, SMALL_POOL};
use super::version::TorchVersion;

/// Device memory assumed when no capacity is given: it sizes expandable reservations and the
/// memory fraction's base.
pub const DEFAULT_TOTAL_MEMORY: u64 = 80 << 30;
/// Requests above this fail like a `cudaMalloc` that cannot be satisfied, even without a
/// capacity, so synthetic addresses never overflow; no capacity above it is taken
/// (`trace::units::MAX_CAPACITY`), so such a request never sits beside a "fits".
pub const MAX_SEGMENT: u64 = trace::units::MAX_CAPACITY;
/// First synthetic segment base; far from the 0x7f… range where recorded CUDA addresses live.
const SYNTHETIC_BASE: u64 = 0x1000_0000_0000;
const SEGMENT_ALIGN: u64 = 2 << 20;

pub(super) const SMALL: usize = 0;
pub(super) const LARGE: usize = 1;

#[inline]
pub(super) fn pool_of(small: bool) -> usize {
    if small {
        SMALL
    } else {
        LARGE
    }
}

#[inline]
fn inc(a: &mut StatArray, small: bool, n: u64) {
    a[ALL].increase(n as i64);
    a[if small { SMALL_POOL } else { LARGE_POOL }].increase(n as i64);
}

#[inline]
pub(super) fn dec(a: &mut StatArray, small: bool, n: u64) {
    a[ALL].decrease(n as i64);
    a[if small { SMALL_POOL } else { LARGE_POOL }].decrease(n as i64);
}

/// Signed change to a stat array (free_block's net inactive-split change).
fn change(a: &mut StatArray, small: bool, n: i64) {
    if n > 0 {
        inc(a, small, n as u64);
    } else if n < 0 {
        dec(a, small, n.unsigned_abs());
    }
}

/// A device allocation: a native segment or an expandable reservation.
#[derive(Debug, Clone)]
pub(super) struct Segment {
    pub size: u64,
    pub head: u32,
    pub stream: i64,
    pub small: bool,
    pub expandable: bool,
}

/// One device's caching allocator.
#[derive(Debug, Clone)]
pub struct Allocator {
    pub(super) cfg: AllocatorConfig,
    pub(super) version: TorchVersion,
    pub(super) capacity: Option<u64>,
    pub(super) total_memory: u64,
    pub(super) arena: Arena,
    pub(super) pools: [Pool; 2],
    /// Allocated and pending-free blocks by address.
    pub(super) live: AddrMap,
    pub(super) segments: BTreeMap<u64, Segment>,
    pub(super) pending_events: Vec<u32>,
    pub(super) allowed_max: Option<u64>,
    /// The memory fraction in force (`allowed_max`'s share of `total_memory`).
    pub(super) fraction: Option<f64>,
    /// Whether the fraction limits the allocator: not when the device's total is unknown (a
    /// replay without a capacity), where its base would be made up.
    pub(super) fraction_enforced: bool,
    pub(super) next_synthetic: u64,
    pub(super) stats: MemoryStats,
    /// Contiguous mapped ranges: one per native segment, one per mapped run of an expandable
    /// reservation. Kept as blocks are mapped and unmapped, so a replay can read it at every
    /// new peak without walking the segments (`segments().len()` is the same number).
    pub(super) mapped_ranges: u64,
}

impl Allocator {
    /// A fresh allocator for one device. `capacity` is the device memory the allocator may
    /// obtain (cudaMalloc and cuMemCreate fail beyond it); None means unlimited.
    pub fn new(cfg: AllocatorConfig, version: TorchVersion, capacity: Option<u64>) -> Self {
        let total_memory = capacity.unwrap_or(DEFAULT_TOTAL_MEMORY);
        let fraction = cfg.per_process_memory_fraction;
        let allowed_max = fraction.map(|f| (f * total_memory as f64) as u64);
        let stats = MemoryStats {
            max_split_size: if cfg.max_split_size == u64::MAX { -1 } else { cfg.max_split_size as i64 },
            ..MemoryStats::default()
        };
        Allocator {
            cfg,
            version,
            capacity,
            total_memory,
            arena: Arena::default(),
            pools: [Pool::default(), Pool::default()],
            live: AddrMap::default(),
            segments: BTreeMap::new(),
            pending_events: Vec::new(),
            allowed_max,
            fraction,
            fraction_enforced: true,
            next_synthetic: SYNTHETIC_BASE,
            stats,
            mapped_ranges: 0,
        }
    }

    /// The configuration in force.
    pub fn config(&self) -> &AllocatorConfig {
        &self.cfg
    }

    /// The release whose rules apply.
    pub fn version(&self) -> TorchVersion {
        self.version
    }

    /// `memory_stats()`.
    pub fn stats(&self) -> &MemoryStats {
        &self.stats
    }

    /// Number of blocks the model holds (allocated, pending, free and unmapped).
    pub fn block_count(&self) -> usize {
        self.arena.live_slots()
    }

    /// Apply one request. Never panics; a request that cannot apply (unknown address, double
    /// free) returns an error and leaves the state unchanged.
    pub fn apply(&mut self, req: &Request) -> Result<Outcome, ReplayError> {
        let mut out = Outcome::default();
        self.apply_into(req, &mut out)?;
        Ok(out)
    }

    /// [`Allocator::apply`] into a caller's `Outcome` (cleared first), so a replay reuses one
    /// for every request. On an error `out` is cleared and the state unchanged.
    // Inlined so that a caller that already knows the request's kind (a replay's stepped
    // allocation or free) has the `match` folded away (callgrind: -8% on the replay thread).
    #[inline(always)]
    pub fn apply_into(&mut self, req: &Request, out: &mut Outcome) -> Result<(), ReplayError> {
        out.clear();
        match *req {
            Request::Alloc { size, stream, recorded_addr } => self.malloc(size, stream, recorded_addr, out),
            Request::FreeRequested { addr } => {
                let i = self.request_free(addr)?;
                self.arena[i].state = State::PendingExplicit;
                self.arena[i].stream_uses.clear();
                out.block_size = self.arena[i].size;
            }
            Request::Free { addr } => {
                let i = self.request_free(addr)?;
                out.block_size = self.arena[i].size;
                if self.arena[i].stream_uses.is_empty() {
                    self.free_block(i);
                } else {
                    self.arena[i].stream_uses.clear();
                    self.arena[i].state = State::PendingEvents;
                    self.pending_events.push(i);
                }
            }
            Request::FreeCompleted { addr } => {
                // One map operation: the block leaves `live` here, and goes back on a refusal.
                let i = self.live.remove(addr).ok_or(ReplayError::UnknownAddress { addr })?;
                match self.arena[i].state {
                    State::Allocated => {
                        self.live.insert(addr, i);
                        return Err(ReplayError::NotRequested { addr });
                    }
                    State::PendingEvents => self.pending_events.retain(|&p| p != i),
                    _ => {}
                }
                out.block_size = self.arena[i].size;
                self.free_unlisted_block(i);
            }
            Request::RecordStream { addr, stream } => {
                let i = self.live.get(addr).ok_or(ReplayError::UnknownStreamUse { addr })?;
                let b = &mut self.arena[i];
                if b.state != State::Allocated {
                    return Err(ReplayError::NotAllocated { addr });
                }
                if stream != b.stream && !b.stream_uses.contains(&stream) {
                    b.stream_uses.push(stream);
                }
            }
            Request::EmptyCache => self.release_cached_blocks(out),
            Request::SetMemoryFraction(f) => {
                if !(0.0..=1.0).contains(&f) {
                    return Err(ReplayError::InvalidFraction(f));
                }
                self.fraction = Some(f);
                if self.fraction_enforced {
                    self.allowed_max = Some((f * self.total_memory as f64) as u64);
                }
            }
            Request::ResetPeakStats => self.stats.reset_peaks(),
        }
        Ok(())
    }

    /// `free()`: the program's release; allocated counters drop at once.
    fn request_free(&mut self, addr: u64) -> Result<u32, ReplayError> {
        let i = self.live.get(addr).ok_or(ReplayError::UnknownAddress { addr })?;
        let b = &self.arena[i];
        if b.state != State::Allocated {
            return Err(ReplayError::DoubleFree { addr });
        }
        let (small, size) = (b.small, b.size);
        dec(&mut self.stats.allocation, small, 1);
        dec(&mut self.stats.allocated_bytes, small, size);
        if size >= self.cfg.max_split_size {
            self.stats.oversize_allocations.decrease(1);
        }
        Ok(i)
    }

    fn gc_active(&self) -> bool {
        self.allowed_max.is_some() && self.cfg.garbage_collection_threshold > 0.0
    }

    fn malloc(&mut self, orig: u64, stream: i64, recorded: Option<u64>, out: &mut Outcome) {
        if orig == 0 {
            // allocate(0) returns nullptr without touching the allocator.
            return;
        }
        if !self.pending_events.is_empty() {
            self.process_events(out);
        }
        let size = round_size(orig, &self.cfg.roundup_power2_divisions);
        let small = is_small(size);
        let alloc_size = get_allocation_size(size);
        let mut found = self.get_free_block(small, stream, size);
        if found.is_none() {
            if self.gc_active() {
                self.garbage_collect_cached_blocks(out);
            }
            found = self.alloc_block(small, stream, size, alloc_size, recorded, out);
            if found.is_none() && self.release_available_cached_blocks(small, stream, size, out) {
                found = self.alloc_block(small, stream, size, alloc_size, recorded, out);
            }
            if found.is_none() {
                self.release_cached_blocks(out);
                self.stats.num_alloc_retries += 1;
                out.retried = true;
                found = self.alloc_block(small, stream, size, alloc_size, recorded, out);
            }
        }
        let Some(i) = found else {
            self.stats.num_ooms += 1;
            out.oom = Some(OomInfo {
                rounded_size: size,
                requested_size: orig,
                reserved: self.reserved(),
                allocated: self.stats.allocated_bytes[ALL].current as u64,
                device_free: self.capacity.map(|c| c.saturating_sub(self.reserved())),
            });
            return;
        };
        let split = self.should_split(i, size);
        self.alloc_found_block(i, size, orig, split);
        out.addr = Some(self.arena[i].addr);
        out.block_size = self.arena[i].size;
    }

    pub(super) fn reserved(&self) -> u64 {
        self.stats.reserved_bytes[ALL].current as u64
    }

    /// The oversize slack R: `kLargeBuffer` in 2.4, `max_non_split_rounding` from 2.5.
    fn non_split_rounding(&self) -> u64 {
        if self.version >= TorchVersion::V2_5 {
            self.cfg.max_non_split_rounding
        } else {
            K_LARGE_BUFFER
        }
    }

    fn expandable_size(&self, i: u32) -> u64 {
        let b = &self.arena[i];
        let tail = if b.next != NIL && !self.arena[b.next].mapped { self.arena[b.next].size } else { 0 };
        b.size + tail
    }

    /// Best fit by (stream, size, addr), then the expandable adjustment and the oversize rules
    /// on that single candidate.
    fn get_free_block(&mut self, small: bool, stream: i64, size: u64) -> Option<u32> {
        let p = pool_of(small);
        if self.gc_active() {
            self.pools[p].free_calls += 1;
        }
        // Common case first: the best fit is a native block. Take it out in the same search
        // that finds it, and put it back in the rare case an oversize rule refuses it.
        let (msp, slack) = (self.cfg.max_split_size, self.non_split_rounding());
        let sp = self.pools[p].of_existing_mut(stream)?;
        let (k, first) = sp.blocks.take_first_at_or_after(key(size, 0))?;
        if !self.arena[first].expandable {
            let bsize = unkey(k).0;
            if (size < msp && bsize >= msp) || (size >= msp && bsize >= size.saturating_add(slack)) {
                sp.blocks.insert(k, first);
                return None;
            }
            return Some(first);
        }
        sp.blocks.insert(k, first);
        let cand = {
            let sp = self.pools[p].of(stream)?;
            let mut it = sp.blocks.range_from(key(size, 0));
            let (_, first) = it.next()?;
            let mut cand = first;
            if self.arena[cand].expandable {
                if self.cfg.expandable_segments {
                    for (_, next) in it {
                        if !self.arena[cand].expandable || self.expandable_size(next) >= self.expandable_size(cand) {
                            break;
                        }
                        cand = next;
                    }
                } else {
                    // Expandable segments were switched off: only non-expandable blocks qualify.
                    loop {
                        let (_, next) = it.next()?;
                        if !self.arena[next].expandable {
                            cand = next;
                            break;
                        }
                    }
                }
            }
            cand
        };
        let msp = self.cfg.max_split_size;
        let bsize = self.arena[cand].size;
        if size < msp && bsize >= msp {
            return None;
        }
        if size >= msp && bsize >= size.saturating_add(self.non_split_rounding()) {
            return None;
        }
        self.pools[p].remove(&self.arena, cand);
        Some(cand)
    }

    fn should_split(&self, i: u32, size: u64) -> bool {
        let b = &self.arena[i];
        self.cfg.should_split(b.small, size, b.size - size)
    }

    fn alloc_found_block(&mut self, i: u32, size: u64, orig: u64, split: bool) {
        let (small, expandable, already_split) = {
            let b = &self.arena[i];
            (b.small, b.expandable, b.is_split())
        };
        if split {
            let rem = self.arena.split_off(i, size);
            self.pools[pool_of(small)].insert(&mut self.arena, rem);
            if !expandable {
                if already_split {
                    // An already-split inactive block shrinks by `size`.
                    dec(&mut self.stats.inactive_split_bytes, small, size);
                } else {
                    inc(&mut self.stats.inactive_split_bytes, small, self.arena[rem].size);
                    inc(&mut self.stats.inactive_split, small, 1);
                }
            }
        } else if already_split && !expandable {
            let bsize = self.arena[i].size;
            dec(&mut self.stats.inactive_split_bytes, small, bsize);
            dec(&mut self.stats.inactive_split, small, 1);
        }
        let b = &mut self.arena[i];
        b.state = State::Allocated;
        b.requested = orig;
        b.stream_uses.clear();
        let (addr, bsize) = (b.addr, b.size);
        self.live.insert(addr, i);
        let st = &mut self.stats;
        inc(&mut st.allocation, small, 1);
        inc(&mut st.allocated_bytes, small, bsize);
        inc(&mut st.active, small, 1);
        inc(&mut st.active_bytes, small, bsize);
        inc(&mut st.requested_bytes, small, orig);
        if bsize >= self.cfg.max_split_size {
            st.oversize_allocations.increase(1);
        }
    }

    /// Whether `n` can merge into a neighbour with the given mapped flag.
    pub(super) fn mergeable(&self, n: u32, mapped: bool) -> bool {
        n != NIL && self.arena[n].state == State::Free && self.arena[n].mapped == mapped
    }

    /// Merges the free neighbours of `i` (which is in no pool) into it; returns the surviving
    /// slot and the sizes absorbed from each side (0 when no merge).
    pub(super) fn merge_neighbours(&mut self, mut i: u32) -> (u32, [u64; 2]) {
        let mapped = self.arena[i].mapped;
        let p = pool_of(self.arena[i].small);
        let mut absorbed = [0u64; 2];
        let prev = self.arena[i].prev;
        if self.mergeable(prev, mapped) {
            self.pools[p].remove(&self.arena, prev);
            absorbed[0] = self.arena[prev].size;
            self.arena.absorb_next(prev);
            i = prev;
        }
        let next = self.arena[i].next;
        if self.mergeable(next, mapped) {
            self.pools[p].remove(&self.arena, next);
            absorbed[1] = self.arena.absorb_next(i);
        }
        (i, absorbed)
    }

    /// `free_block`: the memory becomes reusable; merge and return to the pool.
    pub(super) fn free_block(&mut self, i: u32) {
        let addr = self.arena[i].addr;
        self.live.remove(addr);
        self.free_unlisted_block(i);
    }

    /// [`Allocator::free_block`] of a block already taken out of `live`.
    fn free_unlisted_block(&mut self, i: u32) {
        let (orig_size, requested, small, expandable) = {
            let b = &mut self.arena[i];
            b.state = State::Free;
            let r = b.requested;
            b.requested = 0;
            (b.size, r, b.small, b.expandable)
        };
        let (i, absorbed) = self.merge_neighbours(i);
        let mut net_blocks: i64 = 0;
        let mut net_size: i64 = 0;
        for a in absorbed.into_iter().filter(|&a| a > 0) {
            net_blocks -= 1;
            net_size -= a as i64;
        }
        self.pools[pool_of(small)].insert(&mut self.arena, i);
        if self.arena[i].is_split() {
            net_blocks += 1;
            net_size += self.arena[i].size as i64;
        }
        let st = &mut self.stats;
        if !expandable {
            change(&mut st.inactive_split, small, net_blocks);
            change(&mut st.inactive_split_bytes, small, net_size);
        }
        dec(&mut st.active, small, 1);
        dec(&mut st.active_bytes, small, orig_size);
        dec(&mut st.requested_bytes, small, requested);
    }

    /// `process_events`: the model treats every recorded event as complete by the next malloc.
    pub(super) fn process_events(&mut self, out: &mut Outcome) {
        for i in std::mem::take(&mut self.pending_events) {
            out.completed_frees.push(self.arena[i].addr);
            self.free_block(i);
        }
    }

    /// `alloc_block`: a new segment (or expandable mapping) for the request.
    fn alloc_block(
        &mut self,
        small: bool,
        stream: i64,
        size: u64,
        alloc_size: u64,
        recorded: Option<u64>,
        out: &mut Outcome,
    ) -> Option<u32> {
        let checked = self.reserved().saturating_add(alloc_size);
        if self.allowed_max.is_some_and(|max| checked > max) {
            return None;
        }
        let found = if self.cfg.expandable_segments {
            self.try_allocate_expandable_block(small, stream, size, recorded, out)
        } else if alloc_size > MAX_SEGMENT || self.capacity.is_some_and(|c| checked > c) {
            None
        } else {
            Some(self.map_segment(small, stream, alloc_size, recorded, out))
        };
        if found.is_some() {
            out.fraction_checked = out.fraction_checked.max(checked);
        }
        found
    }

    /// A new native segment of `alloc_size` bytes, one free block, mapped at the base the
    /// recording (or the model) gives it.
    fn map_segment(
        &mut self,
        small: bool,
        stream: i64,
        alloc_size: u64,
        recorded: Option<u64>,
        out: &mut Outcome,
    ) -> u32 {
        let addr = self.choose_base(alloc_size, recorded);
        let i = self.arena.insert(Block::free(addr, alloc_size, stream, small, false, true));
        self.segments.insert(addr, Segment { size: alloc_size, head: i, stream, small, expandable: false });
        self.mapped_ranges += 1;
        inc(&mut self.stats.segment, small, 1);
        inc(&mut self.stats.reserved_bytes, small, alloc_size);
        if alloc_size >= self.cfg.max_split_size {
            self.stats.oversize_segments.increase(1);
        }
        self.stats.num_device_alloc += 1;
        out.device_events.push(DeviceEvent::SegmentAlloc { addr, size: alloc_size });
        i
    }

    /// Whether [addr, addr+size) meets a segment the model holds.
    pub(super) fn overlaps(&self, addr: u64, size: u64) -> bool {
        let Some(end) = addr.checked_add(size) else { return true };
        self.segments.range(..end).next_back().is_some_and(|(&b, s)| b + s.size > addr)
    }

    /// Base for a new device range: the recorded address when it is free, else the next
    /// synthetic 2 MiB-aligned address that does not meet an existing segment.
    pub(super) fn choose_base(&mut self, size: u64, recorded: Option<u64>) -> u64 {
        if let Some(a) = recorded {
            if !self.overlaps(a, size) {
                return a;
            }
        }
        self.synthetic_base(size)
    }

    pub(super) fn synthetic_base(&mut self, size: u64) -> u64 {
        let mut cand = self.next_synthetic.div_ceil(SEGMENT_ALIGN) * SEGMENT_ALIGN;
        while let Some((&b, s)) = self.segments.range(..cand + size).next_back().filter(|(&b, s)| b + s.size > cand) {
            cand = (b + s.size).div_ceil(SEGMENT_ALIGN) * SEGMENT_ALIGN;
        }
        self.next_synthetic = cand + size;
        cand
    }

    /// The program's memory fraction in force (`set_per_process_memory_fraction`, or the
    /// configuration's), if any: the share of the device's memory the allocator may reserve.
    pub fn memory_fraction(&self) -> Option<f64> {
        self.fraction
    }

    /// Contiguous mapped ranges now: [`Allocator::segments`]`().len()`, in O(1).
    pub fn mapped_ranges(&self) -> u64 {
        self.mapped_ranges
    }

    /// How mapping block `i` changes the count of mapped ranges: a new range, unless it joins
    /// a mapped neighbour (or two, which it then bridges). Unmapping changes it by the negation.
    pub(super) fn range_change(&self, i: u32) -> i64 {
        let b = &self.arena[i];
        let mapped = |j: u32| j != NIL && self.arena[j].mapped;
        1 - i64::from(mapped(b.prev)) - i64::from(mapped(b.next))
    }

    /// Size of the largest free mapped block in any pool and stream.
    pub fn largest_free_block(&self) -> u64 {
        let mut best = 0;
        for sp in self.pools.iter().flat_map(|p| &p.streams) {
            if let Some((k, _)) = sp.blocks.last() {
                best = best.max(unkey(k).0);
            }
        }
        best
    }
}
