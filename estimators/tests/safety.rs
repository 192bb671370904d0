//! The safe number: the conformal quantile, the per-family fit on held-out runs, the profile
//! table, and which margin a trace gets.

use std::collections::BTreeMap;
use std::path::Path;

use estimators::compare::{Outcome, RunRecord};
use estimators::rows::RowSet;
use estimators::safety::{conformal_quantile, fit, rewrite_safety, table, SafetyRun, Skip};
use simulator::family::Family;
use simulator::fit::margin;
use simulator::profile::Profile;
use trace::{Header, Level};

fn record(id: &str, family: &str, truth: f64, point: u64) -> RunRecord {
    record_r(id, family, truth, point, point)
}

fn record_r(id: &str, family: &str, truth: f64, point: u64, reserved: u64) -> RunRecord {
    let mut estimates = BTreeMap::new();
    estimates.insert(
        "symbolic".to_string(),
        Outcome { device_bytes: Some(point), reserved_bytes: Some(reserved), ..Outcome::default() },
    );
    RunRecord {
        id: id.into(),
        digest: String::new(),
        filename: String::new(),
        spec: String::new(),
        family: family.into(),
        batch: 1,
        optimizer: None,
        amp: None,
        truth_bytes: Some(truth),
        real_oom: false,
        reserved_truth_bytes: None,
        uses_gemm: true,
        uses_conv: family == "CNN",
        estimates,
        calibrated_on: false,
        estimated_with: None,
    }
}

#[test]
fn conformal_rank_is_the_finite_sample_one() {
    // n = 99, alpha = 0.02: rank ceil(100 * 0.98) = 98.
    let scores: Vec<f64> = (1..=99).map(|i| i as f64 / 100.0).collect();
    assert_eq!(conformal_quantile(&scores, 0.02), Some((0.98, true)));
    // n = 10 is too few for 2%: the largest score, and the guarantee is flagged as not exact.
    let few: Vec<f64> = (1..=10).map(f64::from).collect();
    assert_eq!(conformal_quantile(&few, 0.02), Some((10.0, false)));
    assert_eq!(conformal_quantile(&[], 0.02), None);
}

#[test]
fn fit_per_family_on_one_split_measured_on_the_other() {
    // MLP runs: truth = point x (1 + i/1000) for i in 0..1000, so scores are i/1000.
    let mut recs: Vec<RunRecord> =
        (0..1000).map(|i| record(&format!("m-{i:05}"), "MLP", 1000.0 * (1.0 + i as f64 / 1000.0), 1000)).collect();
    // CNN runs are all 10% over the point.
    recs.extend((0..200).map(|i| record(&format!("c-{i:05}"), "CNN", 1100.0, 1000)));
    // Skipped: a row the outside constants were fitted on, an OOM row, a row without an estimate.
    let mut cal = record("m-cal", "MLP", 5000.0, 1000);
    cal.calibrated_on = true;
    let mut oom = record("m-oom", "MLP", 5000.0, 1000);
    oom.real_oom = true;
    let mut none = record("m-none", "MLP", 5000.0, 1000);
    none.estimates.clear();
    recs.extend([cal, oom, none]);
    let f = fit(&recs, &RowSet::default(), 0.02, 0.5, 1, "fp32 adam").unwrap();
    assert_eq!(f.skipped[&Skip::CalibratedOn], 1);
    assert_eq!(f.skipped[&Skip::NoTruth], 1);
    assert_eq!(f.skipped[&Skip::NoEstimate], 1);
    let mlp = &f.families["mlp"].margin;
    assert_eq!(mlp.calibration_runs + mlp.held_out_runs, 1000);
    assert_eq!(mlp.held_out_runs, 500);
    // About the 98th percentile of U(0, 1): within sampling noise of 0.98.
    assert!((mlp.margin - 0.98).abs() < 0.02, "{mlp:?}");
    assert!(mlp.held_out_miss_rate <= 0.04, "{mlp:?}");
    let cnn = &f.families["cnn"].margin;
    assert!((cnn.margin - 0.1).abs() < 1e-12 && cnn.held_out_miss_rate == 0.0, "{cnn:?}");
    assert!((cnn.held_out_point_mre - 0.1 / 1.1).abs() < 1e-12);
    assert_eq!(SafetyRun::from_record(&recs[0], &RowSet::default()).unwrap().family, "mlp");
    // Equal scales give equal margins: the point scale is kept.
    assert_eq!(mlp.scale, "point");
}

