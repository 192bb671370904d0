//! Held-out honesty of the profile fits: `memest safety` leaves out the --profile's own
//! calibration rows (not only the runs marked `calibrated_on` when compared), says runs estimated
//! with another GPU's profile or other constants, and writes a method that says what it left out;
//! `memest calibrate` never holds out a run its prior constants were fitted on; both say what they
//! drop and refuse what cannot be fitted.

use std::path::{Path, PathBuf};

use crate::compare_trainer::calibrated_on;
use crate::support::memest;

const MIB: u64 = 1024 * 1024;

/// `n` MLP run records of rows `cal-00001`... (the point 1000 MiB, truth 0-9% above it), each
/// passed through `edit`.
fn runs(dir: &Path, n: usize, edit: impl Fn(usize, &mut serde_json::Value)) -> PathBuf {
    let mut out = String::new();
    for (i, line) in runs_jsonl(n).lines().enumerate() {
        let mut r: serde_json::Value = serde_json::from_str(line).unwrap();
        r["id"] = format!("cal-{:05}", i + 1).into();
        edit(i, &mut r);
        out += &(r.to_string() + "\n");
    }
    let p = dir.join("runs.jsonl");
    std::fs::write(&p, out).unwrap();
    p
}

#[test]
fn safety_leaves_out_the_profiles_own_calibration_rows() {
    let dir = tempfile::tempdir().unwrap();
    let a100 = crate::common::repo().join("profiles/a100-40gb.toml");
    let outside = simulator::profile::Profile::load(a100.to_str().unwrap()).unwrap().0.outside_allocator;
    // Runs compared with the A100 profile, none marked calibrated_on; the profile was calibrated
    // on the first 30.
    let runs = runs(dir.path(), 160, |_, r| {
        r["estimated_with"] =
            serde_json::json!({"profile": "a100-40gb", "gpu": "NVIDIA A100-SXM4-40GB", "outside_allocator": outside});
    });
    let rows: Vec<u64> = (1..=30).collect();
    let profile = calibrated_on(dir.path(), "cal", &rows);
    let (r, p) = (runs.to_str().unwrap(), profile.to_str().unwrap());
    let (ok, out, err) = memest(&["safety", r, "--profile", p, "--json"]);
    assert!(ok, "{err}");
    let fit: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(fit["skipped"]["calibrated_on"], 30, "{out}");
    assert_eq!(fit["families"]["mlp"]["margin"]["calibration_runs"].as_u64().unwrap(), 65, "{out}");
    assert!(!err.contains("estimated with"), "the runs are the profile's: {err}");
    // The written method says how many were left out, and by what.
    let written = dir.path().join("p.toml");
    let (ok, _, err) =
        memest(&["safety", r, "--profile", p, "--miss-rate", "0.05", "--write", written.to_str().unwrap()]);
    assert!(ok, "{err}");
    let method = simulator::profile::Profile::load(written.to_str().unwrap()).unwrap().0.safety.unwrap().method;
    assert!(method.contains("30 runs the [outside_allocator] constants were fitted on left out"), "{method}");
    // The same runs judged for the H200: estimated with another GPU's profile, said.
    let (ok, _, err) = memest(&["safety", r, "--profile", "h200", "--json"]);
    assert!(ok, "{err}");
    assert!(err.contains("160 of 160 runs were estimated with the profile of another GPU than h200's"), "{err}");
    assert!(err.contains("160 with a100-40gb (NVIDIA A100-SXM4-40GB)"), "{err}");
    // Runs of an older memest, whose points hold 500 MiB outside the allocator: other constants.
    let old = dir.path().join("old");
    std::fs::create_dir_all(&old).unwrap();
    let legacy = runs_dir(&old, 40);
    let (ok, _, err) = memest(&["safety", legacy.to_str().unwrap(), "--profile", p]);
    assert!(ok, "{err}");
    assert!(
        err.contains("40 of 40 runs were estimated with other [outside_allocator] constants than cal has now"),
        "{err}"
    );
    assert!(err.contains("40 of 40 runs do not record the profile they were estimated with"), "{err}");
}

