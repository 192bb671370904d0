//! Seeding a starting state (a mid-run trace) and reading the state back as snapshot-style views.

use super::block::{Block, State, NIL};
use super::native::{pool_of, Allocator, Segment};
use super::request::{BlockView, BlockViewState, ExistingSegment, SeedError, SegmentView};
use super::stats::{StatArray, ALL, LARGE_POOL, SMALL_POOL};

fn inc(a: &mut StatArray, small: bool, n: u64) {
    a[ALL].increase(n as i64);
    a[if small { SMALL_POOL } else { LARGE_POOL }].increase(n as i64);
}

impl Allocator {
    /// Seed a segment that existed before the trace began, with its blocks. Allocated blocks
    /// count in the statistics as if allocated now; adjacent free blocks are merged, as the
    /// allocator would have. An expandable segment becomes a reservation exactly as large as the
    /// mapped range given (its unmapped tail is not recorded anywhere).
    pub fn add_existing_segment(&mut self, seg: &ExistingSegment) -> Result<(), SeedError> {
        if seg.size == 0 || seg.blocks.is_empty() || seg.blocks.iter().any(|b| b.size == 0) {
            return Err(SeedError::Empty { addr: seg.addr });
        }
        let mut at = seg.addr;
        for b in &seg.blocks {
            if b.addr != at {
                return Err(SeedError::NotTiled { addr: seg.addr, block: b.addr });
            }
            at = at.checked_add(b.size).ok_or(SeedError::NotTiled { addr: seg.addr, block: b.addr })?;
        }
        if at != seg.addr + seg.size {
            return Err(SeedError::NotTiled { addr: seg.addr, block: at });
        }
        if self.overlaps(seg.addr, seg.size) {
            return Err(SeedError::Overlap { addr: seg.addr, size: seg.size });
        }
        let small = seg.is_small_pool;
        let exp = seg.expandable;
        let msp = self.cfg.max_split_size;
        // Link the blocks, merging runs of free ones.
        let mut slots: Vec<u32> = Vec::with_capacity(seg.blocks.len());
        for eb in &seg.blocks {
            if let Some(&last) = slots.last() {
                if !eb.allocated && self.arena[last].state == State::Free {
                    self.arena[last].size += eb.size;
                    continue;
                }
            }
            let mut b = Block::free(eb.addr, eb.size, seg.stream, small, exp, true);
            if eb.allocated {
                b.state = State::Allocated;
                b.requested = eb.requested_size;
            }
            let i = self.arena.insert(b);
            if let Some(&last) = slots.last() {
                self.arena[last].next = i;
                self.arena[i].prev = last;
            }
            slots.push(i);
        }
        let split = slots.len() > 1;
        for &i in &slots {
            let (addr, size, requested, allocated) = {
                let b = &self.arena[i];
                (b.addr, b.size, b.requested, b.state == State::Allocated)
            };
            let st = &mut self.stats;
            if allocated {
                self.live.insert(addr, i);
                inc(&mut st.allocation, small, 1);
                inc(&mut st.allocated_bytes, small, size);
                inc(&mut st.active, small, 1);
                inc(&mut st.active_bytes, small, size);
                inc(&mut st.requested_bytes, small, requested);
                if size >= msp {
                    st.oversize_allocations.increase(1);
                }
            } else {
                if split && !exp {
                    inc(&mut st.inactive_split, small, 1);
                    inc(&mut st.inactive_split_bytes, small, size);
                }
                self.pools[pool_of(small)].insert(&mut self.arena, i);
            }
        }
        self.segments
            .insert(seg.addr, Segment { size: seg.size, head: slots[0], stream: seg.stream, small, expandable: exp });
        // Seeded blocks are all mapped: one contiguous range.
        self.mapped_ranges += 1;
        if !exp {
            inc(&mut self.stats.segment, small, 1);
            if seg.size >= msp {
                self.stats.oversize_segments.increase(1);
            }
        }
        inc(&mut self.stats.reserved_bytes, small, seg.size);
        Ok(())
    }

    /// Current segments and blocks, in address order. An expandable reservation appears as one
    /// segment per contiguous mapped range, as in PyTorch snapshots.
    pub fn segments(&self) -> Vec<SegmentView> {
        let mut out = Vec::new();
        for seg in self.segments.values() {
            let view = |addr| SegmentView {
                addr,
                size: 0,
                stream: seg.stream,
                is_small_pool: seg.small,
                expandable: seg.expandable,
                blocks: Vec::new(),
            };
            let mut cur: Option<SegmentView> = None;
            let mut i = seg.head;
            while i != NIL {
                let b = &self.arena[i];
                if b.mapped {
                    let v = cur.get_or_insert_with(|| view(b.addr));
                    v.size += b.size;
                    let state = match b.state {
                        State::Free => BlockViewState::Inactive,
                        State::Allocated => BlockViewState::Allocated,
                        State::PendingExplicit | State::PendingEvents => BlockViewState::PendingFree,
                    };
                    v.blocks.push(BlockView { addr: b.addr, size: b.size, requested_size: b.requested, state });
                } else if let Some(v) = cur.take() {
                    out.push(v);
                }
                i = b.next;
            }
            out.extend(cur);
        }
        out
    }
}
