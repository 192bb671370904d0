//! ML estimators: every model family learns, is deterministic, round-trips through a model file,
//! and never sees held-out rows.

use std::collections::BTreeMap;

use estimators::ml::mlp::{MlpEnsemble, MlpParams, MlpTask};
use estimators::ml::modelfile::{ModelFile, FORMAT_VERSION, LICENCE_NOTE};
use estimators::ml::protocol::evaluate_split;
use estimators::ml::split::stratified_holdout;
use estimators::ml::{Binning, Examples, Family, MlError, ModelKind, Pipeline, Target, TargetKind, TrainConfig};
use ndarray::Array2;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// A synthetic memory-like dataset: value = 1001 + 3000·(0.7·x0 + 0.3·x1) MiB, in MLP bins
/// (1000, 2000], (2000, 3000], (3000, 4000]; x2 and x3 are noise features; 8 feature columns so
/// the MLP-family feature names fit.
pub(crate) fn synthetic(n: usize, seed: u64) -> Examples {
    let mut rng = StdRng::seed_from_u64(seed);
    let target = Target::memory(Family::Mlp);
    let x = Array2::from_shape_fn(
        (n, 8),
        |(_, j)| {
            if j < 4 {
                rng.gen_range(0.0..1.0)
            } else {
                rng.gen_range(0.0..1000.0)
            }
        },
    );
    let value: Vec<f64> = x.rows().into_iter().map(|r| 1001.0 + 3000.0 * (0.7 * r[0] + 0.3 * r[1])).collect();
    let class = value.iter().map(|&v| target.binning.class_of(v).unwrap()).collect();
    Examples {
        family: Family::Mlp,
        feature_names: estimators::ml::features::MLP_FEATURES.iter().map(|s| s.to_string()).collect(),
        x,
        class,
        measured: vec![true; n],
        row_ids: (1..=n).collect(),
        digests: (1..=n).map(|i| format!("{i:016x}")).collect(),
        excluded: BTreeMap::new(),
        value,
        target,
    }
}

pub(crate) fn fast_config() -> TrainConfig {
    TrainConfig { seed: 11, mlp_epochs: 60, trees: 9, gbm_budget: 0.5 }
}

fn fit(ex: &Examples, kind: ModelKind, cfg: &TrainConfig) -> Pipeline {
    Pipeline::fit(kind, ex.family, &ex.x, &ex.class, &ex.value, ex.target.binning.classes(), cfg).unwrap()
}

/// The fitted pipeline as JSON with object keys sorted (perpetual keeps tree nodes in a
/// `HashMap`, so its own serialisation order varies between identical fits).
fn canonical(p: &Pipeline) -> String {
    serde_json::to_value(p).unwrap().to_string()
}

fn check_classifier(kind: ModelKind, min_accuracy: f64) {
    let train = synthetic(400, 1);
    let test = synthetic(200, 2);
    let p = fit(&train, kind, &fast_config());
    let pred = p.predict_class(&test.x).unwrap();
    let acc = estimators::ml::score::accuracy(&test.class, &pred);
    assert!(acc >= min_accuracy, "{}: accuracy {acc:.3} below {min_accuracy} on a separable rule", kind.name());
}

#[test]
fn every_classifier_learns_a_separable_rule() {
    // Chance is about 0.45 (the majority bin); a broken learner stays near it.
    for kind in [ModelKind::Logistic, ModelKind::Tree, ModelKind::Forest, ModelKind::Bagging, ModelKind::Gbm] {
        check_classifier(kind, 0.85);
    }
}

/// The hand-written MLP ensemble (forward, BatchNorm and Adam backward passes) learns: three
/// members instead of GPUMemNet's thirteen keep the debug-build test fast.
#[test]
fn mlp_ensemble_learns_classes_and_values() {
    let train = synthetic(400, 1);
    let test = synthetic(200, 2);
    let scaler = estimators::ml::scale::Standardizer::fit(&train.x);
    let (xs, ts) = (scaler.transform(&train.x), scaler.transform(&test.x));
    let params = MlpParams { depths: vec![1, 2, 3], epochs: 200, ..MlpParams::gpumemnet(Family::Mlp, 0, 3) };
    let y: Vec<f64> = train.class.iter().map(|&c| c as f64).collect();
    let m = MlpEnsemble::fit(&xs, &y, MlpTask::Classify(5), &params).unwrap();
    let acc = estimators::ml::score::accuracy(&test.class, &m.predict_class(&ts));
    assert!(acc >= 0.8, "mlp-ensemble accuracy {acc:.3} on a separable rule (chance about 0.45)");
    let r = MlpEnsemble::fit(&xs, &train.value, MlpTask::Regress, &params).unwrap();
    let mre = estimators::ml::score::mre(&test.value, &r.predict_value(&ts)).unwrap();
    assert!(mre <= 0.15, "mlp-reg MRE {mre:.3} on a linear target");
}