#[test]
fn the_scale_with_less_over_reservation_on_the_calibration_split_is_kept() {
    // The truth misses the point by 10% of the reserved part, which varies from 1% to 100% of the
    // point: a margin on the reserved peak is exact, one on the point over-reserves most runs.
    let recs: Vec<RunRecord> = (0..600)
        .map(|i| {
            let reserved = 10 + (i % 100) * 10;
            record_r(&format!("c-{i:05}"), "CNN", 1000.0 + 0.1 * reserved as f64, 1000, reserved)
        })
        .collect();
    let f = fit(&recs, &RowSet::default(), 0.02, 0.5, 3, "fp32 adam").unwrap();
    let cnn = &f.families["cnn"];
    assert_eq!(cnn.margin.scale, "reserved");
    assert!((cnn.margin.margin - 0.1).abs() < 1e-9, "{cnn:?}");
    assert_eq!(cnn.margin.held_out_miss_rate, 0.0);
    assert!(cnn.calibration_median_over["point"] > cnn.calibration_median_over["reserved"]);
}

fn a100() -> (Profile, String) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../profiles/a100-40gb.toml");
    (Profile::load(path.to_str().unwrap()).unwrap().0, std::fs::read_to_string(&path).unwrap())
}

#[test]
fn the_table_round_trips_through_the_profile_and_picks_margins() {
    let recs: Vec<RunRecord> = (0..400)
        .map(|i| record(&format!("m-{i:05}"), if i % 2 == 0 { "MLP" } else { "CNN" }, 1050.0 + i as f64, 1000))
        .collect();
    let f = fit(&recs, &RowSet::default(), 0.02, 0.5, 1, "fp32 adam").unwrap();
    let (_, text) = a100();
    let new = rewrite_safety(&text, &table(&f, 0.02, "runs.jsonl", "test", "none")).unwrap();
    let p = Profile::parse(&new, Path::new("p.toml")).unwrap();
    let sf = p.safety.as_ref().unwrap();
    assert_eq!(sf.families["mlp"], f.families["mlp"].margin);
    // Rewriting again replaces the table, and keeps everything else.
    let again = rewrite_safety(&new, &table(&f, 0.05, "x", "y", "z")).unwrap();
    let p2 = Profile::parse(&again, Path::new("p.toml")).unwrap();
    assert_eq!(p2.safety.as_ref().unwrap().miss_rate, 0.05);
    assert_eq!(p2.calibration, p.calibration);
    assert_eq!(again.matches("[safety]").count(), 1);
    // Rewrites do not pile up blank lines where the dropped tables were.
    let third = rewrite_safety(&again, &table(&f, 0.05, "x", "y", "z")).unwrap();
    assert_eq!(third, again);
    assert!(!again.contains("\n\n\n"), "{again}");

    let header = |meta: &[(&str, &str)]| {
        let mut h = Header::new("memtrace_trainer", "0", Level::Allocator);
        for (k, v) in meta {
            h.metadata.insert(k.to_string(), v.to_string());
        }
        h
    };
    // The family is the one rule's, of the layer types the tracer lists.
    let of = |p: &Profile, meta: &[(&str, &str)]| {
        let h = header(meta);
        margin(p, &h, Family::of_header(&h))
    };
    let cnn =
        of(&p, &[("clock", "logical"), ("layer_types", "Conv2d,Linear,ReLU"), ("amp", "fp32"), ("optimizer", "adam")]);
    assert_eq!((cnn.fraction, cnn.coverage_measured), (sf.families["cnn"].margin, true));
    let base = if cnn.scale == "reserved" { 400.0 } else { 1000.0 };
    assert_eq!(cnn.safe(1000, 400), 1000 + (base * cnn.fraction).ceil() as u64);
    // A trace written before the tracer listed layer types: its recorded family is read.
    assert_eq!(of(&p, &[("clock", "logical"), ("family", "cnn"), ("amp", "fp32"), ("optimizer", "adam")]), cnn);
    // A Transformer borrows the MLP margin, and says its coverage is unmeasured.
    let trf = of(&p, &[("clock", "logical"), ("layer_types", "Conv2d,Linear,MultiheadAttention")]);
    assert_eq!(trf.calibrated_family.as_deref(), Some("mlp"));
    assert!(trf.regime.starts_with("transformer "), "{trf:?}");
    assert!(!trf.coverage_measured && trf.note.contains("coverage unmeasured for this regime"), "{trf:?}");
    // Another optimizer, checkpointing or a strategy than the calibration runs had is unmeasured
    // (the margin still applies).
    let cnn_meta = [("clock", "logical"), ("layer_types", "Conv2d"), ("amp", "fp32"), ("optimizer", "adam")];
    let with = |extra: (&str, &str)| of(&p, &[&cnn_meta[..], &[extra]].concat());
    assert!(with(("checkpointing", "none")).coverage_measured);
    let unknown = of(&p, &cnn_meta[..3]);
    assert!(!unknown.coverage_measured, "no optimizer recorded: {unknown:?}");
    for extra in [("optimizer", "sgd"), ("checkpointing", "full"), ("strategy", "ddp")] {
        let m = with(extra);
        assert!(!m.coverage_measured && m.fraction == sf.families["cnn"].margin, "{extra:?}: {m:?}");
        assert!(m.note.contains("coverage unmeasured") && m.regime.contains(extra.1), "{extra:?}: {m:?}");
    }
    // A margin fitted over mixed regimes measures none of them, not the first it names.
    let mut mixed = p.clone();
    mixed.safety.as_mut().unwrap().families.get_mut("cnn").unwrap().regime = "fp32 adam / bf16 adam".into();
    assert!(!of(&mixed, &cnn_meta).coverage_measured, "a mixed regime is no measurement");
    // bf16 is another regime, even for a calibrated family.
    let bf16 = of(&p, &[("clock", "logical"), ("layer_types", "Conv2d"), ("amp", "bf16")]);
    assert!(!bf16.coverage_measured && bf16.fraction == sf.families["cnn"].margin);
    // A trace of a real run (no logical clock; the shim's) gets no margin.
    let real = margin(&p, &Header::new("libmemtrace", "0", Level::Device), None);
    assert_eq!(real.fraction, 0.0);
    assert!(real.note.contains("real run"));
    // A profile without [safety]: no margin, and it says so.
    let mut bare = p.clone();
    bare.safety = None;
    let m = of(&bare, &[("clock", "logical"), ("layer_types", "Linear,ReLU")]);
    assert!(m.fraction == 0.0 && !m.coverage_measured && m.note.contains("no [safety]"));
}