/// With every run fitted on by the prior calibration, nothing can be held out whatever the
/// fraction: the warning blamed `--test-fraction`.
#[test]
fn calibrate_says_prior_fitted_runs_left_nothing_to_hold_out() {
    let dir = tempfile::tempdir().unwrap();
    let runs = runs(dir.path(), 20, |_, _| {});
    let rows: Vec<u64> = (1..=20).collect();
    let profile = calibrated_on(dir.path(), "cal", &rows);
    let out = dir.path().join("p.toml");
    let (r, p, o) = (runs.to_str().unwrap(), profile.to_str().unwrap(), out.to_str().unwrap());
    let (ok, _, err) = memest(&["calibrate", r, "--profile", p, "--write", o]);
    assert!(ok, "{err}");
    let says = format!("no run is held out (every one of the 20 runs was fitted on by {p}'s earlier calibration");
    assert!(err.contains(&says) && !err.contains("(--test-fraction"), "{err}");
}

/// [`runs`] as `runs_jsonl` writes them (no profile recorded).
fn runs_dir(dir: &Path, n: usize) -> PathBuf {
    runs(dir, n, |_, _| {})
}

#[test]
fn calibrate_holds_out_no_run_its_prior_was_fitted_on() {
    let dir = tempfile::tempdir().unwrap();
    // 120 runs; the profile's earlier calibration was fitted on the first 60 (by position), and
    // the 61st was marked calibrated_on when compared.
    let runs = runs(dir.path(), 120, |i, r| r["calibrated_on"] = (i == 60).into());
    let rows: Vec<u64> = (1..=60).collect();
    let profile = calibrated_on(dir.path(), "cal", &rows);
    let (ok, out, err) =
        memest(&["calibrate", runs.to_str().unwrap(), "--profile", profile.to_str().unwrap(), "--json"]);
    assert!(ok, "{err}");
    assert!(
        err.contains("61 of the runs were fitted on by") && err.contains("kept out of the held-out split"),
        "{err}"
    );
    let fit: serde_json::Value = serde_json::from_str(&out).unwrap();
    // 30% of the 59 others are held out; all 120 runs were held out at 30% (36).
    assert_eq!(fit["test"], 18, "{out}");
    assert_eq!(fit["train_mlp"], 102, "{out}");
}

/// `memest compare` run records of `n` MLP runs whose truth is the point plus 0-10%.
pub(crate) fn runs_jsonl(n: usize) -> String {
    let mut out = String::new();
    for i in 0..n {
        let mut estimates = std::collections::BTreeMap::new();
        let point = 1000 * MIB;
        estimates.insert(
            "symbolic".to_string(),
            estimators::compare::Outcome {
                device_bytes: Some(point),
                reserved_bytes: Some(point - 500 * MIB),
                ..Default::default()
            },
        );
        let r = estimators::compare::RunRecord {
            id: format!("mlp_data_step1.csv:{i}"),
            digest: String::new(),
            filename: String::new(),
            spec: String::new(),
            family: "MLP".into(),
            batch: 1,
            optimizer: None,
            amp: None,
            truth_bytes: Some(point as f64 * (1.0 + (i % 10) as f64 / 100.0)),
            real_oom: false,
            reserved_truth_bytes: None,
            uses_gemm: true,
            uses_conv: false,
            estimates,
            calibrated_on: false,
            estimated_with: None,
        };
        out += &serde_json::to_string(&r).unwrap();
        out.push('\n');
    }
    out
}

