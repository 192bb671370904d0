//! Blocks in a slab with intrusive prev/next links, and the free pools that index them.
//!
//! Invariant kept by [`Arena::split_off`] and [`Arena::absorb_next`]: the slot of the block at a
//! segment's base address never changes while the segment lives, so a segment can name its
//! first block by slot.

use std::collections::BTreeMap;

use super::free_index::FreeIndex;

/// "No block" in a prev/next link.
pub(super) const NIL: u32 = u32::MAX;

/// Where a block is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum State {
    /// In a pool (mapped) or in the unmapped set; reusable.
    Free,
    /// Handed to the program.
    Allocated,
    /// Freed by the program; waits for an explicit `free_completed`.
    PendingExplicit,
    /// Freed by the program while used on other streams; the model completes it at the next
    /// `process_events` or synchronisation.
    PendingEvents,
}

#[derive(Debug, Clone)]
pub(super) struct Block {
    pub addr: u64,
    pub size: u64,
    pub requested: u64,
    pub stream: i64,
    pub prev: u32,
    pub next: u32,
    pub small: bool,
    pub expandable: bool,
    pub mapped: bool,
    pub state: State,
    /// Other streams recorded with `record_stream`; empty (and unallocated) in the common case.
    pub stream_uses: Vec<i64>,
    /// Pool `get_free_block` call count when the block entered the pool; its GC age is the
    /// difference.
    pub gc_base: u64,
}

impl Block {
    pub fn free(addr: u64, size: u64, stream: i64, small: bool, expandable: bool, mapped: bool) -> Self {
        Block {
            addr,
            size,
            requested: 0,
            stream,
            prev: NIL,
            next: NIL,
            small,
            expandable,
            mapped,
            state: State::Free,
            stream_uses: Vec::new(),
            gc_base: 0,
        }
    }

    pub fn is_split(&self) -> bool {
        self.prev != NIL || self.next != NIL
    }
}

/// Slab of blocks; freed slots are reused so memory follows the number of live blocks.
#[derive(Debug, Clone, Default)]
pub(super) struct Arena {
    slots: Vec<Block>,
    vacant: Vec<u32>,
}

impl Arena {
    pub fn insert(&mut self, b: Block) -> u32 {
        if let Some(i) = self.vacant.pop() {
            self.slots[i as usize] = b;
            i
        } else {
            self.slots.push(b);
            (self.slots.len() - 1) as u32
        }
    }

    pub fn remove(&mut self, i: u32) {
        self.slots[i as usize].stream_uses = Vec::new();
        self.vacant.push(i);
    }

    /// Cuts `i` at `offset`; `i` keeps the low part, the returned slot holds the high part
    /// with the same attributes (state Free).
    pub fn split_off(&mut self, i: u32, offset: u64) -> u32 {
        let b = &self[i];
        let mut hi = Block::free(b.addr + offset, b.size - offset, b.stream, b.small, b.expandable, b.mapped);
        hi.prev = i;
        hi.next = b.next;
        let old_next = b.next;
        let h = self.insert(hi);
        if old_next != NIL {
            self[old_next].prev = h;
        }
        self[i].next = h;
        self[i].size = offset;
        h
    }

    /// Merges `i.next` into `i` (the lower block survives) and frees the next slot. Returns the
    /// size absorbed.
    pub fn absorb_next(&mut self, i: u32) -> u64 {
        let n = self[i].next;
        let (size, after) = (self[n].size, self[n].next);
        self[i].size += size;
        self[i].next = after;
        if after != NIL {
            self[after].prev = i;
        }
        self.remove(n);
        size
    }

    pub fn live_slots(&self) -> usize {
        self.slots.len() - self.vacant.len()
    }
}

impl std::ops::Index<u32> for Arena {
    type Output = Block;
    #[inline]
    fn index(&self, i: u32) -> &Block {
        &self.slots[i as usize]
    }
}

impl std::ops::IndexMut<u32> for Arena {
    #[inline]
    fn index_mut(&mut self, i: u32) -> &mut Block {
        &mut self.slots[i as usize]
    }
}

/// Key of a free block within one stream: ordered by size, then address.
#[inline]
pub(super) fn key(size: u64, addr: u64) -> u128 {
    ((size as u128) << 64) | addr as u128
}

/// Size and address back from a [`key`].
#[inline]
pub(super) fn unkey(k: u128) -> (u64, u64) {
    ((k >> 64) as u64, k as u64)
}

/// One stream's share of a pool.
#[derive(Debug, Clone)]
pub(super) struct StreamPool {
    pub stream: i64,
    /// Free mapped blocks by [`key`].
    pub blocks: FreeIndex,
    /// Unmapped ranges of expandable segments by address.
    pub unmapped: BTreeMap<u64, u32>,
}

/// One `BlockPool`. PyTorch orders free blocks by (stream, size, addr) in one set; keeping one
/// map per stream (streams sorted) gives the same order with cheaper keys.
#[derive(Debug, Clone, Default)]
pub(super) struct Pool {
    pub streams: Vec<StreamPool>,
    /// `get_free_blocks_call_count`, counted only while GC is active.
    pub free_calls: u64,
}

impl Pool {
    #[inline]
    pub fn of(&self, stream: i64) -> Option<&StreamPool> {
        self.streams.iter().find(|s| s.stream == stream)
    }

    #[inline(always)]
    fn of_mut(&mut self, stream: i64) -> &mut StreamPool {
        let pos = match self.streams.iter().position(|s| s.stream == stream) {
            Some(p) => p,
            None => self.add_stream(stream),
        };
        &mut self.streams[pos]
    }

    #[cold]
    fn add_stream(&mut self, stream: i64) -> usize {
        let at = self.streams.partition_point(|s| s.stream < stream);
        self.streams.insert(at, StreamPool { stream, blocks: FreeIndex::default(), unmapped: BTreeMap::new() });
        at
    }

    /// This stream's share, when the stream has used the pool.
    #[inline]
    pub fn of_existing_mut(&mut self, stream: i64) -> Option<&mut StreamPool> {
        self.streams.iter_mut().find(|s| s.stream == stream)
    }

    /// Adds a free block to the set matching its mapped flag.
    pub fn insert(&mut self, arena: &mut Arena, i: u32) {
        let calls = self.free_calls;
        let b = &mut arena[i];
        let sp = self.of_mut(b.stream);
        if b.mapped {
            b.gc_base = calls;
            sp.blocks.insert(key(b.size, b.addr), i);
        } else {
            sp.unmapped.insert(b.addr, i);
        }
    }

    /// Removes a free block from the set matching its mapped flag.
    pub fn remove(&mut self, arena: &Arena, i: u32) {
        let b = &arena[i];
        let sp = self.of_mut(b.stream);
        if b.mapped {
            sp.blocks.remove(key(b.size, b.addr));
        } else {
            sp.unmapped.remove(&b.addr);
        }
    }

    /// Every free mapped block in (stream, size, addr) order.
    pub fn all_blocks(&self) -> Vec<u32> {
        self.streams.iter().flat_map(|s| s.blocks.slots()).collect()
    }
}
