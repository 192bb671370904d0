//! Seeded splits: sklearn-shaped `train_test_split` and `KFold(shuffle=True)` for reproducing
//! GPUMemNet, and stratified hold-out plus stratified k-fold for the honest protocol.
//!
//! All functions return positions into the example set. Python's Mersenne-Twister permutations
//! cannot be reproduced bit-for-bit here, so "seed 42" means the same seed fed to `StdRng` (rand
//! 0.8, ChaCha12): the split sizes and procedure match sklearn, the exact members do not.

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;

use super::error::MlError;

/// A training set and an evaluation set, disjoint, as positions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Split {
    /// Positions to train on.
    pub train: Vec<usize>,
    /// Positions to evaluate on.
    pub test: Vec<usize>,
}

fn permutation(n: usize, seed: u64) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..n).collect();
    idx.shuffle(&mut StdRng::seed_from_u64(seed));
    idx
}

/// sklearn's `train_test_split(test_size=frac, random_state=seed)` shape: `ceil(frac·n)` test
/// rows taken from the front of a seeded permutation, the rest train.
pub fn train_test_split(n: usize, test_frac: f64, seed: u64) -> Split {
    let n_test = ((test_frac * n as f64).ceil() as usize).min(n);
    let perm = permutation(n, seed);
    Split { test: perm[..n_test].to_vec(), train: perm[n_test..].to_vec() }
}

/// GPUMemNet's 70/20/10 split: `train_test_split(0.3)` then `train_test_split(0.66)` of the 30%,
/// whose *test* part (≈20%) it names validation and whose *train* part (≈10%) it names test.
/// Returns (train, validation, test) positions.
pub fn gpumemnet_split(n: usize, seed: u64) -> (Vec<usize>, Vec<usize>, Vec<usize>) {
    let first = train_test_split(n, 0.3, seed);
    let second = train_test_split(first.test.len(), 0.66, seed);
    let map = |v: &[usize]| v.iter().map(|&i| first.test[i]).collect::<Vec<_>>();
    (first.train, map(&second.test), map(&second.train))
}

/// sklearn's `KFold(n_splits=k, shuffle=True)`: a seeded permutation cut into `k` consecutive
/// folds, the first `n % k` one row larger.
pub fn kfold(n: usize, k: usize, seed: u64) -> Result<Vec<Split>, MlError> {
    if k < 2 || k > n {
        return Err(MlError::Invalid(format!("k-fold needs 2 <= k <= rows, got k={k} for {n} rows")));
    }
    let perm = permutation(n, seed);
    let mut folds = Vec::with_capacity(k);
    let mut start = 0;
    for f in 0..k {
        let size = n / k + usize::from(f < n % k);
        let test = perm[start..start + size].to_vec();
        let train = perm[..start].iter().chain(&perm[start + size..]).copied().collect();
        folds.push(Split { train, test });
        start += size;
    }
    Ok(folds)
}

fn by_class(labels: &[usize], seed: u64) -> Vec<Vec<usize>> {
    let n_classes = labels.iter().max().map_or(0, |m| m + 1);
    let mut groups = vec![Vec::new(); n_classes];
    for (i, &c) in labels.iter().enumerate() {
        groups[c].push(i);
    }
    let mut rng = StdRng::seed_from_u64(seed);
    for g in &mut groups {
        g.shuffle(&mut rng);
    }
    groups
}

/// Stratified hold-out: from each class, `round(frac·n_c)` seeded-random rows go to the test set
/// (at least one when the class has two or more rows, so every class is tested).
pub fn stratified_holdout(labels: &[usize], test_frac: f64, seed: u64) -> Split {
    let mut split = Split { train: Vec::new(), test: Vec::new() };
    for group in by_class(labels, seed) {
        let mut n_test = (test_frac * group.len() as f64).round() as usize;
        if n_test == 0 && group.len() >= 2 && test_frac > 0.0 {
            n_test = 1;
        }
        split.test.extend(&group[..n_test]);
        split.train.extend(&group[n_test..]);
    }
    split.train.sort_unstable();
    split.test.sort_unstable();
    split
}

/// Stratified k-fold: each class's rows, shuffled with the seed, are dealt round-robin to the
/// folds, continuing from where the previous class stopped, so fold sizes differ by at most one
/// and each fold holds each class in proportion.
pub fn stratified_kfold(labels: &[usize], k: usize, seed: u64) -> Result<Vec<Split>, MlError> {
    if k < 2 || k > labels.len() {
        return Err(MlError::Invalid(format!(
            "stratified k-fold needs 2 <= k <= rows, got k={k} for {} rows",
            labels.len()
        )));
    }
    let mut fold_of = vec![0usize; labels.len()];
    let mut next = 0;
    for group in by_class(labels, seed) {
        for i in group {
            fold_of[i] = next % k;
            next += 1;
        }
    }
    Ok((0..k)
        .map(|f| Split {
            train: (0..labels.len()).filter(|&i| fold_of[i] != f).collect(),
            test: (0..labels.len()).filter(|&i| fold_of[i] == f).collect(),
        })
        .collect())
}
