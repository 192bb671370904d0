//! The free-block index of one stream's pool: an ordered map from [`key`](super::block::key)
//! (size, then address) to a block slot, with the order PyTorch's `std::set` gives, and a
//! faster best fit than a B-tree.
//!
//! Keys are split into size classes, sixty-four per power of two (the classes are monotone in the
//! key, so class order then in-class order is key order), with one bit per non-empty class. A best
//! fit looks in the request's own class, then takes the first entry of the next non-empty class
//! that the bitmap names. A class is a short sorted vector, and a B-tree once it holds many
//! entries (thousands of free blocks of one size), so no operation degrades to a long shift.
//! `tests::agrees_with_a_btreemap` checks every operation against `BTreeMap`.

use std::collections::BTreeMap;

/// Classes: sizes below 64 each have their own; from 64 on, sixty-four per power of two (finer
/// classes than sixteen hold fewer entries, so the searches and shifts in one are shorter).
const CLASSES: usize = 64 + 58 * 64;
const WORDS: usize = CLASSES.div_ceil(64);
/// Entries from which a class becomes a B-tree.
const TREE_FROM: usize = 64;

#[inline]
fn class_of(key: u128) -> usize {
    let size = (key >> 64) as u64;
    if size < 64 {
        return size as usize;
    }
    let e = 63 - size.leading_zeros() as usize;
    (e - 5) * 64 + ((size >> (e - 6)) & 63) as usize
}

#[derive(Debug, Clone)]
enum Class {
    Sorted(Vec<(u128, u32)>),
    Tree(BTreeMap<u128, u32>),
}

impl Class {
    fn first_at_or_after(&self, k: u128) -> Option<(u128, u32)> {
        match self {
            Class::Sorted(v) => v.get(v.partition_point(|e| e.0 < k)).copied(),
            Class::Tree(t) => t.range(k..).next().map(|(&k, &v)| (k, v)),
        }
    }

    fn first_after(&self, k: u128) -> Option<(u128, u32)> {
        match self {
            Class::Sorted(v) => v.get(v.partition_point(|e| e.0 <= k)).copied(),
            Class::Tree(t) => {
                t.range((std::ops::Bound::Excluded(k), std::ops::Bound::Unbounded)).next().map(|(&k, &v)| (k, v))
            }
        }
    }

    fn last_before(&self, k: u128) -> Option<(u128, u32)> {
        match self {
            Class::Sorted(v) => v.partition_point(|e| e.0 < k).checked_sub(1).map(|i| v[i]),
            Class::Tree(t) => t.range(..k).next_back().map(|(&k, &v)| (k, v)),
        }
    }

    fn first(&self) -> Option<(u128, u32)> {
        match self {
            Class::Sorted(v) => v.first().copied(),
            Class::Tree(t) => t.iter().next().map(|(&k, &v)| (k, v)),
        }
    }

    fn last(&self) -> Option<(u128, u32)> {
        match self {
            Class::Sorted(v) => v.last().copied(),
            Class::Tree(t) => t.iter().next_back().map(|(&k, &v)| (k, v)),
        }
    }

    /// Inserts where the class is not a short sorted one appended to (`FreeIndex::insert` does
    /// that inline); whether the key is new.
    // The shift, the switch to a tree and the tree itself are out of line, so the hot path saves
    // fewer registers (callgrind: see docs/benchmarks.md, twenty-fifth session).
    #[inline(never)]
    fn insert_slow(&mut self, k: u128, slot: u32) -> bool {
        match self {
            Class::Sorted(v) => {
                let new = match v.binary_search_by(|e| e.0.cmp(&k)) {
                    Ok(i) => {
                        v[i].1 = slot;
                        false
                    }
                    Err(i) => {
                        v.insert(i, (k, slot));
                        true
                    }
                };
                if v.len() >= TREE_FROM {
                    *self = Class::Tree(v.drain(..).collect());
                }
                new
            }
            Class::Tree(t) => t.insert(k, slot).is_none(),
        }
    }

    /// Removes; the slot, and whether the class is empty after.
    #[inline]
    fn remove(&mut self, k: u128) -> (Option<u32>, bool) {
        match self {
            Class::Sorted(v) => match v.binary_search_by(|e| e.0.cmp(&k)) {
                Ok(i) if i + 1 == v.len() => (v.pop().map(|e| e.1), v.is_empty()),
                Ok(i) => (Some(v.remove(i).1), v.is_empty()),
                Err(_) => (None, v.is_empty()),
            },
            Class::Tree(_) => self.remove_tree(k),
        }
    }

    #[inline(never)]
    fn remove_tree(&mut self, k: u128) -> (Option<u32>, bool) {
        match self {
            Class::Sorted(_) => unreachable!("remove_tree on a sorted class"),
            Class::Tree(t) => {
                let slot = t.remove(&k);
                let empty = t.is_empty();
                if empty {
                    *self = Class::Sorted(Vec::new());
                }
                (slot, empty)
            }
        }
    }