/// The rows a profile's constants were fitted on are left out by the profile's own
/// `[calibration.rows]` (by digest, or by position where it records none), not only by the
/// `calibrated_on` mark a comparison with some profile left in the runs.
#[test]
fn the_profiles_own_calibration_rows_are_left_out() {
    let mut recs: Vec<RunRecord> =
        (0..200).map(|i| record(&format!("m-{:05}", i + 1), "MLP", 1000.0 * (1.0 + i as f64 / 1000.0), 1000)).collect();
    recs[150].digest = "00000000000000aa".into();
    let mut calibrated = RowSet::default();
    for i in 1..=40 {
        calibrated.insert(&format!("m-{i:05}"), "");
    }
    calibrated.insert_digests("other", ["00000000000000aa"]);
    let f = fit(&recs, &calibrated, 0.02, 0.5, 1, "fp32 adam").unwrap();
    assert_eq!(f.skipped[&Skip::CalibratedOn], 41);
    let mlp = &f.families["mlp"].margin;
    assert_eq!(mlp.calibration_runs + mlp.held_out_runs, 159);
}

/// Runs estimated with another GPU's profile, or with other outside-allocator constants than
/// the profile has now, are said; runs of an older memest are judged by what their point holds
/// outside the allocator.
#[test]
fn runs_estimated_otherwise_are_said() {
    use estimators::compare::EstimatedWith;
    use estimators::safety::estimated_otherwise;
    let (a100, _) = a100();
    let with = |gpu: &str, cublas: f64| EstimatedWith {
        profile: "x".into(),
        gpu: gpu.into(),
        outside_allocator: simulator::profile::OutsideAllocator {
            cublas_mib: cublas,
            ..a100.outside_allocator.clone()
        },
        unknown_constants: BTreeMap::new(),
        ranks: Some(1),
    };
    let mut same = record("m-1", "MLP", 2000.0, 1000);
    same.estimated_with = Some(with("NVIDIA A100-SXM4-40GB", a100.outside_allocator.cublas_mib));
    assert!(estimated_otherwise(&[same.clone()], &a100, "a100-40gb").is_empty());
    let mut h200 = same.clone();
    h200.estimated_with = Some(with("NVIDIA H200", a100.outside_allocator.cublas_mib));
    let mut refit = same.clone();
    refit.estimated_with = Some(with("NVIDIA A100-SXM4-40GB", 5.0));
    let said = estimated_otherwise(&[same.clone(), h200, refit], &a100, "a100-40gb");
    assert_eq!(said.len(), 2, "{said:?}");
    assert!(
        said[0].starts_with("1 of 3 runs were estimated with the profile of another GPU than a100-40gb's"),
        "{said:?}"
    );
    assert!(said[1].starts_with("1 of 3 runs were estimated with other [outside_allocator] constants"), "{said:?}");
    // Older runs: the point holds exactly the profile's 1429 MiB for an MLP, or not.
    let mib = 1024 * 1024;
    let held = |outside: u64| {
        let mut r = record_r("m-2", "MLP", 2000.0, 2000 * mib, (2000 - outside) * mib);
        r.uses_conv = false;
        r
    };
    let said = estimated_otherwise(&[held(1429)], &a100, "a100-40gb");
    assert_eq!(said.len(), 1, "{said:?}");
    assert!(said[0].contains("do not record the profile"), "{said:?}");
    let said = estimated_otherwise(&[held(1429), held(500)], &a100, "a100-40gb");
    assert!(said[0].starts_with("1 of 2 runs were estimated with other [outside_allocator] constants"), "{said:?}");
}