/// The profile fits say what they drop or ignore, and refuse what cannot be fitted: runs read
/// twice were counted twice (in the fit and its held-out share), a refit dropped every other
/// family's margin silently, and a held-out share leaving nothing wrote an empty table.
#[test]
fn profile_fits_say_what_they_drop_and_refuse_what_cannot_be_fitted() {
    let dir = tempfile::tempdir().unwrap();
    let runs = dir.path().join("runs.jsonl");
    std::fs::write(&runs, runs_jsonl(40)).unwrap();
    let r = runs.to_str().unwrap();
    let out = dir.path().join("p.toml");
    let o = out.to_str().unwrap();
    let (ok, _, err) = memest(&["safety", r, r]);
    assert!(ok, "{err}");
    assert!(err.contains("40 of 80 run records repeat one already read"), "{err}");
    // Distinct runs under one id (two datasets named alike) are kept, and said.
    let other = dir.path().join("other.jsonl");
    std::fs::write(&other, runs_jsonl(3).replace("\"batch\":1", "\"batch\":2")).unwrap();
    let (ok, _, err) = memest(&["safety", r, other.to_str().unwrap()]);
    assert!(ok && err.contains("3 run ids belong to different runs"), "{err}");
    // 20 calibration runs are too few for a 2% guarantee (49 needed): not written, as though
    // it held.
    let (ok, _, err) = memest(&["safety", r, "--write", o]);
    assert!(!ok && !out.exists(), "{err}");
    assert!(err.contains("the margins of mlp rest on too few calibration runs for the --miss-rate 0.02"), "{err}");
    let many = dir.path().join("many.jsonl");
    std::fs::write(&many, runs_jsonl(120)).unwrap();
    let (ok, _, err) = memest(&["safety", many.to_str().unwrap(), "--write", o]);
    assert!(ok && out.is_file(), "{err}");
    assert!(err.contains("its margins for cnn are not refitted by these runs and are dropped"), "{err}");
    std::fs::remove_file(&out).unwrap();
    for (args, says) in [
        (vec!["safety", r, "--held-out", "0.99", "--write", o], "no family has enough calibration runs"),
        (vec!["safety", r, "--regime", "banana"], "--regime \"banana\": expected the runs' precision first"),
        (vec!["calibrate", r, "--quantile", "2"], "--quantile 2: expected a fraction in [0, 1]"),
        (vec!["calibrate", r, "--quantile", "NaN"], "--quantile NaN: expected a fraction in [0, 1]"),
    ] {
        let (ok, _, err) = memest(&args);
        assert!(!ok && err.contains(says), "{args:?}: {err}");
        assert!(!out.exists(), "{args:?}: nothing written");
    }
    let (ok, _, err) = memest(&["calibrate", r, "--data-licence", "MIT"]);
    assert!(ok && err.contains("--data-licence \"MIT\" has no effect without --write"), "{err}");
    // A fit of a handful of runs was written as the GPU's constants, the profile's record of its
    // earlier fit replaced; and one with nothing held out, in silence.
    let few = dir.path().join("few.jsonl");
    std::fs::write(&few, runs_jsonl(5)).unwrap();
    let (ok, _, err) = memest(&["calibrate", few.to_str().unwrap(), "--write", o]);
    assert!(!ok && !out.exists(), "{err}");
    assert!(err.contains("context_mib and cublas_mib (MLP runs) would rest on 3 runs; at least 10"), "{err}");
    let (ok, _, err) = memest(&["calibrate", r, "--test-fraction", "0", "--write", o]);
    assert!(ok && err.contains("no run is held out (--test-fraction 0 of the 40 runs"), "{err}");
    std::fs::remove_file(&out).unwrap();
    let (ok, _, err) = memest(&["calibrate", r, "--write", o]);
    assert!(ok, "{err}");
    assert!(err.contains("[safety] margins are kept as they are, but they were fitted against"), "{err}");
    // MLP runs alone refit context and cuBLAS; cuDNN's constant stays, and so do the rows it was
    // fitted on, or `compare` would count them as held out.
    assert!(err.contains("earlier [calibration.rows] are kept: the cudnn_mib"), "{err}");
    let rows_of = |path: &std::path::Path| {
        let text = std::fs::read_to_string(path).unwrap();
        let p = simulator::profile::Profile::parse(&text, path).unwrap();
        estimators::calibrate::calibrated_rows(&p.calibration).unwrap()
    };
    let before = rows_of(&crate::common::repo().join("profiles/a100-40gb.toml"));
    assert!(!before.is_empty());
    assert_eq!(rows_of(&out), before);
    // A negative measured peak is refused where it is, not dropped in silence.
    let bad = runs_jsonl(2).replacen("\"truth_bytes\":", "\"truth_bytes\":-", 1);
    std::fs::write(&runs, bad).unwrap();
    let (ok, _, err) = memest(&["calibrate", r]);
    assert!(!ok && err.contains("runs.jsonl:1: field truth_bytes is -"), "{err}");
    // A peak past any device (1e30 B gave a margin of 6.5e22%) is refused by safety and calibrate.
    for (field, cmd) in [("truth_bytes", "calibrate"), ("reserved_truth_bytes", "safety")] {
        let mut lines: Vec<serde_json::Value> =
            runs_jsonl(2).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        lines[1][field] = 1e30.into();
        std::fs::write(&runs, lines.iter().map(|l| l.to_string() + "\n").collect::<String>()).unwrap();
        let (ok, _, err) = memest(&[cmd, r]);
        assert!(
            !ok && err.contains(&format!("runs.jsonl:2: field {field} is 1e30")) && err.contains("256 TiB"),
            "{err}"
        );
    }
}