    /// Removes the first entry with key `>= k`; it, and whether the class is empty after.
    #[inline]
    fn take_at_or_after(&mut self, k: u128) -> Option<((u128, u32), bool)> {
        match self {
            Class::Sorted(v) => {
                let i = v.partition_point(|e| e.0 < k);
                let e = if i + 1 == v.len() { v.pop()? } else { (i < v.len()).then(|| v.remove(i))? };
                Some((e, v.is_empty()))
            }
            Class::Tree(_) => self.take_tree(k),
        }
    }

    #[inline(never)]
    fn take_tree(&mut self, k: u128) -> Option<((u128, u32), bool)> {
        match self {
            Class::Sorted(_) => unreachable!("take_tree on a sorted class"),
            Class::Tree(t) => {
                let key = *t.range(k..).next()?.0;
                let slot = t.remove(&key)?;
                let empty = t.is_empty();
                if empty {
                    *self = Class::Sorted(Vec::new());
                }
                Some(((key, slot), empty))
            }
        }
    }

    /// Removes the first entry: the best fit when the request's own class had none, so there is
    /// no key to search for. It, and whether the class is empty after.
    #[inline]
    fn take_first(&mut self) -> Option<((u128, u32), bool)> {
        match self {
            Class::Sorted(v) if v.len() == 1 => v.pop().map(|e| (e, true)),
            Class::Sorted(v) => (!v.is_empty()).then(|| (v.remove(0), false)),
            Class::Tree(_) => self.take_tree(0),
        }
    }

    fn push_all(&self, out: &mut Vec<u32>) {
        match self {
            Class::Sorted(v) => out.extend(v.iter().map(|e| e.1)),
            Class::Tree(t) => out.extend(t.values().copied()),
        }
    }
}

/// The 64 classes of one word of the bitmap: the sizes below 64, or one power of two.
type Group = [Class; 64];

/// What a class of a group never made holds.
static EMPTY: Class = Class::Sorted(Vec::new());

/// Class `c` to add to, its group made if it was not (a function of the groups alone, so the
/// caller may change the other fields while it holds the class).
#[inline]
fn class_to_fill(groups: &mut [Option<Box<Group>>; WORDS], c: usize) -> &mut Class {
    &mut groups[c / 64].get_or_insert_with(|| Box::new(std::array::from_fn(|_| Class::Sorted(Vec::new()))))[c % 64]
}

/// Free blocks by (size, address), as a `BTreeMap<u128, u32>` would hold them.
#[derive(Debug, Clone)]
pub(super) struct FreeIndex {
    /// A group is made at its first insert and kept: an index costs 2 KiB for each power of two
    /// it has held a block of (at most the sizes of the blocks it has held), not 118 KiB for
    /// every class at once. A pool per stream, and per CUDA graph, makes many indexes.
    groups: [Option<Box<Group>>; WORDS],
    occupied: [u64; WORDS],
    len: usize,
}

impl Default for FreeIndex {
    fn default() -> Self {
        FreeIndex { groups: [const { None }; WORDS], occupied: [0; WORDS], len: 0 }
    }
}

impl FreeIndex {
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Groups made so far.
    #[cfg(test)]
    fn groups_made(&self) -> usize {
        self.groups.iter().flatten().count()
    }

    /// Class `c`; empty where its group was never made.
    #[inline]
    fn class(&self, c: usize) -> &Class {
        match &self.groups[c / 64] {
            Some(g) => &g[c % 64],
            None => &EMPTY,
        }
    }

    /// Class `c` to change, unless its group was never made (then it is empty).
    #[inline]
    fn class_mut(&mut self, c: usize) -> Option<&mut Class> {
        self.groups[c / 64].as_mut().map(|g| &mut g[c % 64])
    }

    pub fn insert(&mut self, k: u128, slot: u32) {
        let c = class_of(k);
        // The class is not empty after, whatever it held: its bit is set without asking.
        self.occupied[c / 64] |= 1 << (c % 64);
        let class = class_to_fill(&mut self.groups, c);
        // Most classes hold one entry or none: append without a search or a shift. The count
        // before the push keeps fewer values live across it.
        if let Class::Sorted(v) = class {
            if v.last().is_none_or(|e| e.0 < k) && v.len() + 1 < TREE_FROM {
                self.len += 1;
                v.push((k, slot));
                return;
            }
        }
        self.len += usize::from(class.insert_slow(k, slot));
    }

    pub fn remove(&mut self, k: u128) -> Option<u32> {
        let c = class_of(k);
        let (slot, empty) = self.class_mut(c)?.remove(k);
        if empty {
            self.occupied[c / 64] &= !(1 << (c % 64));
        }
        self.len -= usize::from(slot.is_some());
        slot
    }