fn check_regressor(kind: ModelKind, max_mre: f64) {
    let train = synthetic(400, 3);
    let test = synthetic(200, 4);
    let p = fit(&train, kind, &fast_config());
    let est = p.predict_value(&test.x).unwrap();
    let mre = estimators::ml::score::mre(&test.value, &est).unwrap();
    assert!(mre <= max_mre, "{}: MRE {mre:.4} above {max_mre}", kind.name());
}

#[test]
fn every_regressor_fits_a_linear_target() {
    for (kind, max_mre) in [(ModelKind::LinearReg, 0.001), (ModelKind::ForestReg, 0.08), (ModelKind::GbmReg, 0.05)] {
        check_regressor(kind, max_mre);
    }
}

#[test]
fn training_is_deterministic_for_a_seed() {
    let ex = synthetic(160, 5);
    let cfg = TrainConfig { mlp_epochs: 5, ..fast_config() };
    for kind in [
        ModelKind::Tree,
        ModelKind::Forest,
        ModelKind::Bagging,
        ModelKind::ForestReg,
        ModelKind::Gbm,
        ModelKind::MlpEnsemble,
        ModelKind::GbmReg,
        ModelKind::MlpReg,
    ] {
        let a = canonical(&fit(&ex, kind, &cfg));
        let b = canonical(&fit(&ex, kind, &cfg));
        assert!(a == b, "{}: two fits with one seed differ", kind.name());
        if matches!(kind, ModelKind::Forest | ModelKind::MlpEnsemble) {
            let other = TrainConfig { seed: 12, ..cfg.clone() };
            let c = canonical(&fit(&ex, kind, &other));
            assert!(a != c, "{}: the seed has no effect", kind.name());
        }
    }
}

#[test]
fn model_file_round_trip_predicts_identically() {
    let ex = synthetic(200, 6);
    let probe = synthetic(50, 7);
    let dir = tempfile::tempdir().unwrap();
    let cfg = TrainConfig { mlp_epochs: 3, ..fast_config() };
    for kind in ModelKind::CLASSIFIERS.into_iter().chain(ModelKind::REGRESSORS) {
        let file = ModelFile::train(&ex, kind, &cfg, "synthetic", LICENCE_NOTE).unwrap();
        let path = dir.path().join(format!("{}.json", kind.name()));
        file.save(&path).unwrap();
        let loaded = ModelFile::load(&path).unwrap();
        assert_eq!(loaded.format_version, FORMAT_VERSION);
        assert_eq!(loaded.target, file.target);
        assert_eq!(
            file.predict(&probe.x).unwrap(),
            loaded.predict(&probe.x).unwrap(),
            "{}: predictions changed through save/load",
            kind.name()
        );
        let leftovers: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().contains(".tmp."))
            .collect();
        assert!(leftovers.is_empty(), "temporary file left behind");
    }
}

/// Poisoning the held-out rows (labels, values and features) must not change the fitted model
/// in any byte: neither the scaler nor the learner may see them.
#[test]
fn poisoned_held_out_rows_do_not_change_training() {
    let ex = synthetic(240, 8);
    let split = stratified_holdout(&ex.class, 0.25, 3);
    let mut poisoned = ex.clone();
    for &i in &split.test {
        poisoned.class[i] = (poisoned.class[i] + 1) % 3;
        poisoned.value[i] *= 10.0;
        poisoned.measured[i] = !poisoned.measured[i];
        poisoned.x.row_mut(i).mapv_inplace(|v| v * 1e6 + 7.0);
    }
    let cfg = TrainConfig { mlp_epochs: 3, ..fast_config() };
    for kind in [ModelKind::Logistic, ModelKind::Forest, ModelKind::Gbm, ModelKind::MlpEnsemble, ModelKind::LinearReg] {
        let clean = evaluate_split(&ex, kind, &split, &cfg).unwrap();
        let dirty = evaluate_split(&poisoned, kind, &split, &cfg).unwrap();
        assert!(canonical(&clean.pipeline) == canonical(&dirty.pipeline), "{}: the fit saw held-out rows", kind.name());
    }
}