/// Constants are compared by the terms a run's point adds, for its own libraries and ranks: a
/// cuDNN or NCCL constant an MLP run on one GPU never loads was warned of as "other constants".
#[test]
fn only_the_constants_a_run_loads_are_compared() {
    use estimators::compare::EstimatedWith;
    use estimators::safety::estimated_otherwise;
    let (a100, _) = a100();
    let with = |edit: &dyn Fn(&mut simulator::profile::OutsideAllocator), ranks: Option<u32>| {
        let mut outside_allocator = a100.outside_allocator.clone();
        edit(&mut outside_allocator);
        Some(EstimatedWith {
            profile: "a100-40gb".into(),
            gpu: a100.gpu.name.clone(),
            outside_allocator,
            unknown_constants: BTreeMap::new(),
            ranks,
        })
    };
    let other_cudnn = |o: &mut simulator::profile::OutsideAllocator| o.cudnn_mib += 100.0;
    let other_nccl = |o: &mut simulator::profile::OutsideAllocator| o.nccl_per_peer_mib += 8.0;
    let run = |family: &str, edit: &dyn Fn(&mut simulator::profile::OutsideAllocator), ranks| {
        let mut r = record("r", family, 2000.0, 1000);
        r.uses_conv = family == "CNN";
        r.estimated_with = with(edit, ranks);
        r
    };
    // An MLP run loads no cuDNN, and one rank no NCCL: their points are the profile's.
    let said = estimated_otherwise(&[run("MLP", &other_cudnn, Some(1)), run("MLP", &other_nccl, Some(1))], &a100, "a");
    assert!(said.is_empty(), "{said:?}");
    // A CNN run adds cuDNN's term, and a run of 4 ranks NCCL's.
    let said = estimated_otherwise(&[run("CNN", &other_cudnn, Some(1)), run("MLP", &other_nccl, Some(4))], &a100, "a");
    assert_eq!(said.len(), 1, "{said:?}");
    assert!(said[0].starts_with("2 of 2 runs were estimated with other [outside_allocator] constants"), "{said:?}");
    // A run that does not record its ranks is judged as one process, and that is said where the
    // NCCL constants differ.
    let said = estimated_otherwise(&[run("MLP", &other_nccl, None)], &a100, "a");
    assert_eq!(said.len(), 1, "{said:?}");
    assert!(
        said[0].starts_with("1 of 1 runs do not record their ranks and were estimated with other NCCL"),
        "{said:?}"
    );
}

