//! The replay's half of the address translation: each live block by the number the
//! [`Classifier`](super::Classifier) gave its trace address.
//!
//! Frees in the trace name trace addresses, and the model may have placed the block elsewhere
//! (synthetic addresses, or a divergence from the recorded run). What this keeps is exactly what
//! a map from trace address to block would hold, read through the classifier's numbers:
//! - an allocation that the model places stores its block under its number, replacing any
//!   block there (an allocation over a live trace address replaces it);
//! - one the model refuses leaves what was there;
//! - a free takes its block out, and puts it back when the model refuses the free. The
//!   classifier has then already given the number back, so the block goes to a small map by
//!   trace address (`unnumbered`), where later requests at that address find it;
//! - an allocation the model could not place (out of memory) marks its number `failed` until it
//!   is placed again or a free completes: a free of that number with no block live there has
//!   nothing to free, and is left out and counted (`failed_frees`), not refused as a damaged
//!   trace's would be (the map by trace address has the same rule in `tests/replay_live.rs`).
//!
//! Invariant: while the classifier numbers a trace address, `unnumbered` holds nothing at that
//! address. An allocation restores it: a placed one removes the address from `unnumbered`, and a
//! refused one moves the block from there to its number. `tests/replay_live.rs` checks all of
//! this against a map by trace address, on random traces with refused requests of every kind.

use hashbrown::HashMap;
use trace::Category;

/// A live block, as the replay knows it.
#[derive(Debug, Clone, Copy)]
pub(super) struct LiveBlock {
    /// Where the model placed it.
    pub model_addr: u64,
    /// Its size in the model.
    pub size: u64,
    /// The trace's address of it.
    pub trace_addr: u64,
    pub device: u32,
    pub category: Option<Category>,
    /// Its free was requested: allocated bytes already dropped.
    pub requested: bool,
}

#[derive(Debug, Default)]
pub(super) struct LiveBlocks {
    by_id: Vec<Option<LiveBlock>>,
    /// Blocks whose refused free came after the classifier gave their number back, by (device,
    /// trace address). Empty unless the model refused a free.
    unnumbered: HashMap<(u32, u64), LiveBlock>,
    /// Numbers of allocations the model could not place (out of memory at any capacity, or at
    /// the budget), until their number is freed or placed again: their frees have nothing to free.
    failed: hashbrown::HashSet<u32>,
    /// Frees of such allocations left out of the replay, each counted once: at its completing
    /// record (an immediate free, or the completion of a requested one).
    pub failed_frees: u64,
}

impl LiveBlocks {
    /// The block at a trace address, by its number when it has one.
    #[inline(always)]
    pub fn get(&self, device: u32, id: Option<u32>, addr: u64) -> Option<&LiveBlock> {
        match id {
            Some(id) => self.by_id.get(id as usize)?.as_ref(),
            None if self.unnumbered.is_empty() => None,
            None => self.unnumbered.get(&(device, addr)),
        }
    }

    #[inline(always)]
    pub fn get_mut(&mut self, device: u32, id: Option<u32>, addr: u64) -> Option<&mut LiveBlock> {
        match id {
            Some(id) => self.by_id.get_mut(id as usize)?.as_mut(),
            None if self.unnumbered.is_empty() => None,
            None => self.unnumbered.get_mut(&(device, addr)),
        }
    }

    /// Takes the block out for a free.
    #[inline(always)]
    pub fn take(&mut self, device: u32, id: Option<u32>, addr: u64) -> Option<LiveBlock> {
        match id {
            Some(id) => self.by_id.get_mut(id as usize)?.take(),
            None if self.unnumbered.is_empty() => None,
            None => self.unnumbered.remove(&(device, addr)),
        }
    }

    /// A refused free's block goes back; its number is no longer its address's.
    #[cold]
    pub fn put_back(&mut self, b: LiveBlock) {
        self.unnumbered.insert((b.device, b.trace_addr), b);
    }

    /// The model placed an allocation whose trace address has this number; returns whether it
    /// replaced a block still live there (the trace never freed it).
    #[inline(always)]
    pub fn placed(&mut self, id: u32, b: LiveBlock) -> bool {
        if !self.unnumbered.is_empty() {
            self.unnumbered.remove(&(b.device, b.trace_addr));
        }
        if !self.failed.is_empty() {
            self.failed.remove(&id);
        }
        self.slot(id).replace(b).is_some()
    }

    /// The model refused an allocation (or placed nothing) whose trace address has this number.
    #[inline(always)]
    pub fn refused(&mut self, device: u32, id: u32, addr: u64) {
        if self.unnumbered.is_empty() {
            return;
        }
        let moved = self.unnumbered.remove(&(device, addr));
        let slot = self.slot(id);
        if slot.is_none() {
            *slot = moved;
        }
    }

    /// The model could not place the allocation with this number (out of memory).
    #[cold]
    pub fn failed(&mut self, id: u32) {
        self.failed.insert(id);
    }

    /// Whether a free of this number is one of an allocation the model could not place, with no
    /// block live there: counted, and left out (a real run would have raised out of memory, and
    /// a traced one frees what it never got). A free that completes forgets the number.
    #[inline(always)]
    pub fn frees_failed(&mut self, id: u32, completes: bool) -> bool {
        if self.failed.is_empty() {
            return false;
        }
        let failed = if completes { self.failed.remove(&id) } else { self.failed.contains(&id) };
        let skip = failed && !self.by_id.get(id as usize).is_some_and(Option::is_some);
        self.failed_frees += u64::from(skip && completes);
        skip
    }

    #[inline(always)]
    fn slot(&mut self, id: u32) -> &mut Option<LiveBlock> {
        let i = id as usize;
        if i >= self.by_id.len() {
            self.grow(i);
        }
        &mut self.by_id[i]
    }

    #[cold]
    fn grow(&mut self, i: usize) {
        self.by_id.resize((i + 1).max(self.by_id.len() * 2), None);
    }

    /// A device's live blocks.
    pub fn of_device(&self, device: u32) -> impl Iterator<Item = &LiveBlock> {
        self.by_id.iter().flatten().chain(self.unnumbered.values()).filter(move |b| b.device == device)
    }
}
