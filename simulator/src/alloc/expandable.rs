//! Expandable segments (spec §10): per-(stream, pool) virtual reservations whose pages are
//! mapped on demand and unmapped on `empty_cache` or the OOM path.

use super::block::{Block, State, NIL};
use super::native::{pool_of, Allocator, Segment, MAX_SEGMENT};
use super::request::{DeviceEvent, Outcome};
use super::rounding::{K_LARGE_BUFFER, K_SMALL_BUFFER};
use super::stats::{StatArray, ALL, LARGE_POOL, SMALL_POOL};

/// Page size of a pool's reservations: 2 MiB small, 20 MiB large.
pub(super) fn page_size(small: bool) -> u64 {
    if small {
        K_SMALL_BUFFER
    } else {
        K_LARGE_BUFFER
    }
}

fn add(a: &mut StatArray, small: bool, n: u64, up: bool) {
    for k in [ALL, if small { SMALL_POOL } else { LARGE_POOL }] {
        if up {
            a[k].increase(n as i64)
        } else {
            a[k].decrease(n as i64)
        }
    }
}

impl Allocator {
    fn allocatable(&self, i: u32) -> bool {
        i != NIL && self.arena[i].state == State::Free
    }

    /// Base address of the reservation holding `addr`.
    fn reservation_base(&self, addr: u64) -> u64 {
        self.segments.range(..=addr).next_back().map_or(addr, |(&b, _)| b)
    }

    /// Lowest-address place in this stream's reservations with `size` bytes of free or
    /// unmapped space, else a new reservation.
    fn find_expandable_block(&mut self, small: bool, stream: i64, size: u64, recorded: Option<u64>) -> Option<u32> {
        let p = pool_of(small);
        let unmapped = self.pools[p].of(stream).map(|sp| sp.unmapped.values());
        for &u in unmapped.into_iter().flatten() {
            let prev = self.arena[u].prev;
            let start = if self.allocatable(prev) { prev } else { u };
            let (mut bytes, mut b) = (0u64, start);
            while bytes < size && self.allocatable(b) {
                bytes += self.arena[b].size;
                b = self.arena[b].next;
            }
            if bytes >= size {
                return Some(start);
            }
        }
        let page = page_size(small);
        let total = self.total_memory;
        let mut reserve = (total + total / 8).div_ceil(page) * page;
        if size > reserve || size > MAX_SEGMENT {
            return None;
        }
        if let Some(a) = recorded {
            self.truncate_reservation_tail(a);
        }
        let base = match recorded.filter(|&a| !self.overlaps(a, size)) {
            Some(a) => {
                // The real reservation sat at `a`; shrink ours to the gap before the next
                // segment rather than give up the recorded address.
                if let Some((&next, _)) = self.segments.range(a..).next() {
                    reserve = reserve.min((next - a) / page * page);
                }
                if reserve < size {
                    reserve = (total + total / 8).div_ceil(page) * page;
                    self.synthetic_base(reserve)
                } else {
                    a
                }
            }
            None => self.synthetic_base(reserve),
        };
        let i = self.arena.insert(Block::free(base, reserve, stream, small, true, false));
        self.segments.insert(base, Segment { size: reserve, head: i, stream, small, expandable: true });
        self.pools[p].insert(&mut self.arena, i);
        Some(i)
    }

    /// The real run reserved a new range at `a`, inside the unmapped tail of one of our earlier
    /// reservations: the device's reservations sat closer together than 1.125 × total memory
    /// (the capacity is unknown, or the driver placed them so). Give that unmapped tail back so
    /// the recorded address can be honoured; nothing mapped or in use moves.
    fn truncate_reservation_tail(&mut self, a: u64) {
        let Some((&base, seg)) = self.segments.range(..=a).next_back() else { return };
        if !seg.expandable || a >= base + seg.size {
            return;
        }
        let mut t = seg.head;
        while self.arena[t].next != NIL {
            t = self.arena[t].next;
        }
        let tail = &self.arena[t];
        if tail.mapped || tail.state != State::Free || tail.addr >= a {
            return;
        }
        // Unmapped blocks are indexed by address, so shrinking one keeps its index valid.
        self.arena[t].size = a - self.arena[t].addr;
        if let Some(s) = self.segments.get_mut(&base) {
            s.size = a - base;
        }
    }