#[test]
fn mlp_ensemble_matches_gpumemnet_sizes() {
    assert_eq!(MlpParams::gpumemnet(Family::Mlp, 1, 0).depths.len(), 13);
    assert_eq!(MlpParams::gpumemnet(Family::Cnn, 1, 0).depths.len(), 16);
    // GPUMemNet's Overheads.md: 1,495 parameters for its 7-member MLP estimator on MLP data
    // (8 features, 5 bins) and 1,646 on CNN data (10 features, 6 bins).
    for (features, classes, want) in [(8, 5, 1495), (10, 6, 1646)] {
        let params = MlpParams { depths: (1..=7).collect(), epochs: 0, ..MlpParams::gpumemnet(Family::Mlp, 0, 0) };
        let x = Array2::zeros((4, features));
        let m = MlpEnsemble::fit(&x, &[0.0, 1.0, 0.0, 1.0], MlpTask::Classify(classes), &params).unwrap();
        assert_eq!(m.parameter_count(), want);
    }
}

#[test]
fn model_file_misuse_is_a_clear_error() {
    let ex = synthetic(60, 9);
    let dir = tempfile::tempdir().unwrap();
    let file = ModelFile::train(&ex, ModelKind::Tree, &fast_config(), "synthetic", LICENCE_NOTE).unwrap();

    let unknown = serde_json::json!({"layers": 1, "bogus": 2});
    let err = file.features_from_json(&unknown, "f.json").unwrap_err().to_string();
    assert!(err.contains("f.json") && err.contains("bogus"), "{err}");
    let mut partial = serde_json::Map::new();
    partial.insert("layers".into(), 1.into());
    let err = file.features_from_json(&serde_json::Value::Object(partial), "f.json").unwrap_err().to_string();
    assert!(err.contains("batch_size"), "{err}");
    let err = file.predict(&Array2::zeros((1, 3))).unwrap_err().to_string();
    assert!(err.contains("expected 8 features"), "{err}");
    let err = file.pipeline.predict_value(&ex.x).unwrap_err().to_string();
    assert!(err.contains("classifier"), "{err}");

    let path = dir.path().join("m.json");
    file.save(&path).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, text.replacen("\"format_version\":1", "\"format_version\":99", 1)).unwrap();
    assert!(matches!(ModelFile::load(&path), Err(MlError::ModelFileVersion { found: 99, .. })));
    std::fs::write(&path, "{\"format_version\":1,\"licence\":3}").unwrap();
    let err = ModelFile::load(&path).unwrap_err().to_string();
    assert!(err.contains("m.json"), "{err}");
}

/// Training rows are recognised by content in any file; a model file written before digests
/// were recorded falls back to its training CSV's path; damaged digests are refused at load.
#[test]
fn model_files_know_their_training_rows_by_content() {
    let ex = synthetic(40, 4);
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("train.csv");
    std::fs::write(&csv, "x\n").unwrap();
    let elsewhere = dir.path().join("copy.csv");
    let file = ModelFile::train(&ex, ModelKind::Tree, &fast_config(), csv.to_str().unwrap(), LICENCE_NOTE).unwrap();
    assert!(file.knows_training_rows() && file.training_digests.len() == 40);
    assert!(file.trained_on_row(&ex.digests[7], &elsewhere), "a training row in another file");
    assert!(!file.trained_on_row(&format!("{:016x}", 999), &csv), "a new row of the training file");

    let mut old = file.clone();
    old.training_digests.clear();
    assert!(!old.knows_training_rows());
    assert!(old.trained_on_row("", &csv) && !old.trained_on_row(&ex.digests[7], &elsewhere));

    let path = dir.path().join("m.json");
    for (bad, why) in [
        (vec!["xyz".to_string()], "16 hex digits"),
        (vec![ex.digests[2].clone(), ex.digests[1].clone()], "sorted and distinct"),
    ] {
        let mut f = file.clone();
        f.training_digests = bad;
        f.save(&path).unwrap();
        let err = ModelFile::load(&path).unwrap_err().to_string();
        assert!(err.contains("training_digests") && err.contains(why), "{err}");
    }
    let mut f = serde_json::to_value(&file).unwrap();
    f.as_object_mut().unwrap().remove("training_digests");
    std::fs::write(&path, f.to_string()).unwrap();
    assert!(!ModelFile::load(&path).unwrap().knows_training_rows(), "an older file still loads");
}

