//! GPU utilisation classes (issue 7): low/medium/high bins, the CV summary, `memest util cv`.

use clap::Parser;
use estimators::ml::protocol::ProtocolConfig;
use estimators::ml::utilization::{self as util, UtilMetric, DEFAULT_THRESHOLDS};
use estimators::ml::{features, Dataset, Examples, KernelFeatures, MlError, ModelKind, TargetKind, TrainConfig};

#[test]
fn utilisation_bins_are_low_medium_high() {
    let t = util::target(UtilMetric::Smact, [0.3, 0.6]).unwrap();
    assert_eq!(t.kind, TargetKind::Smact);
    assert_eq!(t.binning.names, vec!["low", "medium", "high"]);
    for (v, want) in [(0.0, Some(0)), (0.29, Some(0)), (0.3, Some(1)), (0.6, Some(2)), (1.0, Some(2)), (-0.1, None)] {
        assert_eq!(t.binning.class_of(v), want, "SMACT {v}");
    }
    assert!(util::target(UtilMetric::Smocc, [0.6, 0.3]).is_err());
    assert!(util::target(UtilMetric::Smocc, [0.0, 0.3]).is_err());
    assert_eq!(UtilMetric::parse("SMOCC"), Some(UtilMetric::Smocc));
    assert_eq!(UtilMetric::parse("drama"), None);
}

fn excerpt(dir: &std::path::Path) -> std::path::PathBuf {
    let text = std::fs::read_to_string(crate::ml_data::gpumemnet("mlp_data_step2.csv")).unwrap();
    let head: Vec<&str> = text.lines().take(401).collect();
    let p = dir.join("excerpt.csv");
    std::fs::write(&p, head.join("\n")).unwrap();
    p
}

#[test]
fn util_cv_picks_the_best_model_by_cv_accuracy() {
    let dir = tempfile::tempdir().unwrap();
    let ds = Dataset::load(&excerpt(dir.path())).unwrap();
    let cfg = ProtocolConfig {
        models: vec![ModelKind::Tree, ModelKind::Logistic, ModelKind::GbmReg],
        train: TrainConfig { mlp_epochs: 2, trees: 5, ..TrainConfig::default() },
        latency_rows: 5,
        ..ProtocolConfig::default()
    };
    let (summary, report) = util::cross_validate(&ds, UtilMetric::Smact, [0.2, 0.5], &cfg, None).unwrap();
    assert_eq!(report.target, "smact");
    assert_eq!(report.rows, 400, "step 2 has a SMACT sample for every row");
    assert_eq!(summary.models.len(), 3);
    let best_cv = summary.models.iter().filter_map(|m| m.cv_accuracy).fold(f64::MIN, f64::max);
    let best = summary.models.iter().find(|m| m.model == summary.model).unwrap();
    assert_eq!(best.cv_accuracy, Some(best_cv));
    assert_eq!(Some(summary.accuracy), best.accuracy);
    let reg = summary.models.iter().find(|m| m.model == "gbm-reg").unwrap();
    assert!(reg.mae.is_some_and(|m| m >= 0.0) && reg.accuracy.is_none());
    let json = serde_json::to_value(&summary).unwrap();
    for key in ["accuracy", "high_class_recall", "f1", "model", "models"] {
        assert!(json.get(key).is_some(), "--json document lacks {key}");
    }
    assert_eq!(summary.thresholds, [0.2, 0.5]);
    assert_ne!(summary.thresholds, DEFAULT_THRESHOLDS);
}

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    util: memest_cli::utilization::UtilArgs,
}

