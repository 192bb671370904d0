//! Property tests of metric invariants.

use estimators::metrics::{bin_of, compute, quantile, Run};
use proptest::prelude::*;

proptest! {
    #[test]
    fn exact_estimates_score_perfectly(truths in proptest::collection::vec(1.0f64..1e11, 1..40)) {
        let runs: Vec<Run> = truths.iter().map(|&t| Run { truth: Some(t), real_oom: false, estimate: Ok(t), capped_rerun_ok: None, seconds: None }).collect();
        let m = compute(&runs, 2e11);
        prop_assert_eq!(m.mre, Some(0.0));
        prop_assert_eq!(m.pef, Some(0.0));
        prop_assert_eq!(m.under_fraction, Some(0.0));
        prop_assert!(m.bins.iter().all(|b| b.accuracy == 1.0 && b.macro_f1 == 1.0));
    }

    #[test]
    fn mre_is_bounded_by_the_extremes(pairs in proptest::collection::vec((1.0f64..1e6, 0.0f64..1e6), 1..40)) {
        let runs: Vec<Run> = pairs.iter().map(|&(t, e)| Run { truth: Some(t), real_oom: false, estimate: Ok(e), capped_rerun_ok: None, seconds: None }).collect();
        let m = compute(&runs, 1e12);
        let errs: Vec<f64> = pairs.iter().map(|(t, e)| (e - t).abs() / t).collect();
        let lo = errs.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = errs.iter().copied().fold(0.0, f64::max);
        let mre = m.mre.unwrap();
        prop_assert!(mre >= lo - 1e-12 && mre <= hi + 1e-12);
        prop_assert!(m.pef.unwrap() >= 0.0 && m.pef.unwrap() <= 100.0);
    }

    #[test]
    fn quantiles_are_monotone(mut v in proptest::collection::vec(-1e6f64..1e6, 1..50), a in 0.0f64..1.0, b in 0.0f64..1.0) {
        v.sort_by(f64::total_cmp);
        let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
        prop_assert!(quantile(&v, lo).unwrap() <= quantile(&v, hi).unwrap());
    }

    #[test]
    fn bins_are_monotone(x in 0.0f64..1e6, y in 0.0f64..1e6, w in 1.0f64..1e4) {
        if x <= y { prop_assert!(bin_of(x, w) <= bin_of(y, w)); }
    }
}