    /// The first non-empty class at or after `c`.
    #[inline]
    fn next_class(&self, c: usize) -> Option<usize> {
        let mut w = c / 64;
        if w >= WORDS {
            return None;
        }
        let mut bits = self.occupied[w] & (!0u64 << (c % 64));
        loop {
            if bits != 0 {
                return Some(w * 64 + bits.trailing_zeros() as usize);
            }
            w += 1;
            if w == WORDS {
                return None;
            }
            bits = self.occupied[w];
        }
    }

    /// The last non-empty class before `c`.
    #[inline]
    fn prev_class(&self, c: usize) -> Option<usize> {
        if c == 0 {
            return None;
        }
        let last = c - 1;
        let mut w = last / 64;
        let mut bits = self.occupied[w] & (!0u64 >> (63 - last % 64));
        loop {
            if bits != 0 {
                return Some(w * 64 + 63 - bits.leading_zeros() as usize);
            }
            if w == 0 {
                return None;
            }
            w -= 1;
            bits = self.occupied[w];
        }
    }

    /// The first entry with key `>= k` (the best fit for a key of the requested size).
    #[inline]
    pub fn first_at_or_after(&self, k: u128) -> Option<(u128, u32)> {
        let c = class_of(k);
        if let Some(e) = self.class(c).first_at_or_after(k) {
            return Some(e);
        }
        self.next_class(c + 1).and_then(|n| self.class(n).first())
    }

    /// Removes the first entry with key `>= k` and returns it: a best fit taken out with one
    /// search instead of a find and a remove.
    #[inline]
    pub fn take_first_at_or_after(&mut self, k: u128) -> Option<(u128, u32)> {
        let c = class_of(k);
        let (c, (e, empty)) = match self.class_mut(c).and_then(|class| class.take_at_or_after(k)) {
            Some(taken) => (c, taken),
            None => {
                let n = self.next_class(c + 1)?;
                (n, self.class_mut(n)?.take_first()?)
            }
        };
        if empty {
            self.occupied[c / 64] &= !(1 << (c % 64));
        }
        self.len -= 1;
        Some(e)
    }

    /// The first entry with key `> k`.
    pub fn first_after(&self, k: u128) -> Option<(u128, u32)> {
        let c = class_of(k);
        if let Some(e) = self.class(c).first_after(k) {
            return Some(e);
        }
        self.next_class(c + 1).and_then(|n| self.class(n).first())
    }

    /// The last entry with key `< k`.
    pub fn last_before(&self, k: u128) -> Option<(u128, u32)> {
        let c = class_of(k);
        if let Some(e) = self.class(c).last_before(k) {
            return Some(e);
        }
        self.prev_class(c).and_then(|p| self.class(p).last())
    }

    /// The entry with the largest key.
    pub fn last(&self) -> Option<(u128, u32)> {
        self.prev_class(CLASSES).and_then(|p| self.class(p).last())
    }

