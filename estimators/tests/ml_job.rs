//! A job the trainer describes (`features --json`) gives the ML models the same feature vector as
//! the GPUMemNet dataset row it rebuilds.

use std::process::Command;

use estimators::ml::dataset::Dataset;
use estimators::ml::features::extract;
use estimators::ml::job::row_from_features;

use crate::common::{shared, venv_python};

fn features_json(filename: &str) -> serde_json::Value {
    let out = Command::new(venv_python())
        .args(["-m", "memtrace_trainer", "features", "--gpumemnet-row", filename, "--json"])
        .output()
        .expect("run the trainer");
    assert!(out.status.success(), "features failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("features JSON")
}

#[test]
fn trainer_features_match_the_dataset_rows() {
    for (file, rows) in
        [("gpumemnet/mlp_data_step2.csv", [0usize, 7, 1234]), ("gpumemnet/cnn_data_step1_early.csv", [0, 3, 50])]
    {
        let ds = Dataset::load(&shared(file)).unwrap();
        for i in rows {
            let row = &ds.rows[i];
            let family = row.family;
            let Ok(want) = extract(family, row) else { continue };
            let v = features_json(&row.filename);
            let got = row_from_features(&v, file).unwrap();
            assert_eq!(got.family, family, "{file} row {i}");
            let mine = extract(family, &got).unwrap_or_else(|e| panic!("{file} row {i} ({}): {e:?}", row.filename));
            assert_eq!(mine, want, "{file} row {i}: {}", row.filename);
        }
    }
}

#[test]
fn missing_fields_are_named() {
    let e = row_from_features(&serde_json::json!({"depth": 2}), "f.json").unwrap_err().to_string();
    assert!(e.contains("f.json") && e.contains("sequence"), "{e}");
}
