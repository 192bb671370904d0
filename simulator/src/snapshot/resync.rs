//! Resynchronising the model to a recorded placement after a mismatch.
//!
//! The model has no "allocate at this address" request, so the state is rebuilt: the model's
//! segments are read back, the misplaced block is freed (and merged), the recorded block is
//! carved out of the free block holding the recorded address with the allocator's split rule,
//! and a fresh allocator is seeded with the result. Statistics restart from the seeded state;
//! validation tracks reserved bytes from the segment events itself, so nothing it reports is
//! lost. Expandable segments are not rebuilt this way: seeding one drops its unmapped tail.

use crate::alloc::{rounding, Allocator, BlockView, BlockViewState, ExistingSegment, Request};

/// A fresh allocator whose state is `alloc`'s with the block at `predicted` moved to
/// `recorded`; None when that cannot be done consistently (the recorded address is not free in
/// the model, or expandable segments are involved).
pub(super) fn resync(
    alloc: &Allocator,
    capacity: Option<u64>,
    predicted: u64,
    recorded: u64,
    requested: u64,
) -> Option<Allocator> {
    let cfg = alloc.config().clone();
    let mut segs = alloc.segments();
    if segs.iter().any(|s| s.expandable) {
        return None;
    }
    let (si, bi) = find(&segs, |b| b.addr == predicted && b.state == BlockViewState::Allocated)?;
    let b = &mut segs[si].blocks[bi];
    b.state = BlockViewState::Inactive;
    b.requested_size = 0;
    merge_free(&mut segs[si].blocks);

    let (sj, bj) =
        find(&segs, |b| b.state == BlockViewState::Inactive && b.addr <= recorded && recorded < b.addr + b.size)?;
    let free = segs[sj].blocks[bj].clone();
    let rounded = rounding::round_size(requested, &cfg.roundup_power2_divisions);
    let end = free.addr + free.size;
    if recorded + rounded > end {
        return None;
    }
    let remaining = end - recorded - rounded;
    let split = cfg.should_split(segs[sj].is_small_pool, rounded, remaining);
    let size = if split { rounded } else { end - recorded };
    let mut repl = Vec::with_capacity(3);
    if recorded > free.addr {
        repl.push(BlockView {
            addr: free.addr,
            size: recorded - free.addr,
            requested_size: 0,
            state: BlockViewState::Inactive,
        });
    }
    repl.push(BlockView { addr: recorded, size, requested_size: requested, state: BlockViewState::Allocated });
    if recorded + size < end {
        repl.push(BlockView {
            addr: recorded + size,
            size: end - recorded - size,
            requested_size: 0,
            state: BlockViewState::Inactive,
        });
    }
    segs[sj].blocks.splice(bj..=bj, repl);

    let mut fresh = Allocator::new(cfg, alloc.version(), capacity);
    for s in &segs {
        // Resync only runs on native segments (expandable ones are translated instead).
        let seg = ExistingSegment { expandable: false, ..ExistingSegment::from(s) };
        fresh.add_existing_segment(&seg).ok()?;
        for b in s.blocks.iter().filter(|b| b.state == BlockViewState::PendingFree) {
            fresh.apply(&Request::FreeRequested { addr: b.addr }).ok()?;
        }
    }
    Some(fresh)
}

fn find(segs: &[crate::alloc::SegmentView], pred: impl Fn(&BlockView) -> bool) -> Option<(usize, usize)> {
    segs.iter().enumerate().find_map(|(si, s)| s.blocks.iter().position(&pred).map(|bi| (si, bi)))
}

/// Merges runs of free blocks, as `free_block` does.
fn merge_free(blocks: &mut Vec<BlockView>) {
    let mut out: Vec<BlockView> = Vec::with_capacity(blocks.len());
    for b in blocks.drain(..) {
        match out.last_mut() {
            Some(last) if last.state == BlockViewState::Inactive && b.state == BlockViewState::Inactive => {
                last.size += b.size;
            }
            _ => out.push(b),
        }
    }
    *blocks = out;
}