    /// Entries with key `>= k`, in key order.
    pub fn range_from(&self, k: u128) -> impl Iterator<Item = (u128, u32)> + '_ {
        std::iter::successors(self.first_at_or_after(k), move |&(k, _)| self.first_after(k))
    }

    /// Entries with key `< k`, largest first.
    pub fn range_before_rev(&self, k: u128) -> impl Iterator<Item = (u128, u32)> + '_ {
        std::iter::successors(self.last_before(k), move |&(k, _)| self.last_before(k))
    }

    /// Every slot, in key order.
    pub fn slots(&self) -> Vec<u32> {
        let mut out = Vec::with_capacity(self.len);
        let mut c = 0;
        while let Some(n) = self.next_class(c) {
            self.class(n).push_all(&mut out);
            c = n + 1;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u64, u64),
        Remove(usize),
        Query(u64, u64),
        Take(u64, u64),
    }

    /// Sizes that crowd a few classes (so classes become trees), that share classes (at 2^12 a
    /// class spans 64 B: eight of these sizes each; every size below 64 has a class of its own),
    /// and that span the whole range.
    fn size() -> impl Strategy<Value = u64> {
        prop_oneof![
            0u64..40,
            (0u64..64).prop_map(|i| 4096 + 8 * i),
            (0u64..8).prop_map(|i| 512 << i),
            any::<u64>(),
            (1u64..4).prop_map(|i| u64::MAX - i)
        ]
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (size(), 0u64..300).prop_map(|(s, a)| Op::Insert(s, a)),
            2 => any::<usize>().prop_map(Op::Remove),
            2 => (size(), 0u64..300).prop_map(|(s, a)| Op::Query(s, a)),
            1 => (size(), 0u64..300).prop_map(|(s, a)| Op::Take(s, a)),
        ]
    }

    fn key(size: u64, addr: u64) -> u128 {
        ((size as u128) << 64) | addr as u128
    }

    fn agree(index: &FreeIndex, model: &BTreeMap<u128, u32>, k: u128) {
        let pair = |(k, v): (&u128, &u32)| (*k, *v);
        assert_eq!(index.first_at_or_after(k), model.range(k..).next().map(pair));
        assert_eq!(
            index.first_after(k),
            model.range((std::ops::Bound::Excluded(k), std::ops::Bound::Unbounded)).next().map(pair)
        );
        assert_eq!(index.last_before(k), model.range(..k).next_back().map(pair));
        assert_eq!(
            index.range_from(k).take(5).collect::<Vec<_>>(),
            model.range(k..).take(5).map(pair).collect::<Vec<_>>()
        );
        let rev: Vec<_> = model.range(..k).rev().take(5).map(pair).collect();
        assert_eq!(index.range_before_rev(k).take(5).collect::<Vec<_>>(), rev);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        #[test]
        fn agrees_with_a_btreemap(ops in proptest::collection::vec(op(), 1..400)) {
            let mut index = FreeIndex::default();
            let mut model = BTreeMap::new();
            for (n, op) in ops.into_iter().enumerate() {
                match op {
                    Op::Insert(s, a) => {
                        index.insert(key(s, a), n as u32);
                        model.insert(key(s, a), n as u32);
                    }
                    Op::Remove(i) => {
                        let k = model.keys().nth(i % model.len().max(1)).copied().unwrap_or(key(7, 7));
                        prop_assert_eq!(index.remove(k), model.remove(&k));
                    }
                    Op::Query(s, a) => agree(&index, &model, key(s, a)),
                    Op::Take(s, a) => {
                        let k = key(s, a);
                        let first = model.range(k..).next().map(|(k, v)| (*k, *v));
                        if let Some((k, _)) = first {
                            model.remove(&k);
                        }
                        prop_assert_eq!(index.take_first_at_or_after(k), first);
                    }
                }
                prop_assert_eq!(index.len(), model.len());
                prop_assert_eq!(index.last(), model.iter().next_back().map(|(k, v)| (*k, *v)));
            }
            prop_assert_eq!(index.slots(), model.values().copied().collect::<Vec<_>>());
        }
    }

    #[test]
    fn groups_are_made_for_the_sizes_held_only() {
        let mut index = FreeIndex::default();
        assert_eq!(index.groups_made(), 0);
        // Queries, removes and takes of sizes never held make nothing.
        for size in [1u64, 100, 1 << 20, u64::MAX] {
            assert_eq!(index.first_at_or_after(key(size, 0)), None);
            assert_eq!(index.last_before(key(size, 0)), None);
            assert_eq!(index.remove(key(size, 0)), None);
            assert_eq!(index.take_first_at_or_after(key(size, 0)), None);
        }
        assert_eq!(index.groups_made(), 0);
        // 100 and 127 share 2^6's group, 128 and 200 2^7's, 2 MiB its own.
        for (n, size) in [100u64, 127, 128, 200, 2 << 20].into_iter().enumerate() {
            index.insert(key(size, 0), n as u32);
        }
        assert_eq!(index.groups_made(), 3);
        assert_eq!(index.take_first_at_or_after(key(129, 0)), Some((key(200, 0), 3)));
        assert_eq!(index.first_at_or_after(key(201, 0)), Some((key(2 << 20, 0), 4)));
        assert_eq!(index.last_before(key(128, 0)), Some((key(127, 0), 1)));
        assert_eq!(index.groups_made(), 3);
    }

    #[test]
    fn classes_follow_key_order() {
        // Every size to 4096, and from 2^6 on each power of two's edges and its classes' edges
        // (a class spans 2^(e-6) B).
        let mut sizes: Vec<u64> = (0..4096u64)
            .chain((6..64).flat_map(|e| {
                let (p, w) = (1u64 << e, 1u64 << (e - 6));
                [p - 1, p, p + 1, p + w - 1, p + w, p + w + 1, p + (p >> 1), (p - 1) + p]
            }))
            .collect();
        sizes.sort_unstable();
        sizes.dedup();
        let mut last = 0;
        for size in sizes.into_iter().chain([u64::MAX]) {
            let c = class_of(key(size, 0));
            assert!(c >= last && c < CLASSES, "size {size}: class {c} after {last}");
            last = c;
        }
        assert_eq!(last, CLASSES - 1);
        // A class is 2^(e-6) B wide from 2^e on: its last size shares it, the next size opens
        // the next one.
        for e in 6..64 {
            let (p, w) = (1u64 << e, 1u64 << (e - 6));
            let c = class_of(key(p, 0));
            assert_eq!((class_of(key(p + w - 1, 0)), class_of(key(p + w, 0))), (c, c + 1), "2^{e}");
        }
    }
}