/// A run of an older memest is judged by what its point holds outside the allocator only where
/// that can tell: a point holding more than one process's terms for its libraries (memory the
/// trace held there, a memory fraction, more ranks) was counted as other constants.
#[test]
fn an_older_run_holding_more_outside_is_said_not_checked() {
    use estimators::safety::estimated_otherwise;
    let (a100, _) = a100();
    let mib = 1024 * 1024;
    let mut r = record_r("m-3", "MLP", 4000.0, 3000 * mib, (3000 - 1429 - 300) * mib);
    r.uses_conv = false;
    let said = estimated_otherwise(&[r], &a100, "a100-40gb");
    assert_eq!(said.len(), 2, "{said:?}");
    assert!(
        said[0].starts_with("1 of 1 runs of an older memest hold more outside the allocator than a100-40gb's")
            && said[0].contains("(up to 300.0 MiB more)")
            && said[0].contains("not checked"),
        "{said:?}"
    );
    assert!(!said.iter().any(|w| w.contains("were estimated with other")), "{said:?}");
}

/// The profile a run records is read tolerantly: a constant a newer memest records (unknown
/// here) made `runs.jsonl` unreadable, as one fewer would for an older memest. The unknown one
/// is kept, written back, and said where it is not 0.
#[test]
fn a_recorded_profile_with_constants_of_another_memest_is_read() {
    use estimators::compare::read_runs;
    use estimators::safety::estimated_otherwise;
    let (a100, _) = a100();
    let mut line = serde_json::to_value(record("m-4", "MLP", 2000.0, 1000)).unwrap();
    let o = &a100.outside_allocator;
    line["estimated_with"] = serde_json::json!({"profile": "a100-40gb", "gpu": a100.gpu.name,
        "outside_allocator": {"context_mib": o.context_mib, "cublas_mib": o.cublas_mib, "cudnn_mib": o.cudnn_mib,
            "nccl_communicator_mib": o.nccl_communicator_mib, "nccl_per_peer_mib": o.nccl_per_peer_mib,
            "future_mib": 12.5, "unused_mib": 0.0}});
    let mut older = line.clone();
    older["estimated_with"]["outside_allocator"] = serde_json::json!({"context_mib": o.context_mib, "cublas_mib": o.cublas_mib,
            "nccl_communicator_mib": o.nccl_communicator_mib, "nccl_per_peer_mib": o.nccl_per_peer_mib});
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runs.jsonl");
    std::fs::write(&path, format!("{line}\n{older}\n")).unwrap();
    let runs = read_runs(&[path]).unwrap();
    let newer = runs[0].estimated_with.as_ref().unwrap();
    assert_eq!(newer.outside_allocator, *o);
    assert_eq!(newer.unknown_constants["future_mib"], 12.5);
    let back = serde_json::to_value(&runs[0]).unwrap();
    assert_eq!(back["estimated_with"]["outside_allocator"]["future_mib"], 12.5, "{back}");
    let said = estimated_otherwise(&runs[..1], &a100, "a100-40gb");
    assert_eq!(said.len(), 1, "{said:?}");
    assert!(said[0]
        .starts_with("1 of 1 runs record [outside_allocator] constants this memest does not know (future_mib in 1;"));
    // The older record has no cuDNN constant (read as 0), which its MLP run does not load.
    assert!(estimated_otherwise(&runs[1..], &a100, "a100-40gb").is_empty());
}

