//! Calibration: weighted quantiles, recovery of known constants, held-out evaluation, and the
//! rewritten profile still loading.

use std::path::Path;

use estimators::calibrate::{calibrated_rows, fit, rewrite_profile, split, weighted_median, weighted_quantile, CalRun};
use estimators::rows::{digest, RowSet};
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
    let mut rows = RowSet::default();
    for id in ["mlp-00007", "mlp-00003", "cnn_early-00010", "bad"] {
        rows.insert(id, "");
    }
    rows.insert("mlp-00009", "00000000000000ff");
    let out = rewrite_profile(&text, &o, &[("note".into(), "a \"quoted\" value".into())], &rows);
    let p = Profile::parse(&out, &path).unwrap();
    // Tables after [calibration] survive the rewrite.
    assert_eq!(p.provenance.unmeasured, vec!["gpu.sm_count".to_string()]);
    let back = calibrated_rows(&p.calibration).unwrap();
    assert_eq!(back.ids().collect::<Vec<_>>(), vec!["cnn_early-00010", "mlp-00003", "mlp-00007", "mlp-00009"]);
    // The digest names its row; a stem with digests is no longer matched by position.
    assert!(back.contains("renamed-00001", "00000000000000ff"));
    assert!(!back.contains("mlp-00003", "0000000000000001"));
    assert!(back.contains("cnn_early-00010", ""));
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
    let again = rewrite_profile(&out, &o, &[("note".into(), "second".into())], &RowSet::default());
    assert!(!again.contains("\n\n\n"), "blank lines pile up: {again}");
    let p = Profile::parse(&again, &path).unwrap();
    assert_eq!(p.calibration.get("note").and_then(|v| v.as_str()), Some("second"));
    assert!(calibrated_rows(&p.calibration).unwrap().is_empty());
    assert_eq!(p.provenance.unmeasured.len(), 1);
}