#[test]
fn memest_util_cv_command() {
    let dir = tempfile::tempdir().unwrap();
    let csv = excerpt(dir.path()).display().to_string();
    let run = |args: &[&str]| {
        let mut argv = vec!["memest-util"];
        argv.extend_from_slice(args);
        memest_cli::utilization::run(Cli::try_parse_from(argv)?.util)
    };
    assert_eq!(run(&["cv", "--dataset", &csv, "--metric", "smocc", "--json", "--epochs", "2"]).unwrap(), 0u8);
    // `--epochs 0` trained nothing and reported the untrained ensemble as a result.
    for bad in ["0", "-1", "x"] {
        let err = format!("{:#}", run(&["cv", "--dataset", &csv, "--metric", "smact", "--epochs", bad]).unwrap_err());
        assert!(err.contains("--epochs") && err.contains("expected a whole number, at least 1"), "{bad}: {err}");
    }
    let err = format!("{:#}", run(&["cv", "--dataset", &csv, "--metric", "drama"]).unwrap_err());
    assert!(err.contains("smact or smocc"), "{err}");
    for bad in ["0.5", "0.2,x", "quartiles"] {
        let err =
            format!("{:#}", run(&["cv", "--dataset", &csv, "--metric", "smact", "--thresholds", bad]).unwrap_err());
        assert!(err.contains("expected two numbers") && err.contains("tertiles"), "{bad}: {err}");
    }
    // The metrics are fractions: thresholds past 1 left every row "low" and scored accuracy 1.0.
    for bad in ["2,3", "0.5,1.5", "0.9,0.1"] {
        let err =
            format!("{:#}", run(&["cv", "--dataset", &csv, "--metric", "smact", "--thresholds", bad]).unwrap_err());
        assert!(err.contains("medium/high <= 1"), "{bad}: {err}");
    }
}

#[test]
fn tertile_thresholds_give_three_equal_classes() {
    let dir = tempfile::tempdir().unwrap();
    let ds = Dataset::load(&excerpt(dir.path())).unwrap();
    for metric in [UtilMetric::Smact, UtilMetric::Smocc] {
        let t = util::tertiles(&ds, metric).unwrap();
        assert!(0.0 < t[0] && t[0] < t[1], "{metric:?} {t:?}");
        let ex = Examples::build(&ds, &util::target(metric, t).unwrap()).unwrap();
        let n = ex.len();
        assert_eq!(n, 400, "every excerpt row has both samples");
        for (class, count) in ex.class_counts().into_iter().enumerate() {
            assert!(count.abs_diff(n / 3) <= 2, "{metric:?} class {class}: {count} of {n} with {t:?}");
        }
    }
}

/// A kernel-statistics file for `ds`: `k_a` = data row number, `k_b` = 2 × it, plus a status
/// column and one extra key the dataset does not have.
fn kernel_file(dir: &std::path::Path, ds: &Dataset, skip: Option<usize>, bad: Option<usize>) -> std::path::PathBuf {
    let mut text = String::from("Filename,status,error,k_a,k_b\n");
    for r in &ds.rows {
        if Some(r.row) == skip {
            continue;
        }
        if Some(r.row) == bad {
            text += &format!("\"{}\",error,InvalidConfig: no,,\n", r.filename);
        } else {
            text += &format!("\"{}\",ok,,{},{}\n", r.filename, r.row, 2 * r.row);
        }
    }
    text += "not-in-the-dataset.out,ok,,oops,1\n";
    let p = dir.join("kernel.csv");
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn kernel_features_are_joined_by_filename_and_appended() {
    let dir = tempfile::tempdir().unwrap();
    let ds = Dataset::load(&excerpt(dir.path())).unwrap();
    let k = KernelFeatures::load(&kernel_file(dir.path(), &ds, None, None)).unwrap();
    assert_eq!(k.columns, vec!["k_a", "k_b"], "status/error are carried, not features");
    assert_eq!(k.len(), 401, "the extra key is loaded, and ignored by the join");
    let target = util::target(UtilMetric::Smact, DEFAULT_THRESHOLDS).unwrap();
    let plain = Examples::build(&ds, &target).unwrap();
    let joined = Examples::build_with(&ds, &target, Some(&k)).unwrap();
    assert_eq!(plain.x.ncols(), features::MLP_FEATURES.len());
    assert_eq!(joined.x.ncols(), plain.x.ncols() + 2);
    assert_eq!(joined.feature_names[plain.x.ncols()..], ["k_a", "k_b"]);
    assert_eq!(joined.row_ids, plain.row_ids);
    for (i, &row) in joined.row_ids.iter().enumerate() {
        let n = plain.x.ncols();
        assert_eq!(joined.x.row(i).slice(ndarray::s![..n]), plain.x.row(i), "GPUMemNet features unchanged");
        assert_eq!((joined.x[[i, n]], joined.x[[i, n + 1]]), (row as f64, 2.0 * row as f64), "row {row}");
    }
}

#[test]
fn kernel_features_missing_key_or_non_numeric_value_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let ds = Dataset::load(&excerpt(dir.path())).unwrap();
    let target = util::target(UtilMetric::Smact, DEFAULT_THRESHOLDS).unwrap();
    let missing = KernelFeatures::load(&kernel_file(dir.path(), &ds, Some(7), None)).unwrap();
    let err = Examples::build_with(&ds, &target, Some(&missing)).unwrap_err();
    assert!(matches!(err, MlError::MissingKey { row: 7, .. }), "{err}");
    let msg = err.to_string();
    assert!(msg.contains("kernel.csv") && msg.contains(&ds.rows[6].filename) && msg.contains("data row 7"), "{msg}");

    let bad = KernelFeatures::load(&kernel_file(dir.path(), &ds, None, Some(9))).unwrap();
    let msg = Examples::build_with(&ds, &target, Some(&bad)).unwrap_err().to_string();
    // A row whose statistics were not computed is refused by its status, before its cells.
    assert!(msg.contains("kernel.csv") && msg.contains("\"status\"") && msg.contains(&ds.rows[8].filename), "{msg}");
    assert!(msg.contains("found \"error: InvalidConfig: no\""), "the trainer's reason is quoted: {msg}");

    for (text, what) in [
        ("Name,k_a\nx,1\n", "Filename"),
        ("Filename,status\nx,ok\n", "k_*"),
        ("Filename,k_a\nx,1\nx,2\n", "already appears in row 1"),
        // One file, one step's settings.
        (
            "Filename,optimizer,k_a\nx,adam,1\ny,sgd,2\n",
            "row 2, column \"optimizer\": \"sgd\" here but \"adam\" in row 1",
        ),
    ] {
        let msg = KernelFeatures::from_reader(std::path::Path::new("k.csv"), text.as_bytes()).unwrap_err().to_string();
        assert!(msg.contains("k.csv") && msg.contains(what), "{what}: {msg}");
    }
}