/// `memest calibrate` says runs estimated with another GPU's profile with the one check `memest
/// safety` makes (it wrote the A100's constants from H200 runs in silence).
#[test]
fn calibrate_says_runs_of_another_gpu() {
    let dir = tempfile::tempdir().unwrap();
    let a100 = crate::common::repo().join("profiles/a100-40gb.toml");
    let outside = simulator::profile::Profile::load(a100.to_str().unwrap()).unwrap().0.outside_allocator;
    let check = |gpu: &str, warned: bool| {
        let runs = runs(dir.path(), 40, |_, r| {
            r["estimated_with"] = serde_json::json!({"profile": "x", "gpu": gpu, "outside_allocator": outside});
        });
        let out = dir.path().join("p.toml");
        let (ok, _, err) = memest(&["calibrate", runs.to_str().unwrap(), "--write", out.to_str().unwrap()]);
        assert!(ok, "{err}");
        let said = err.contains("40 of 40 runs were estimated with the profile of another GPU than a100-40gb's")
            && err.contains("a constant fitted on them is not a100-40gb's");
        assert_eq!(said, warned, "{gpu}: {err}");
    };
    check("NVIDIA H200", true);
    check("NVIDIA A100-SXM4-40GB", false);
}

/// The margin's regime is what the runs record (compare --optimizer sgd was labelled "fp32
/// adam"); runs that record none are assumed fp32 Adam, and said to be; a --regime the runs
/// contradict is said.
#[test]
fn safety_labels_the_margin_with_the_runs_regime() {
    let dir = tempfile::tempdir().unwrap();
    let check = |optimizer: Option<&str>, flag: &[&str], regime: &str, said: &str| {
        let runs = runs(dir.path(), 160, |_, r| {
            if let Some(o) = optimizer {
                r["optimizer"] = o.into();
                r["amp"] = "fp32".into();
            }
        });
        let mut args = vec!["safety", runs.to_str().unwrap(), "--json"];
        args.extend_from_slice(flag);
        let (ok, out, err) = memest(&args);
        assert!(ok, "{err}");
        let fit: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(fit["families"]["mlp"]["margin"]["regime"], regime, "{optimizer:?} {flag:?}");
        assert!(err.contains(said), "{optimizer:?} {flag:?}: {err}");
    };
    check(Some("sgd"), &[], "fp32 sgd", "");
    check(None, &[], "fp32 adam", "160 of 160 runs do not record their optimizer and precision");
    check(Some("sgd"), &["--regime", "fp32 adam"], "fp32 adam", "160 of 160 runs record another regime (160 fp32 sgd)");
}

