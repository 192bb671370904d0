//! What an ML model cannot stand behind: a job outside the range it was trained on (said, per
//! feature), a negative prediction (never printed as memory), impossible feature values
//! (refused, naming the feature), and the feature names `--help` owes the user.

use std::path::{Path, PathBuf};

use crate::cli::inputs;
use crate::support::memest_code;

/// The linear regressor of the whole step-1 MLP CSV (depth 2–12, batch 4–1023, ReLU only).
fn linear_model(dir: &Path) -> PathBuf {
    step1_model(dir, "linear-reg", "lin.json")
}

/// A `kind` model of the whole step-1 MLP CSV, written to `dir/file`.
fn step1_model(dir: &Path, kind: &str, file: &str) -> PathBuf {
    let model = dir.join(file);
    let csv = crate::ml_data::gpumemnet("mlp_data_step1.csv");
    let (c, m) = (csv.to_str().unwrap(), model.to_str().unwrap());
    let (code, _, err) = memest_code(&["ml", "train", "--dataset", c, "--model", kind, "--out", m]);
    assert_eq!(code, 0, "{err}");
    model
}

/// A step-1-like MLP's features; `layers` and `batch_size` replaced by the caller.
fn mlp_features(layers: &str, batch: &str) -> String {
    format!(
        r#"{{"layers": {layers}, "batch_size": {batch}, "parameters": 2888, "activations": 136, "batch_norm_layers": 0,
            "dropout_layers": 0, "activation_sin": 0.98982, "activation_cos": -0.14231}}"#
    )
}

/// A depth-800 MLP was answered -148.9 MiB (and a depth of 1e300 -2e303 MiB), exit 0, without a
/// word: the model was trained on depths 2 to 12. Each feature outside the training range is
/// now said, with its value and the range, and a negative prediction is no memory figure.
#[test]
fn predict_says_features_outside_the_training_range_and_prints_no_negative_memory() {
    let dir = tempfile::tempdir().unwrap();
    let model = linear_model(dir.path());
    let m = model.to_str().unwrap();
    let (code, out, err) = memest_code(&["ml", "predict", "--model", m, "--features", &mlp_features("6", "64")]);
    assert!(code == 0 && out.contains(" MiB") && !err.contains("training range"), "in range: {code} {out} {err}");
    for layers in ["800", "1e300"] {
        let features = mlp_features(layers, "64");
        let (code, out, err) = memest_code(&["ml", "predict", "--model", m, "--features", &features]);
        assert_eq!(code, 0, "{err}");
        assert!(err.contains("feature \"layers\" is ") && err.contains("outside the training range 2 to 12"), "{err}");
        assert!(!err.contains("\"batch_size\""), "batch 64 is inside 4 to 1023: {err}");
        assert!(
            !out.contains("-")
                && out.contains("the model's prediction is negative: the input is outside what it was trained on"),
            "{layers}: {out}"
        );
        let (code, out, _) = memest_code(&["ml", "predict", "--model", m, "--features", &features, "--json"]);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert!(code == 0 && v[0]["estimate"].is_null(), "{v}");
        assert!(v[0]["unavailable"].as_str().unwrap().contains("prediction is negative"), "{v}");
        assert!(v[0]["warnings"][0].as_str().unwrap().contains("outside the training range"), "{v}");
    }
    // A classifier's bins are as blind outside the range.
    let tree = step1_model(dir.path(), "tree", "tree.json");
    let t = tree.to_str().unwrap();
    let (code, _, err) = memest_code(&["ml", "predict", "--model", t, "--features", &mlp_features("6", "4096")]);
    assert!(code == 0 && err.contains("feature \"batch_size\" is 4096, outside the training range 4 to 1023"), "{err}");

    // A model file written before the ranges were recorded still reads, with the range unknown.
    let mut old: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&model).unwrap()).unwrap();
    assert!(old.as_object_mut().unwrap().remove("training_ranges").is_some(), "the file records the ranges");
    let old_path = dir.path().join("old.json");
    std::fs::write(&old_path, old.to_string()).unwrap();
    let p = old_path.to_str().unwrap();
    let (code, out, err) = memest_code(&["ml", "predict", "--model", p, "--features", &mlp_features("800", "64")]);
    assert!(code == 0 && err.contains("records no training range") && out.contains("prediction is negative"), "{err}");
}