#[test]
fn the_shipped_profile_names_the_rows_it_was_calibrated_on() {
    // [calibration.rows] of the A100 profile are the seed-1 subsets of 150 rows that
    // `memest compare --limit 150 --seed 1` chose from the two calibration datasets.
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../profiles/a100-40gb.toml");
    let p = Profile::load(path.to_str().unwrap()).unwrap().0;
    let set = calibrated_rows(&p.calibration).unwrap();
    let ids: std::collections::BTreeSet<&str> = set.ids().collect();
    let mut want = std::collections::BTreeSet::new();
    let mut digests = RowSet::default();
    for f in ["mlp_data_step2.csv", "cnn_data_step1_early.csv"] {
        let rows = estimators::dataset::load(&crate::common::shared(&format!("gpumemnet/{f}")), &[]).unwrap().rows;
        for r in estimators::dataset::seeded_subset(&rows, 150, 1) {
            digests.insert(&r.id, &r.digest);
            want.insert(r.id);
        }
    }
    assert_eq!(ids, want.iter().map(String::as_str).collect());
    // [calibration.row_digests] are those rows' digests, so a renamed or reordered copy of a
    // calibration file is still recognised.
    let listed = |set: &RowSet| -> String {
        set.digests()
            .iter()
            .map(|(stem, d)| {
                format!("{stem:?} = [{}]", d.iter().map(|d| format!("{d:?}")).collect::<Vec<_>>().join(", "))
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_eq!(
        listed(&set),
        listed(&digests),
        "the profile's [calibration.row_digests] should read:\n{}",
        listed(&digests)
    );
}

#[test]
fn a_row_digest_is_its_content_by_column_whatever_the_order() {
    let check = |headers: &[&str], cells: &[&str], other: &[&str], other_cells: &[&str], same: bool| {
        let (a, b) = (
            digest(headers.iter().copied(), cells.iter().copied()),
            digest(other.iter().copied(), other_cells.iter().copied()),
        );
        assert_eq!(a == b, same, "{headers:?}={cells:?} against {other:?}={other_cells:?}");
        assert!(a.len() == 16 && a.bytes().all(|c| c.is_ascii_hexdigit()), "{a}");
    };
    check(&["A", "B"], &["1", "2"], &["B", "A"], &["2", "1"], true);
    check(&["A", "B"], &["1", "2"], &[" A", "B "], &["1 ", " 2"], true);
    check(&["A", "B"], &["1", "2"], &["A", "B"], &["1", "3"], false);
    check(&["A", "B"], &["12", ""], &["A", "B"], &["1", "2"], false);
    check(&["A"], &["1"], &["A", "B"], &["1", ""], false);
    // `profile` is derived by the writer (a profile added later fills it): not the row's content.
    check(&["A", "profile"], &["1", ""], &["A", "profile"], &["1", "h100"], true);
    // The value is fixed by its definition (FNV-1a 64): profiles store it.
    assert_eq!(digest(["a"], ["b"]), "e8bcb28230513dfd");
}

/// The written profile's header says what this fit was made on: the shipped profile's account of
/// its own calibration (mlp_data_step2.csv, 150 seeded rows) was kept beside other constants.
#[test]
fn the_rewritten_header_describes_this_fit() {
    let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../profiles/a100-40gb.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains("# - cublas_mib: fitted on mlp_data_step2.csv"));
    let o = OutsideAllocator { context_mib: 400.0, cublas_mib: 900.0, cudnn_mib: 300.0, ..Default::default() };
    let prov: Vec<(String, String)> = [
        ("fitted_by", "memest calibrate"),
        ("runs", "out/new/runs.jsonl"),
        ("data_licence", "MIT"),
        ("method", "weighted quantile 0.5 of truth - symbolic reserved; context+cublas from 40 MLP runs"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let out = rewrite_profile(&text, &o, &prov, &RowSet::default());
    Profile::parse(&out, &path).unwrap();
    let head: String = out.lines().take_while(|l| !l.starts_with('[')).collect::<Vec<_>>().join("\n");
    assert!(!head.contains("mlp_data_step2.csv") && !head.contains("150 seeded rows"), "{head}");
    let joined = head.replace("\n# ", " ");
    assert!(
        joined.contains(
            "fitted by memest calibrate on the runs of out/new/runs.jsonl (data licence MIT): weighted quantile 0.5"
        ),
        "{head}"
    );
    // What the header says of other things stays; a second rewrite replaces the account again.
    assert!(head.contains("# Held-out error is in [calibration]") && head.contains("# [provenance]:"), "{head}");
    let again = rewrite_profile(&out, &o, &prov, &RowSet::default());
    assert_eq!(again.matches("# The [outside_allocator] constants were fitted").count(), 1);
}

/// Measured peaks below the symbolic reserved peak, and runs loading neither library: the
/// fit says the clamp and the contradiction with counts, and no note claims what is not so.
#[test]
fn contradicting_and_library_less_runs_are_said() {
    let prior = OutsideAllocator { context_mib: 400.0, cublas_mib: 0.0, cudnn_mib: 0.0, ..Default::default() };
    let no_library = |mut r: CalRun| {
        r.uses_gemm = false;
        r.id = format!("plain-{}", r.id);
        r
    };
    // (MLP runs' outside, extra runs without a library, clamped, below reserved, notes said, notes not said)
    type Case = (f64, usize, bool, usize, &'static [&'static str], &'static [&'static str]);
    let cases: [Case; 4] = [
        (-40.0, 0, true, 20, &["clamped to 0", "20 of 20 training runs measured a peak below"], &["lowered to -"]),
        (200.0, 0, false, 0, &["context_mib lowered to it"], &["clamped", "below their symbolic"]),
        (1000.0, 0, false, 0, &["no run without GEMMs separates it"], &["neither cuBLAS"]),
        (
            1000.0,
            7,
            false,
            0,
            &[
                "the 7 runs without GEMMs are not used to separate it from cublas_mib",
                "7 of 27 training runs load neither cuBLAS nor cuDNN",
            ],
            &["no run without GEMMs"],
        ),
    ];
    for (outside, plain, clamped, below, said, unsaid) in cases {
        let mut train = runs(20, false, outside);
        train.extend(runs(plain, false, 5.0).into_iter().map(no_library));
        let f = fit(&prior, &train, &[], 0.5, 40e9).unwrap();
        let notes = f.notes.join("\n");
        assert_eq!((f.clamped, f.below_reserved, f.left_out_no_library), (clamped, below, plain), "{notes}");
        assert!(f.outside.context_mib >= 0.0 && f.outside.cublas_mib >= 0.0, "{:?}", f.outside);
        for s in said {
            assert!(notes.contains(s), "outside {outside}: {s:?} not in {notes}");
        }
        for s in unsaid {
            assert!(!notes.contains(s), "outside {outside}: {s:?} in {notes}");
        }
    }
    // Every training run without a library: the error says so, not that truths are missing.
    let train: Vec<CalRun> = runs(12, false, 1000.0).into_iter().map(no_library).collect();
    let e = fit(&prior, &train, &[], 0.5, 40e9).unwrap_err().to_string();
    assert!(e.contains("all 12 training runs load neither cuBLAS nor cuDNN"), "{e}");
    assert!(!e.contains("no training run has both"), "{e}");
}