/// The symbolic estimate's bytes are checked where runs.jsonl is read: a zero point gave an
/// infinite margin (null in JSON, inf in text) and u64::MAX wrote a nonsense profile.
#[test]
fn symbolic_estimate_bytes_are_checked_when_read() {
    use estimators::compare::read_runs;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runs.jsonl");
    let good = serde_json::to_value(record_r("m-1", "MLP", 2000.0, 1000, 600)).unwrap();
    // (field, value, the error's words; None: read)
    let cases: [(&str, serde_json::Value, Option<&str>); 7] = [
        ("device_bytes", 0.into(), Some("runs.jsonl:2: field estimates.symbolic.device_bytes is 0: expected")),
        ("device_bytes", u64::MAX.into(), Some("field estimates.symbolic.device_bytes is 18446744073709551615")),
        ("reserved_bytes", u64::MAX.into(), Some("field estimates.symbolic.reserved_bytes is 18446744073709551615")),
        ("device_bytes", (257u64 << 40).into(), Some("at most 256 TiB")),
        ("reserved_bytes", 0.into(), None),
        ("device_bytes", 1.into(), None),
        ("device_bytes", serde_json::Value::Null, None),
    ];
    for (field, value, want) in cases {
        let mut bad = good.clone();
        bad["estimates"]["symbolic"][field] = value.clone();
        std::fs::write(&path, format!("{good}\n{bad}\n")).unwrap();
        match (read_runs(std::slice::from_ref(&path)), want) {
            (Ok(runs), None) => assert_eq!(runs.len(), 2),
            (Err(e), Some(w)) => assert!(e.to_string().contains(w), "{field} = {value}: {e}"),
            (got, _) => panic!("{field} = {value}: got {:?}, expected {want:?}", got.map(|r| r.len())),
        }
    }
    // `compare`'s own row for a need no device holds: no device peak, an error, and the
    // reserved peak beside it past any device. Not scored, so read (one such row refused the
    // whole file).
    let mut unbounded = good.clone();
    unbounded["estimates"]["symbolic"]["device_bytes"] = serde_json::Value::Null;
    unbounded["estimates"]["symbolic"]["reserved_bytes"] = (u64::MAX - 1000).into();
    unbounded["estimates"]["symbolic"]["error"] = "no device holds the need: past 2^64 bytes".into();
    std::fs::write(&path, format!("{good}\n{unbounded}\n")).unwrap();
    assert_eq!(read_runs(std::slice::from_ref(&path)).map(|r| r.len()).map_err(|e| e.to_string()), Ok(2));
}

/// A run built with a zero point (not read from a file) gets the reserved scale's one-byte
/// floor: the margin stays a finite number.
#[test]
fn a_zero_point_gives_a_finite_margin() {
    let recs: Vec<RunRecord> =
        (0..60).map(|i| record_r(&format!("m-{i:05}"), "MLP", 1000.0 + i as f64, 0, 0)).collect();
    let f = fit(&recs, &RowSet::default(), 0.1, 0.5, 1, "fp32 adam").unwrap();
    let m = &f.families["mlp"].margin;
    assert!(m.margin.is_finite() && m.held_out_median_over.is_finite(), "{m:?}");
    assert!(f.families["mlp"].calibration_median_over.values().all(|v| v.is_finite()), "{:?}", f.families["mlp"]);
}

/// A value of the wrong type in a runs file was refused with serde's words alone ("invalid type:
/// floating point `3000000000.0`, expected u64 at line 1 column 1352"): now the field is named;
/// trailing text after the record is refused too.
#[test]
fn a_run_record_of_the_wrong_shape_names_the_field() {
    use estimators::compare::read_runs;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runs.jsonl");
    let good = serde_json::to_value(record_r("m-1", "MLP", 2000.0, 1000, 600)).unwrap();
    let mut float = good.clone();
    float["estimates"]["symbolic"]["device_bytes"] = serde_json::json!(3_000_000_000.0);
    for (line, says) in [
        (float.to_string(), "runs.jsonl:2: field estimates.symbolic.device_bytes: expected a run record"),
        (format!("{good} 7"), "runs.jsonl:2: expected a run record written by `memest compare` (trailing"),
        (
            good.to_string().replace("\"MLP\"", "\"Resnet\""),
            "runs.jsonl:2: field family is \"Resnet\": expected one of MLP, CNN, Transformer",
        ),
    ] {
        std::fs::write(&path, format!("{good}\n{line}\n")).unwrap();
        let e = read_runs(std::slice::from_ref(&path)).map(|r| r.len()).unwrap_err().to_string();
        assert!(e.contains(says), "{e}");
    }
}