/// A model file records each feature's range over its training rows: a row outside it is said,
/// feature by feature; a file written before the ranges were recorded reads, with the range
/// unknown; ranges that do not match the features are refused at load.
#[test]
fn model_files_record_each_features_training_range() {
    let ex = synthetic(40, 5);
    let dir = tempfile::tempdir().unwrap();
    let file = ModelFile::train(&ex, ModelKind::LinearReg, &fast_config(), "synthetic", LICENCE_NOTE).unwrap();
    let ranges = file.training_ranges.clone().expect("ranges recorded");
    assert_eq!(ranges.len(), 8);
    for (j, r) in ranges.iter().enumerate() {
        let col = ex.x.column(j);
        assert_eq!(r.feature, estimators::ml::features::MLP_FEATURES[j]);
        assert_eq!((r.min, r.max), (col.fold(f64::MAX, |a, &b| a.min(b)), col.fold(f64::MIN, |a, &b| a.max(b))));
    }
    let inside: Vec<f64> = ex.x.row(3).to_vec();
    assert!(file.outside_training(&inside).is_empty());
    let mut outside = inside.clone();
    outside[0] = 800.0;
    outside[1] = -1.0;
    let said = file.outside_training(&outside);
    assert_eq!(said.len(), 2, "{said:?}");
    assert!(said[0].starts_with("feature \"layers\" is 800, outside the training range 0."), "{said:?}");
    assert!(said[1].starts_with("feature \"batch_size\" is -1, outside"), "{said:?}");
    let path = dir.path().join("m.json");
    assert!(file.range_unknown(&path).is_none());

    let mut old = serde_json::to_value(&file).unwrap();
    old.as_object_mut().unwrap().remove("training_ranges");
    std::fs::write(&path, old.to_string()).unwrap();
    let loaded = ModelFile::load(&path).unwrap();
    assert!(loaded.outside_training(&outside).is_empty());
    assert!(loaded.range_unknown(&path).unwrap().contains("records no training range"));
    for (name, edit) in [
        ("short", serde_json::json!(ranges[..7])),
        ("swapped", serde_json::json!([{"feature": "layers", "min": 2.0, "max": 1.0}])),
    ] {
        let mut v = serde_json::to_value(&file).unwrap();
        v["training_ranges"] = edit;
        std::fs::write(&path, v.to_string()).unwrap();
        let err = ModelFile::load(&path).unwrap_err().to_string();
        assert!(err.contains("field training_ranges"), "{name}: {err}");
    }
    // A negative or infinite answer is no memory figure.
    use estimators::ml::modelfile::{Prediction, NEGATIVE, NOT_FINITE};
    let p = |raw| Prediction { class: None, bin: None, raw };
    assert_eq!((p(-148.9).mib(), p(f64::INFINITY).mib(), p(12.5).mib()), (Err(NEGATIVE), Err(NOT_FINITE), Ok(12.5)));
}

#[test]
fn utilisation_targets_plug_into_the_same_machinery() {
    let mut ex = synthetic(300, 10);
    ex.target = Target {
        kind: TargetKind::Smact,
        binning: Binning::new(vec![0.0, 0.3, 0.6, 1.0], estimators::ml::Closed::Right),
    };
    ex.value = ex.x.column(0).to_vec();
    ex.class = ex.value.iter().map(|&v| ex.target.binning.class_of(v).unwrap_or(0)).collect();
    let p = fit(&ex, ModelKind::Tree, &fast_config());
    let acc = estimators::ml::score::accuracy(&ex.class, &p.predict_class(&ex.x).unwrap());
    assert!(acc > 0.95, "tree on its own training rows: {acc}");
}

/// Two rows whose feature values are adjacent floats: the split midpoint rounds onto the upper
/// value, which once sent every row to one side and grew the tree forever.
#[test]
fn trees_split_adjacent_float_values() {
    let a = 1.0f64;
    let b = f64::from_bits(a.to_bits() + 1);
    let x = Array2::from_shape_vec((4, 1), vec![a, b, a, b]).unwrap();
    let y = [0.0, 1.0, 0.0, 1.0];
    let forest = estimators::ml::cart::Forest::fit(
        &x,
        &y,
        estimators::ml::cart::TreeTask::Classify(2),
        estimators::ml::cart::TreeParams::default(),
        1,
        false,
        0,
    );
    assert_eq!(forest.predict_class(&x), vec![0, 1, 0, 1]);
}
