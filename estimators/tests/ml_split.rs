//! ML estimators: seeded splits, stratification and the no-leak guarantees of the CV plan.

use std::collections::BTreeSet;

use estimators::ml::protocol::{self, ProtocolConfig};
use estimators::ml::split::{self, Split};
use estimators::ml::{Dataset, Examples, Family, Target};
use proptest::prelude::*;

fn assert_partition(folds: &[Split], n: usize) {
    let mut seen = vec![0; n];
    for f in folds {
        let train: BTreeSet<_> = f.train.iter().collect();
        assert!(f.test.iter().all(|i| !train.contains(i)), "fold train and test overlap");
        assert_eq!(f.train.len() + f.test.len(), n);
        for &i in &f.test {
            seen[i] += 1;
        }
    }
    assert!(seen.iter().all(|&s| s == 1), "every row is tested exactly once");
}

fn imbalanced() -> Vec<usize> {
    // GPUMemNet step-2-like imbalance: 600 / 90 / 30 / 9.
    [(0, 600), (1, 90), (2, 30), (3, 9)].iter().flat_map(|&(c, n)| std::iter::repeat_n(c, n)).collect()
}

fn check_stratified(labels: &[usize], folds: &[Split]) {
    let k = folds.len();
    let n_classes = labels.iter().max().unwrap() + 1;
    for c in 0..n_classes {
        let total = labels.iter().filter(|&&l| l == c).count();
        for f in folds {
            let in_fold = f.test.iter().filter(|&&i| labels[i] == c).count();
            let ideal = total as f64 / k as f64;
            assert!((in_fold as f64 - ideal).abs() <= 1.0, "class {c}: {in_fold} in a fold, ideal {ideal:.2}");
        }
    }
}

#[test]
fn stratified_kfold_keeps_class_proportions() {
    let labels = imbalanced();
    let folds = split::stratified_kfold(&labels, 3, 42).unwrap();
    assert_partition(&folds, labels.len());
    check_stratified(&labels, &folds);
    let sizes: Vec<usize> = folds.iter().map(|f| f.test.len()).collect();
    assert!(sizes.iter().max().unwrap() - sizes.iter().min().unwrap() <= 1, "{sizes:?}");
}

#[test]
fn stratified_holdout_keeps_class_proportions() {
    let labels = imbalanced();
    let s = split::stratified_holdout(&labels, 0.2, 7);
    let per = |idx: &[usize], c| idx.iter().filter(|&&i| labels[i] == c).count();
    for (c, n, want) in [(0, 600, 120), (1, 90, 18), (2, 30, 6), (3, 9, 2)] {
        assert_eq!(per(&s.test, c), want, "class {c}");
        assert_eq!(per(&s.train, c), n - want, "class {c}");
    }
}

#[test]
fn kfold_and_gpumemnet_split_have_sklearn_sizes() {
    let folds = split::kfold(10, 3, 42).unwrap();
    assert_eq!(folds.iter().map(|f| f.test.len()).collect::<Vec<_>>(), vec![4, 3, 3]);
    assert_partition(&folds, 10);
    let (train, val, test) = split::gpumemnet_split(3000, 42);
    assert_eq!((train.len(), val.len(), test.len()), (2100, 594, 306));
    let all: BTreeSet<usize> = train.iter().chain(&val).chain(&test).copied().collect();
    assert_eq!(all.len(), 3000);
    assert!(split::kfold(2, 3, 1).is_err());
}

#[test]
fn splits_are_deterministic_for_a_seed() {
    let labels = imbalanced();
    assert_eq!(split::stratified_kfold(&labels, 3, 42).unwrap(), split::stratified_kfold(&labels, 3, 42).unwrap());
    assert_ne!(split::stratified_kfold(&labels, 3, 42).unwrap(), split::stratified_kfold(&labels, 3, 43).unwrap());
    assert_eq!(split::kfold(100, 3, 5).unwrap(), split::kfold(100, 3, 5).unwrap());
    assert_eq!(split::train_test_split(100, 0.3, 9), split::train_test_split(100, 0.3, 9));
}

/// The plan the CV runs never lets a held-out row into any fold, in training or evaluation.
#[test]
fn cv_plan_never_touches_held_out_rows() {
    let path = crate::ml_data::gpumemnet("mlp_data_step2.csv");
    let ex = Examples::build(&Dataset::load(&path).unwrap(), &Target::memory(Family::Mlp)).unwrap();
    let p = protocol::plan(&ex, &ProtocolConfig::default()).unwrap();
    let held: BTreeSet<usize> = p.holdout.test.iter().copied().collect();
    let dev: BTreeSet<usize> = p.holdout.train.iter().copied().collect();
    assert!(held.is_disjoint(&dev));
    assert_eq!(held.len() + dev.len(), ex.len());
    let mut tested = BTreeSet::new();
    for f in &p.folds {
        assert!(f.train.iter().all(|i| !held.contains(i)), "held-out row trained on");
        assert!(f.test.iter().all(|i| !held.contains(i)), "held-out row used in CV");
        assert!(f.train.iter().all(|i| !f.test.contains(i)));
        tested.extend(f.test.iter().copied());
    }
    assert_eq!(tested, dev, "folds partition exactly the development rows");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn stratified_kfold_partitions_and_balances(
        labels in prop::collection::vec(0usize..5, 6..300),
        k in 2usize..6,
        seed in any::<u64>(),
    ) {
        prop_assume!(k <= labels.len());
        let folds = split::stratified_kfold(&labels, k, seed).unwrap();
        assert_partition(&folds, labels.len());
        check_stratified(&labels, &folds);
    }
}