    /// `try_allocate_expandable_block`: map pages until a free run covers `size`; the result is
    /// taken out of the pool.
    pub(super) fn try_allocate_expandable_block(
        &mut self,
        small: bool,
        stream: i64,
        size: u64,
        recorded: Option<u64>,
        out: &mut Outcome,
    ) -> Option<u32> {
        let mut c = self.find_expandable_block(small, stream, size, recorded)?;
        if !self.arena[c].mapped {
            let want = self.arena[c].size.min(size);
            c = self.map_block(c, want, out)?;
        }
        while self.arena[c].size < size {
            let next = self.arena[c].next;
            if next == NIL || self.arena[next].mapped || self.arena[next].state != State::Free {
                return None;
            }
            let want = (size - self.arena[c].size).min(self.arena[next].size);
            c = self.map_block(next, want, out)?;
        }
        self.pools[pool_of(small)].remove(&self.arena, c);
        Some(c)
    }

    /// `map_block`: map the pages covering the first `size` bytes of unmapped block `u`, merge
    /// with free neighbours, and return the merged free block (left in the pool).
    fn map_block(&mut self, u: u32, size: u64, out: &mut Outcome) -> Option<u32> {
        let (addr, bsize, small) = {
            let b = &self.arena[u];
            (b.addr, b.size, b.small)
        };
        let page = page_size(small);
        let base = self.reservation_base(addr);
        let mapped = ((addr - base + size).div_ceil(page) * page).min(addr - base + bsize) - (addr - base);
        if mapped == 0 || self.capacity.is_some_and(|c| self.reserved() + mapped > c) {
            // cuMemCreate ran out of memory: the pages created in this call are released.
            return None;
        }
        let p = pool_of(small);
        self.pools[p].remove(&self.arena, u);
        if mapped < bsize {
            let rest = self.arena.split_off(u, mapped);
            self.pools[p].insert(&mut self.arena, rest);
        }
        self.mapped_ranges = self.mapped_ranges.wrapping_add_signed(self.range_change(u));
        self.arena[u].mapped = true;
        let (i, _) = self.merge_neighbours(u);
        self.pools[p].insert(&mut self.arena, i);
        add(&mut self.stats.reserved_bytes, small, mapped, true);
        self.stats.num_device_alloc += 1;
        out.device_events.push(DeviceEvent::SegmentMap { addr, size: mapped });
        Some(i)
    }

    /// `unmap_block`: unmap the whole pages inside free block `i`; returns the unmapped block.
    pub(super) fn unmap_block(&mut self, i: u32, out: &mut Outcome) -> Option<u32> {
        let (addr, size, small) = {
            let b = &self.arena[i];
            (b.addr, b.size, b.small)
        };
        let page = page_size(small);
        let base = self.reservation_base(addr);
        let begin = base + (addr - base).div_ceil(page) * page;
        let end = base + (addr + size - base) / page * page;
        if begin >= end {
            return None;
        }
        let p = pool_of(small);
        self.pools[p].remove(&self.arena, i);
        let mut u = i;
        if begin > addr {
            u = self.arena.split_off(i, begin - addr);
            self.pools[p].insert(&mut self.arena, i);
        }
        if end < addr + size {
            let after = self.arena.split_off(u, end - begin);
            self.pools[p].insert(&mut self.arena, after);
        }
        self.mapped_ranges = self.mapped_ranges.wrapping_add_signed(-self.range_change(u));
        self.arena[u].mapped = false;
        let (u, _) = self.merge_neighbours(u);
        self.pools[p].insert(&mut self.arena, u);
        add(&mut self.stats.reserved_bytes, small, end - begin, false);
        self.stats.num_device_free += 1;
        out.device_events.push(DeviceEvent::SegmentUnmap { addr: begin, size: end - begin });
        Some(u)
    }

    /// Drop a reservation whose only block is unmapped (`cuMemAddressFree`).
    pub(super) fn release_expandable_segment(&mut self, u: u32) {
        let b = &self.arena[u];
        if b.mapped || b.is_split() {
            return;
        }
        let addr = b.addr;
        self.pools[pool_of(b.small)].remove(&self.arena, u);
        self.segments.remove(&addr);
        self.arena.remove(u);
    }
}
