//! Calibration: weighted quantiles, recovery of known constants, held-out evaluation, and the
//! rewritten profile still loading.

use std::path::Path;

use std::collections::BTreeMap;

use estimators::calibrate::{
    calibrated_ids, fit, rewrite_profile, rows_by_dataset, split, weighted_median, weighted_quantile, CalRun,
};
use simulator::profile::{OutsideAllocator, Profile};

#[test]
fn weighted_medians() {
    let check = |v: &[(f64, f64)], want: Option<f64>| assert_eq!(weighted_median(v), want, "{v:?}");
    check(&[], None);
    check(&[(5.0, 1.0)], Some(5.0));
    check(&[(1.0, 1.0), (2.0, 1.0), (3.0, 1.0)], Some(2.0));
    check(&[(1.0, 1.0), (2.0, 1.0), (100.0, 10.0)], Some(100.0));
    assert_eq!(weighted_quantile(&[(1.0, 1.0), (2.0, 1.0), (3.0, 1.0), (4.0, 1.0)], 0.9), Some(4.0));
}

fn runs(n: usize, conv: bool, outside: f64) -> Vec<CalRun> {
    (0..n)
        .map(|i| {
            let reserved = 50.0 + 37.0 * i as f64;
            CalRun {
                id: format!("{conv}-{i}"),
                truth_mib: reserved + outside,
                reserved_mib: reserved,
                uses_gemm: true,
                uses_conv: conv,
            }
        })
        .collect()
}

#[test]
fn recovers_known_constants_and_reports_held_out_error() {
    // Truth = reserved + 400 (context) + 600 (cuBLAS) [+ 250 (cuDNN)].
    let mut all = runs(40, false, 1000.0);
    all.extend(runs(40, true, 1250.0));
    let (train, test) = split(&all, 0.25, 3);
    assert_eq!(test.len(), 20);
    let prior = OutsideAllocator { context_mib: 400.0, cublas_mib: 0.0, cudnn_mib: 0.0, ..Default::default() };
    let f = fit(&prior, &train, &test, 0.5, 40e9).unwrap();
    assert_eq!((f.outside.context_mib, f.outside.cublas_mib, f.outside.cudnn_mib), (400.0, 600.0, 250.0));
    assert!(f.after.mre.unwrap() < 1e-12);
    assert!(f.before.mre.unwrap() > 0.1);
    assert!(f.notes.iter().any(|n| n.contains("context_mib kept")));
}

#[test]
fn split_is_by_id_and_disjoint() {
    let all = runs(50, false, 1.0);
    let (tr, te) = split(&all, 0.3, 1);
    assert_eq!(tr.len() + te.len(), 50);
    assert!(te.iter().all(|t| !tr.iter().any(|r| r.id == t.id)));
    assert_eq!(split(&all, 0.3, 1), (tr.clone(), te.clone()), "same seed, same split");
    assert_ne!(split(&all, 0.3, 2).1, te, "another seed, another split");
}

#[test]
fn nothing_to_fit_is_an_error() {
    let prior = OutsideAllocator { context_mib: 400.0, cublas_mib: 0.0, cudnn_mib: 0.0, ..Default::default() };
    let e = fit(&prior, &[], &[], 0.5, 40e9).unwrap_err().to_string();
    assert!(e.contains("nothing to fit"), "{e}");
}

#[test]
fn rewritten_profile_loads_with_new_constants() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../profiles/a100-40gb.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let o = OutsideAllocator { context_mib: 401.5, cublas_mib: 612.31, cudnn_mib: 77.0, ..Default::default() };
    // The profile's own [provenance] is replaced by one naming another key.
    let start = text.find("\n[provenance]").expect("the profile has a [provenance] table");
    let end = text[start + 1..].find("\n[").map_or(text.len(), |i| start + 1 + i);
    let text = format!("{}{}\n[provenance]\nunmeasured = [\"gpu.sm_count\"]\n", &text[..start], &text[end..]);
    let rows = rows_by_dataset(["mlp-00007", "mlp-00003", "cnn_early-00010", "bad"]);
    let out = rewrite_profile(&text, &o, &[("note".into(), "a \"quoted\" value".into())], &rows);
    let p = Profile::parse(&out, &path).unwrap();
    // Tables after [calibration] survive the rewrite.
    assert_eq!(p.provenance.unmeasured, vec!["gpu.sm_count".to_string()]);
    let ids: Vec<String> = calibrated_ids(&p.calibration).unwrap().into_iter().collect();
    assert_eq!(ids, vec!["cnn_early-00010", "mlp-00003", "mlp-00007"]);
    // The fitted terms are rewritten; the NCCL terms, not fitted by calibrate, stay as they were.
    assert_eq!(
        p.outside_allocator,
        OutsideAllocator {
            context_mib: 401.5,
            cublas_mib: 612.3,
            cudnn_mib: 77.0,
            nccl_communicator_mib: 64.0,
            nccl_per_peer_mib: 32.0
        }
    );
    assert_eq!(p.calibration.get("note").and_then(|v| v.as_str()), Some("a \"quoted\" value"));
    // Rewriting again replaces the [calibration] table rather than appending a second one.
    let again = rewrite_profile(&out, &o, &[("note".into(), "second".into())], &BTreeMap::new());
    assert!(!again.contains("\n\n\n"), "blank lines pile up: {again}");
    let p = Profile::parse(&again, &path).unwrap();
    assert_eq!(p.calibration.get("note").and_then(|v| v.as_str()), Some("second"));
    assert!(calibrated_ids(&p.calibration).unwrap().is_empty());
    assert_eq!(p.provenance.unmeasured.len(), 1);
}

#[test]
fn the_shipped_profile_names_the_rows_it_was_calibrated_on() {
    // [calibration.rows] of the A100 profile are the seed-1 subsets of 150 rows that
    // `memest compare --limit 150 --seed 1` chose from the two calibration datasets.
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../profiles/a100-40gb.toml");
    let p = Profile::load(path.to_str().unwrap()).unwrap().0;
    let ids = calibrated_ids(&p.calibration).unwrap();
    let mut want = std::collections::BTreeSet::new();
    for f in ["mlp_data_step2.csv", "cnn_data_step1_early.csv"] {
        let rows = estimators::dataset::load(&crate::common::shared(&format!("gpumemnet/{f}")), &[]).unwrap();
        want.extend(estimators::dataset::seeded_subset(&rows, 150, 1).into_iter().map(|r| r.id));
    }
    assert_eq!(ids, want);
}
