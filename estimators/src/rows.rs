//! Which dataset rows a set names: the rows a profile was calibrated on (`[calibration.rows]`,
//! `[calibration.row_digests]`) and the runs `memest compare --exclude-runs` leaves out.
//!
//! A row is recognised by what it holds ([`digest`]), so a calibration row stays in-sample when
//! it comes back in a file of another name or in another order (a subset copied out, the
//! trainer's `dataset` written again after more runs). Positions (`STEM-NNNNN`) name only the
//! rows of stems no digest is known of: profiles and `runs.jsonl` written before digests.

use std::collections::{BTreeMap, BTreeSet};
use std::hash::Hasher;

/// Columns a dataset's writer derives anew each time it writes (the trainer's `dataset` fills
/// `profile` from the GPU's name and the profiles it knows then): not what the row holds.
const DERIVED: &[&str] = &["profile"];

/// The content digest of one CSV record: its cells by column name (trimmed, in name order, so
/// the columns' order and surrounding spaces do not matter; [`DERIVED`] columns left out),
/// FNV-1a 64, as 16 hex digits.
pub fn digest<'a>(headers: impl IntoIterator<Item = &'a str>, cells: impl IntoIterator<Item = &'a str>) -> String {
    let mut pairs: Vec<(&str, &str)> = headers
        .into_iter()
        .map(str::trim)
        .zip(cells.into_iter().map(str::trim))
        .filter(|(name, _)| !DERIVED.contains(name))
        .collect();
    pairs.sort_unstable();
    let mut h = fnv::FnvHasher::default();
    for (name, cell) in pairs {
        // Separators no CSV cell of these datasets holds, so ("a", "bc") and ("ab", "c") differ.
        h.write(name.as_bytes());
        h.write(&[0x1f]);
        h.write(cell.as_bytes());
        h.write(&[0x1e]);
    }
    format!("{:016x}", h.finish())
}

/// The stem of a row id `STEM-NNNNN`.
pub fn stem_of(id: &str) -> &str {
    id.rsplit_once('-').map_or(id, |(stem, _)| stem)
}

/// A set of dataset rows, by digest where one is known, else by position.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RowSet {
    ids: BTreeSet<String>,
    /// Digests by the stem of the file they were read from (kept for writing them back).
    digests: BTreeMap<String, BTreeSet<String>>,
}

impl RowSet {
    /// Adds a row: its id, and its digest (empty where it is not known).
    pub fn insert(&mut self, id: &str, digest: &str) {
        self.ids.insert(id.to_string());
        if !digest.is_empty() {
            self.insert_digests(stem_of(id), [digest]);
        }
    }

    /// Adds digests alone, under the stem they were recorded for.
    pub fn insert_digests<'a>(&mut self, stem: &str, digests: impl IntoIterator<Item = &'a str>) {
        let digests: Vec<String> = digests.into_iter().map(str::to_string).collect();
        if !digests.is_empty() {
            self.digests.entry(stem.to_string()).or_default().extend(digests);
        }
    }

    /// Whether the row is in the set: by its digest; by its position only where the set knows no
    /// digest of the row's stem (a row of a known stem whose content changed is another row).
    pub fn contains(&self, id: &str, digest: &str) -> bool {
        (!digest.is_empty() && self.digests.values().any(|d| d.contains(digest)))
            || (!self.digests.contains_key(stem_of(id)) && self.ids.contains(id))
    }

    /// Rows named, by position.
    pub fn ids(&self) -> impl Iterator<Item = &str> {
        self.ids.iter().map(String::as_str)
    }

    /// Digests known, by stem.
    pub fn digests(&self) -> &BTreeMap<String, BTreeSet<String>> {
        &self.digests
    }

    /// Rows named (by position; a set of digests alone counts its digests).
    pub fn len(&self) -> usize {
        self.ids.len().max(self.digests.values().map(BTreeSet::len).sum())
    }

    /// No row named.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Stems whose rows are named by position only (no digest known), which a renamed or
    /// reordered copy of their file would escape.
    pub fn positional_stems(&self) -> BTreeSet<&str> {
        self.ids.iter().map(|id| stem_of(id)).filter(|s| !self.digests.contains_key(*s)).collect()
    }
}