/// Through `memest estimate` (and the trainer's `estimate --ml-model`, which runs it), a depth-800
/// MLP's `estimates.ml.device_mib` was -99.13 with no warning.
#[test]
fn the_ml_estimate_of_a_job_outside_the_training_range_is_null_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let model = linear_model(dir.path());
    let (t, _, _) = inputs(dir.path());
    let deep = dir.path().join("deep.json");
    std::fs::write(
        &deep,
        r#"{"total_parameters": 2888, "total_activations": 136, "batch_size": 8, "depth": 800,
            "activation_function": "ReLU", "sequence": [["Linear", 32, 2080], ["ReLU", 32, 0], ["Linear", 16, 528],
            ["ReLU", 16, 0], ["Linear", 10, 170], ["ReLU", 10, 0], ["Linear", 10, 110], ["Softmax", 10, 0]]}"#,
    )
    .unwrap();
    let (d, m) = (deep.to_str().unwrap(), model.to_str().unwrap());
    let (code, out, err) = memest_code(&["estimate", "--trace", &t, "--features", d, "--ml-model", m, "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(v["estimates"]["ml"].is_null(), "{}", v["estimates"]["ml"]);
    let why = v["unavailable"]["ml"].as_str().unwrap();
    assert!(why.contains("the model's prediction is negative: the input is outside what it was trained on"), "{why}");
    let warnings = v["warnings"].to_string();
    assert!(warnings.contains("feature \\\"layers\\\" is 800, outside the training range 2 to 12"), "{warnings}");
    assert!(err.contains("outside the training range"), "{err}");

    // An activation the model has no encoding for: the reason is worded, not a Rust value.
    let bogus = dir.path().join("bogus.json");
    std::fs::write(&bogus, std::fs::read_to_string(&deep).unwrap().replace("\"ReLU\",", "\"Bogus\",")).unwrap();
    let b = bogus.to_str().unwrap();
    let (code, out, err) = memest_code(&["estimate", "--trace", &t, "--features", b, "--ml-model", m, "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let why = v["unavailable"]["ml"].as_str().unwrap();
    assert!(
        why.contains("activation \"Bogus\" is not one of ELU, GELU") && !why.contains("UnknownActivation"),
        "{why}"
    );

    // A model file that is no model (empty here) is refused naming the flag and the file.
    let empty = dir.path().join("empty.json");
    std::fs::write(&empty, "").unwrap();
    let e = empty.to_str().unwrap();
    let (code, out, err) = memest_code(&["estimate", "--trace", &t, "--features", d, "--ml-model", e, "--json"]);
    assert_eq!((code, out.as_str()), (2, ""), "{err}");
    assert!(err.contains(&format!("--ml-model {e}")) && err.contains("not an ML model file"), "{err}");
}

/// A batch of 1.5 and an activation encoding off the unit circle (sin 0.5, cos -0.14) were
/// predicted from.
#[test]
fn impossible_feature_values_are_refused_naming_the_feature() {
    let dir = tempfile::tempdir().unwrap();
    let model = linear_model(dir.path());
    let m = model.to_str().unwrap();
    let good = mlp_features("6", "64");
    for (from, to, says) in [
        (
            "\"batch_size\": 64",
            "\"batch_size\": 1.5",
            "feature \"batch_size\" is 1.5: expected a batch of at least 1, a whole number",
        ),
        ("\"layers\": 6", "\"layers\": 2.5", "feature \"layers\" is 2.5: expected a whole number"),
        ("\"activation_sin\": 0.98982", "\"activation_sin\": 0.5", "\"activation_sin\" and \"activation_cos\""),
        ("\"activation_cos\": -0.14231", "\"activation_cos\": 0.9", "the (sin, cos) encoding of one of"),
    ] {
        let bad = good.replace(from, to);
        assert_ne!(bad, good);
        let (code, _, err) = memest_code(&["ml", "predict", "--model", m, "--features", &bad]);
        assert!(code == 2 && err.contains(says), "{to}: {code} {err}");
    }
    // GPUMemNet's encoding rounded to two places is the same activation.
    let rounded = good.replace("0.98982", "0.99").replace("-0.14231", "-0.14");
    let (code, _, err) = memest_code(&["ml", "predict", "--model", m, "--features", &rounded]);
    assert!(code == 0 && !err.contains("activation_"), "{code} {err}");
}

/// `--features` said "keyed by feature name" and named none: each family's names are listed.
#[test]
fn predict_help_lists_every_feature_name() {
    let (code, out, _) = memest_code(&["ml", "predict", "--help"]);
    assert_eq!(code, 0);
    for f in estimators::features::Family::ALL {
        for name in estimators::ml::features::feature_names(f) {
            assert!(out.contains(name), "--help leaves out {f} feature {name}:\n{out}");
        }
    }
}

/// A features object with a key given twice was answered with the last value in silence; the
/// features file refuses one, and so does `ml predict`, naming the key.
#[test]
fn predict_refuses_a_key_given_twice() {
    let dir = tempfile::tempdir().unwrap();
    let model = linear_model(dir.path());
    let m = model.to_str().unwrap();
    let twice = mlp_features("6", "64").replacen("\"batch_size\": 64", "\"batch_size\": 64, \"batch_size\": 4096", 1);
    for features in [twice.clone(), format!("[{}, {twice}]", mlp_features("6", "64"))] {
        let (code, _, err) = memest_code(&["ml", "predict", "--model", m, "--features", &features]);
        assert!(code == 2 && err.contains("batch_size\" is given twice"), "{code} {err}");
    }
}
