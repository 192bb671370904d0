//! A job the trainer describes (`features --json`) gives the ML models the same feature vector as
//! the GPUMemNet dataset row it rebuilds.

use std::path::Path;
use std::process::Command;

use estimators::features_file::FeaturesFile;
use estimators::ml::dataset::Dataset;
use estimators::ml::features::extract;
use estimators::ml::job::row_from_features;

use crate::common::{shared, venv_python};

fn features_json(filename: &str) -> FeaturesFile {
    let out = Command::new(venv_python())
        .args(["-m", "memtrace_trainer", "features", "--gpumemnet-row", filename, "--json"])
        .output()
        .expect("run the trainer");
    assert!(out.status.success(), "features failed: {}", String::from_utf8_lossy(&out.stderr));
    let file =
        FeaturesFile::parse(&String::from_utf8(out.stdout).unwrap(), Path::new(filename)).expect("features JSON");
    assert!(file.warnings.is_empty(), "the trainer's features are read whole: {:?}", file.warnings);
    file
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
    let e = FeaturesFile::parse(r#"{"depth": 2}"#, Path::new("f.json")).unwrap_err().to_string();
    assert!(e.contains("f.json") && e.contains("total_parameters"), "{e}");
    // What only the ML features need: named when the file lacks it.
    let text = r#"{"total_parameters": 1, "total_activations": 1, "sequence": [["Linear", 1, 1]]}"#;
    let e = row_from_features(&FeaturesFile::parse(text, Path::new("f.json")).unwrap(), "f.json").unwrap_err();
    assert!(e.to_string().contains("f.json: field \"depth\""), "{e}");
}
