//! A map from addresses to small numbers, for the two maps a replay touches at every request:
//! the allocator's live blocks by address and the classifier's number of each live trace address.
//!
//! Why: a general hash map (hashbrown) spends some 60 instructions on an insert and 30 on a
//! look-up of a `u64` key; this one, open addressing with linear probing at most half full and a
//! multiplicative hash, a third of that (docs/benchmarks.md, twenty-fifth session). It holds only
//! what they need: insert, get, remove; removal shifts the entries after it back, so there are no
//! tombstones and a look-up stops at the first empty slot.

/// A value slot that holds nothing.
const EMPTY: u32 = u32::MAX;

/// `u64` keys to `u32` values other than `u32::MAX`.
#[derive(Debug, Clone)]
pub(crate) struct AddrMap {
    /// Keys and values; a power of two long, at most half full.
    slots: Vec<(u64, u32)>,
    len: usize,
    /// 64 minus log2 of the slot count: a hash's top bits pick the slot.
    shift: u32,
}

impl Default for AddrMap {
    fn default() -> Self {
        AddrMap { slots: vec![(0, EMPTY); 16], len: 0, shift: 64 - 4 }
    }
}

impl AddrMap {
    #[inline(always)]
    fn home(&self, key: u64) -> usize {
        // Fibonacci hashing of the key with its high half folded in; the top bits of the product
        // depend on every bit of the key.
        ((key ^ (key >> 32)).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> self.shift) as usize
    }

    #[inline(always)]
    fn mask(&self) -> usize {
        self.slots.len() - 1
    }

    /// The slot of `key`, or of the empty slot that ends its probe.
    #[inline(always)]
    fn find(&self, key: u64) -> (usize, bool) {
        let mask = self.mask();
        let mut i = self.home(key);
        loop {
            let (k, v) = self.slots[i];
            if v == EMPTY {
                return (i, false);
            }
            if k == key {
                return (i, true);
            }
            i = (i + 1) & mask;
        }
    }

    /// The value of `key`.
    #[inline(always)]
    pub(crate) fn get(&self, key: u64) -> Option<u32> {
        match self.find(key) {
            (i, true) => Some(self.slots[i].1),
            _ => None,
        }
    }

    /// The value of `key`, inserting `value()` when there is none.
    #[inline(always)]
    pub(crate) fn get_or_insert_with(&mut self, key: u64, value: impl FnOnce() -> u32) -> u32 {
        match self.find(key) {
            (i, true) => self.slots[i].1,
            (i, false) => {
                let v = value();
                self.put(i, key, v);
                v
            }
        }
    }

    /// Sets `key` to `value`, returning the value it replaces.
    #[inline(always)]
    pub(crate) fn insert(&mut self, key: u64, value: u32) -> Option<u32> {
        match self.find(key) {
            (i, true) => Some(std::mem::replace(&mut self.slots[i].1, value)),
            (i, false) => {
                self.put(i, key, value);
                None
            }
        }
    }

    /// A new entry in the empty slot `i`, where `key`'s probe ended.
    #[inline(always)]
    fn put(&mut self, i: usize, key: u64, value: u32) {
        assert!(value != EMPTY, "AddrMap values are below u32::MAX");
        self.slots[i] = (key, value);
        self.len += 1;
        if self.len * 2 > self.slots.len() {
            self.grow();
        }
    }

    #[cold]
    fn grow(&mut self) {
        let doubled = vec![(0, EMPTY); self.slots.len() * 2];
        let old = std::mem::replace(&mut self.slots, doubled);
        self.shift -= 1;
        for (k, v) in old.into_iter().filter(|&(_, v)| v != EMPTY) {
            let (i, _) = self.find(k);
            self.slots[i] = (k, v);
        }
    }

    /// Removes `key`, returning its value.
    #[inline(always)]
    pub(crate) fn remove(&mut self, key: u64) -> Option<u32> {
        let (mut hole, true) = self.find(key) else { return None };
        let value = self.slots[hole].1;
        self.len -= 1;
        // Backward shift: an entry after the hole whose home is not strictly between the hole
        // and it (cyclically) moves into the hole, which moves on to where it was.
        let mask = self.mask();
        let mut i = hole;
        loop {
            i = (i + 1) & mask;
            let (k, v) = self.slots[i];
            if v == EMPTY {
                break;
            }
            let home = self.home(k);
            if (i.wrapping_sub(home) & mask) >= (i.wrapping_sub(hole) & mask) {
                self.slots[hole] = (k, v);
                hole = i;
            }
        }
        self.slots[hole].1 = EMPTY;
        Some(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// Random operations, on keys crowded into few home slots (and spread out), agree with a
    /// `HashMap`, and every entry stays reachable.
    #[test]
    fn agrees_with_a_hash_map() {
        let mut seed = 0x1234_5678_9abc_def0u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for keys in [8u64, 40, 1000, 1 << 40] {
            let (mut m, mut want) = (AddrMap::default(), HashMap::new());
            for n in 0..20_000u32 {
                let r = next();
                // Multiples of 512 from a base, as allocator addresses are; or anything.
                let key = if keys == 1 << 40 { r >> 3 } else { (1 << 40) + (r >> 20) % keys * 512 };
                match r % 4 {
                    0 | 1 => assert_eq!(m.insert(key, n), want.insert(key, n)),
                    2 => assert_eq!(m.remove(key), want.remove(&key)),
                    _ => assert_eq!(m.get_or_insert_with(key, || n), *want.entry(key).or_insert(n)),
                }
                assert_eq!(m.len, want.len());
                assert_eq!(m.get(key), want.get(&key).copied());
            }
            for (k, v) in &want {
                assert_eq!(m.get(*k), Some(*v));
            }
            assert_eq!(m.slots.iter().filter(|s| s.1 != EMPTY).count(), want.len());
        }
    }
}