/// What the fits and compare said wrongly or not at all: a negative number reached clap as an
/// unknown flag, a --test-fraction that leaves no training run blamed the runs, a JSON file given
/// as a dataset was said to lack a column, and `memest -h` left out `render`.
#[test]
fn wording_says_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let runs = runs(dir.path(), 30, |_, _| {});
    let r = runs.to_str().unwrap();
    let check = |args: &[&str], says: &str| {
        let (code, out, err) = crate::support::memest_code(args);
        assert!(err.contains(says) || out.contains(says), "{args:?}: {code} {out} {err}");
        code
    };
    assert_eq!(check(&["calibrate", r, "--quantile", "-0.1"], "--quantile -0.1: expected a fraction in [0, 1]"), 2);
    assert_eq!(check(&["safety", r, "--miss-rate", "-0.5"], "--miss-rate -0.5: expected a fraction in (0, 1)"), 2);
    assert_eq!(check(&["calibrate", r, "--test-fraction", "0.999"], "--test-fraction 0.999 holds out 30 of the 30"), 2);
    let json = dir.path().join("some.json");
    std::fs::write(&json, "{\"a\": 1}\n").unwrap();
    let out = dir.path().join("out");
    let args = ["compare", "--dataset", json.to_str().unwrap(), "--out", out.to_str().unwrap()];
    assert_eq!(check(&args, "some.json: row 0: column \"<header>\": expected a GPUMemNet CSV"), 2);
    check(&["-h"], "estimate, render, compare");
}

/// Measured peaks below the symbolic reserved peak fit a negative constant: it was clamped to 0
/// and written while the note said "lowered to -1812 MiB"; now said, warned, and not written.
#[test]
fn calibrate_refuses_to_write_constants_the_runs_contradict() {
    let dir = tempfile::tempdir().unwrap();
    // The truth 0-9% above 300 MiB, the reserved peak 500 MiB: every run below its reserved peak.
    let runs = runs(dir.path(), 40, |i, r| r["truth_bytes"] = (300.0 * MIB as f64 * (1.0 + i as f64 / 100.0)).into());
    let out = dir.path().join("out.toml");
    let (r, o) = (runs.to_str().unwrap(), out.to_str().unwrap());
    let (code, stdout, err) = crate::support::memest_code(&["calibrate", r]);
    assert_eq!(code, 0, "{err}");
    assert!(stdout.contains("clamped to 0") && !stdout.contains("lowered to -"), "{stdout}");
    assert!(err.contains("memest: warning: 28 of 28 training runs measured a peak below"), "{err}");
    let (code, _, err) = crate::support::memest_code(&["calibrate", r, "--write", o]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("clamped to 0") && !out.exists(), "{err}");
}

/// `memest safety`'s text said a skip by its Rust name (`NoTruth`) where its JSON says
/// `no_truth`, and printed a family's control characters raw; a family `compare` never writes
/// is now refused where the runs are read, escaped.
#[test]
fn safety_text_says_the_json_words_and_escapes_families() {
    let dir = tempfile::tempdir().unwrap();
    let file = runs(dir.path(), 60, |i, r| {
        if i < 5 {
            r["truth_bytes"] = serde_json::Value::Null;
        }
    });
    let r = file.to_str().unwrap();
    let (ok, text, err) = memest(&["safety", r]);
    assert!(ok, "{err}");
    let (ok, json, err) = memest(&["safety", r, "--json"]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["skipped"]["no_truth"], 5, "{json}");
    assert!(text.contains("skipped 5 records: no_truth") && !text.contains("NoTruth"), "{text}");
    let other = tempfile::tempdir().unwrap();
    let odd = runs(other.path(), 60, |i, r| {
        if i % 2 == 0 {
            r["family"] = "ml\u{1b}[31mp".into();
        }
    });
    let (code, _, err) = crate::support::memest_code(&["safety", odd.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("field family is") && !err.contains('\u{1b}'), "{err:?}");
}

/// `memest safety` on runs with nothing to fit named no file; calibrate's error did.
#[test]
fn nothing_to_fit_names_the_runs_file() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.jsonl");
    std::fs::write(&empty, "").unwrap();
    for cmd in ["safety", "calibrate"] {
        let (code, _, err) = crate::support::memest_code(&[cmd, empty.to_str().unwrap()]);
        assert!(code == 2 && err.contains("empty.jsonl: calibration:"), "{cmd}: {code} {err}");
    }
}
