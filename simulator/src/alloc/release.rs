//! Giving cached memory back (spec §8–§9): freeing whole unsplit segments, the OOM path's
//! release of cached blocks at least as large as the request, and the garbage collector's
//! oldest-first release under `garbage_collection_threshold`.

use super::block::{unkey, Block};
use super::native::{dec, pool_of, Allocator, LARGE, SMALL};
use super::request::{DeviceEvent, Outcome};
use super::version::TorchVersion;

impl Allocator {
    /// `release_block`: cudaFree a whole, unsplit, free native segment.
    pub(super) fn release_block(&mut self, i: u32, out: &mut Outcome) {
        let (addr, size, small) = {
            let b = &self.arena[i];
            (b.addr, b.size, b.small)
        };
        self.pools[pool_of(small)].remove(&self.arena, i);
        self.segments.remove(&addr);
        self.mapped_ranges -= 1;
        self.arena.remove(i);
        dec(&mut self.stats.segment, small, 1);
        dec(&mut self.stats.reserved_bytes, small, size);
        if size >= self.cfg.max_split_size {
            self.stats.oversize_segments.decrease(1);
        }
        self.stats.num_device_free += 1;
        out.device_events.push(DeviceEvent::SegmentFree { addr, size });
    }

    /// A free block `release_block` may take. PyTorch would cudaFree a split block here too
    /// (corrupting its neighbours); the model refuses instead.
    pub(super) fn releasable(&self, i: u32) -> bool {
        let b = &self.arena[i];
        !b.expandable && !b.is_split()
    }

    pub(super) fn release_available_cached_blocks(
        &mut self,
        small: bool,
        stream: i64,
        size: u64,
        out: &mut Outcome,
    ) -> bool {
        let msp = self.cfg.max_split_size;
        if msp == u64::MAX {
            return false;
        }
        let key = size.max(msp);
        let Some(sp) = self.pools[pool_of(small)].of(stream) else { return false };
        let hit = sp.blocks.first_at_or_after(super::block::key(key, 0)).map(|(_, i)| i);
        let skip_expandable = self.version >= TorchVersion::V2_5;
        match hit {
            Some(i) if !(skip_expandable && self.arena[i].expandable) => {
                if !self.releasable(i) {
                    return false;
                }
                self.release_block(i, out);
                true
            }
            _ => {
                // No single block is large enough: free oversize blocks, largest first.
                let mut victims = Vec::new();
                let mut total = 0u64;
                for (k, i) in sp.blocks.range_before_rev(super::block::key(key, 0)) {
                    let (bsize, _) = unkey(k);
                    if total >= key || bsize < msp {
                        break;
                    }
                    if self.releasable(i) {
                        victims.push(i);
                        total += bsize;
                    }
                }
                for i in victims {
                    self.release_block(i, out);
                }
                total >= key
            }
        }
    }

    /// `release_cached_blocks` (also `empty_cache`): sync pending frees, then release every
    /// unsplit free segment (large pool first) and unmap free expandable pages.
    pub(super) fn release_cached_blocks(&mut self, out: &mut Outcome) {
        self.stats.num_sync_all_streams += 1;
        self.process_events(out);
        for p in [LARGE, SMALL] {
            let mut to_unmap = Vec::new();
            for i in self.pools[p].all_blocks() {
                if self.arena[i].expandable {
                    to_unmap.push(i);
                } else if !self.arena[i].is_split() {
                    self.release_block(i, out);
                }
            }
            for i in to_unmap {
                if let Some(u) = self.unmap_block(i, out) {
                    if !self.arena[u].is_split() {
                        self.release_expandable_segment(u);
                    }
                }
            }
        }
    }

    /// `garbage_collect_cached_blocks`: with a memory fraction and a threshold, release old
    /// unsplit large-pool blocks until usage falls to the threshold.
    pub(super) fn garbage_collect_cached_blocks(&mut self, out: &mut Outcome) {
        let Some(max) = self.allowed_max else { return };
        let threshold = (self.cfg.garbage_collection_threshold * max as f64) as u64;
        let total = self.reserved();
        if total <= threshold {
            return;
        }
        let target = total - threshold;
        let calls = self.pools[LARGE].free_calls;
        let age = |b: &Block| calls - b.gc_base;
        let mut total_age = 0u64;
        let mut freeable = 0u64;
        for i in self.pools[LARGE].all_blocks() {
            if !self.arena[i].is_split() {
                total_age += age(&self.arena[i]);
                freeable += 1;
            }
        }
        let mut reclaimed = 0u64;
        let mut freed_any = true;
        while reclaimed < target && freed_any && freeable > 0 {
            let threshold_age = total_age as f64 / freeable as f64;
            freed_any = false;
            for i in self.pools[LARGE].all_blocks() {
                let b = &self.arena[i];
                if self.releasable(i) && age(b) as f64 >= threshold_age {
                    freed_any = true;
                    reclaimed += b.size;
                    total_age -= age(b);
                    freeable -= 1;
                    self.release_block(i, out);
                }
            }
        }
    }
}