/// A kernel-statistics value outside its domain, or a row whose status is not ok, was used as a
/// feature; a file of another step's settings was joined in silence.
#[test]
fn kernel_features_outside_their_domain_or_of_another_step_are_said() {
    let dir = tempfile::tempdir().unwrap();
    let ds = Dataset::load(&excerpt(dir.path())).unwrap();
    let target = util::target(UtilMetric::Smact, DEFAULT_THRESHOLDS).unwrap();
    let path = kernel_file(dir.path(), &ds, None, None);
    let text = std::fs::read_to_string(&path).unwrap();
    let first = &ds.rows[0].filename;
    for (from, to, says) in [
        (format!("\"{first}\",ok,,1,2"), format!("\"{first}\",ok,,-5,2"), "\"k_a\": Filename"),
        (format!("\"{first}\",ok,,1,2"), format!("\"{first}\",maybe,,1,2"), "expected status ok, found \"maybe\""),
    ] {
        assert!(text.contains(&from), "{from}");
        std::fs::write(&path, text.replace(&from, &to)).unwrap();
        let k = KernelFeatures::load(&path).unwrap();
        let msg = Examples::build_with(&ds, &target, Some(&k)).unwrap_err().to_string();
        assert!(msg.contains(says), "{says}: {msg}");
    }
    assert!(
        Examples::build_with(&ds, &target, Some(&KernelFeatures::load(&path).unwrap())).is_err(),
        "the last edit stays refused"
    );
    let sgd = dir.path().join("sgd.csv");
    std::fs::write(&sgd, crate::ml_data::with_column(&text, "optimizer", "sgd")).unwrap();
    let k = KernelFeatures::load(&sgd).unwrap();
    assert_eq!(k.settings, vec![("optimizer".to_string(), "sgd".to_string())]);
    let said = k.mismatches(&ds.rows);
    assert_eq!(said.len(), 1, "{said:?}");
    assert!(said[0].contains("optimizer \"sgd\", but 400 of 400 dataset rows ran with another"), "{said:?}");
}

