//! GPU utilisation classes (issue 7): low/medium/high bins, the CV summary, `memest util cv`.

use std::process::ExitCode;

use clap::Parser;
use estimators::ml::protocol::ProtocolConfig;
use estimators::ml::util::{self, UtilMetric, DEFAULT_THRESHOLDS};
use estimators::ml::{Dataset, ModelKind, TargetKind, TrainConfig};

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
    let (summary, report) = util::cross_validate(&ds, UtilMetric::Smact, [0.2, 0.5], &cfg).unwrap();
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
    util: crate::memest_util::UtilArgs,
}

#[test]
fn memest_util_cv_command() {
    let dir = tempfile::tempdir().unwrap();
    let csv = excerpt(dir.path()).display().to_string();
    let run = |args: &[&str]| {
        let mut argv = vec!["memest-util"];
        argv.extend_from_slice(args);
        crate::memest_util::run(Cli::try_parse_from(argv)?.util)
    };
    assert_eq!(
        run(&["cv", "--dataset", &csv, "--metric", "smocc", "--json", "--epochs", "2"]).unwrap(),
        ExitCode::SUCCESS
    );
    let err = format!("{:#}", run(&["cv", "--dataset", &csv, "--metric", "drama"]).unwrap_err());
    assert!(err.contains("smact or smocc"), "{err}");
}