#[test]
fn util_cv_with_kernel_features_reports_the_wider_feature_vector() {
    let dir = tempfile::tempdir().unwrap();
    let ds = Dataset::load(&excerpt(dir.path())).unwrap();
    let k = KernelFeatures::load(&kernel_file(dir.path(), &ds, None, None)).unwrap();
    let cfg = ProtocolConfig {
        models: vec![ModelKind::Tree, ModelKind::GbmReg],
        train: TrainConfig { mlp_epochs: 2, trees: 5, ..TrainConfig::default() },
        latency_rows: 5,
        ..ProtocolConfig::default()
    };
    let (plain, _) = util::cross_validate(&ds, UtilMetric::Smact, [0.2, 0.5], &cfg, None).unwrap();
    let (with, report) = util::cross_validate(&ds, UtilMetric::Smact, [0.2, 0.5], &cfg, Some(&k)).unwrap();
    assert_eq!(plain.features.len(), features::MLP_FEATURES.len());
    assert_eq!(with.features.len(), plain.features.len() + k.columns.len());
    assert!(report.notes.iter().any(|n| n.contains("2 kernel-statistics features")), "{:?}", report.notes);
    assert!(with.models.iter().all(|m| m.error.is_none()), "{:?}", with.models);
    let err = format!(
        "{:#}",
        memest_cli::utilization::run(
            Cli::try_parse_from([
                "memest-util",
                "cv",
                "--dataset",
                &ds.path.display().to_string(),
                "--metric",
                "smact",
                "--kernel-features",
                "/nonexistent/k.csv",
            ])
            .unwrap()
            .util,
        )
        .unwrap_err()
    );
    assert!(err.contains("/nonexistent/k.csv"), "{err}");
}

/// `util cv --json` carries the numbers its text prints (the rows and the excluded ones, test
/// rows, CV spreads, weighted F1, the regressors' errors): the whole report beside the summary.
#[test]
fn util_cv_json_carries_the_texts_numbers() {
    let dir = tempfile::tempdir().unwrap();
    let csv = excerpt(dir.path()).display().to_string();
    let (code, out, err) =
        crate::support::memest_code(&["util", "cv", "--dataset", &csv, "--metric", "smact", "--json", "--epochs", "2"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let report = &v["report"];
    assert_eq!(report["rows"], 400, "{report}");
    for key in ["excluded", "test_rows", "folds", "class_counts"] {
        assert!(!report[key].is_null(), "report lacks {key}");
    }
    let model = &report["models"][0];
    for key in ["cv_accuracy", "cv_f1_weighted", "test"] {
        assert!(!model[key].is_null(), "{key}: {model}");
    }
    assert!(model["cv_accuracy"]["std"].is_number(), "{model}");
}

/// A kernel-statistics column given twice was read at whichever position the join met first;
/// refused, naming the column and both positions.
#[test]
fn kernel_features_refuse_a_column_given_twice() {
    let p = std::path::Path::new("k.csv");
    for (header, column) in
        [("Filename,k_a,k_a", "k_a"), ("Filename,k_a,Filename", "Filename"), ("Filename,k_a, k_a ", "k_a")]
    {
        let text = format!("{header}\nx,1,2\n");
        let e = KernelFeatures::from_reader(p, text.as_bytes()).map(|_| ()).unwrap_err().to_string();
        assert!(
            e.contains("k.csv") && e.contains(&format!("{column:?}")) && e.contains("expected each column once"),
            "{header}: {e}"
        );
    }
    assert!(KernelFeatures::from_reader(p, "Filename,k_a,k_b\nx,1,2\n".as_bytes()).is_ok());
}

/// A column of no kind the file has (a misspelt `kflops`) was not read, in silence; it is said
/// with the settings' mismatches, and the file's own columns are not.
#[test]
fn kernel_features_say_the_columns_they_ignore() {
    let p = std::path::Path::new("k.csv");
    let k = KernelFeatures::from_reader(p, "Filename,k_a,kflops,status,error,optimizer\nx,1,2,ok,,adam\n".as_bytes())
        .unwrap();
    assert_eq!(k.ignored, ["kflops"]);
    let said = k.mismatches(&[]);
    assert!(said.iter().any(|w| w.starts_with("k.csv: columns [\"kflops\"] ignored")), "{said:?}");
    let plain = KernelFeatures::from_reader(
        p,
        "Filename,k_a,status,error,optimizer,amp,device\nx,1,ok,,adam,fp32,cpu\n".as_bytes(),
    )
    .unwrap();
    assert!(plain.ignored.is_empty() && plain.mismatches(&[]).is_empty());
}
