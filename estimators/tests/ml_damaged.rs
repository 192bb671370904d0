//! ML model files damaged by hand: every body whose indices or shapes would panic, loop or
//! answer nonsense at prediction is refused when loaded, naming the file and the field.

use estimators::ml::modelfile::{ModelFile, LICENCE_NOTE};
use estimators::ml::{MlError, ModelKind};
use serde_json::{json, Value};

use crate::ml_models::{fast_config, synthetic};

/// One damage: the model kind trained, the JSON pointer edited, its new value (`None`: the
/// value is taken from another pointer of the same file), and words the error must hold.
struct Damage {
    kind: ModelKind,
    at: &'static str,
    value: Value,
    copy_from: Option<&'static str>,
    field: &'static str,
    says: &'static str,
}

fn cases() -> Vec<Damage> {
    let d = |kind, at, value, field, says| Damage { kind, at, value, copy_from: None, field, says };
    vec![
        d(
            ModelKind::LinearReg,
            "/pipeline/model/model/columns/1",
            json!(99),
            "pipeline.model.model.columns",
            "column 99",
        ),
        d(
            ModelKind::LinearReg,
            "/pipeline/model/model/columns",
            json!([0, 1]),
            "pipeline.model.model.columns",
            "expected rising columns, one per coefficient",
        ),
        d(
            ModelKind::Tree,
            "/pipeline/model/model/trees/0/nodes/0/Split/feature",
            json!(99),
            "pipeline.model.model",
            "feature 99",
        ),
        d(
            ModelKind::Tree,
            "/pipeline/model/model/trees/0/nodes/0/Split/left",
            json!(999),
            "pipeline.model.model",
            "child 999",
        ),
        // A child pointing back at its parent: the walk never reached a leaf.
        d(
            ModelKind::Tree,
            "/pipeline/model/model/trees/0/nodes/0/Split/left",
            json!(0),
            "pipeline.model.model",
            "child 0",
        ),
        d(ModelKind::Forest, "/pipeline/model/model/trees", json!([]), "pipeline.model.model", "no trees"),
        d(
            ModelKind::Tree,
            "/pipeline/model/model/trees/0/nodes",
            json!([{"Leaf": [1.0]}]),
            "pipeline.model.model",
            "a leaf of 1 value: expected 5",
        ),
        d(ModelKind::Tree, "/pipeline/scaler/std/data/0", json!(0.0), "pipeline.scaler.std", "deviation 0 is 0"),
        d(ModelKind::LinearReg, "/pipeline/scaler/std/data/3", json!(-1.0), "pipeline.scaler.std", "deviation 3 is -1"),
        d(ModelKind::MlpEnsemble, "/pipeline/model/model/members", json!([]), "pipeline.model.model", "no members"),
        // perpetual's boosters index their node maps and the row unchecked.
        d(
            ModelKind::GbmReg,
            "/pipeline/model/model/trees/0/nodes/0/split_feature",
            json!(99),
            "pipeline.model.model",
            "trees[0].nodes[0]: splits on feature 99",
        ),
        d(
            ModelKind::GbmReg,
            "/pipeline/model/model/trees/0/nodes/0/left_child",
            json!(0),
            "pipeline.model.model",
            "trees[0].nodes[0]: reached twice",
        ),
        d(
            ModelKind::GbmReg,
            "/pipeline/model/model/trees/0/nodes/0/right_child",
            json!(999),
            "pipeline.model.model",
            "trees[0].nodes[999]: no such node",
        ),
        d(
            ModelKind::Gbm,
            "/pipeline/model/model/booster/boosters/0/trees/0/nodes/0/split_feature",
            json!(99),
            "pipeline.model.model.booster",
            "boosters[0].trees[0].nodes[0]: splits on feature 99",
        ),
        d(ModelKind::Logistic, "/pipeline/model/model/classes", json!([0]), "pipeline.model.model", "and 1 classes"),
        d(
            ModelKind::Logistic,
            "/pipeline/model/model/classes/0",
            json!(99),
            "pipeline.model.model.classes",
            "expected each class below",
        ),
        Damage {
            kind: ModelKind::MlpEnsemble,
            at: "/pipeline/model/model/members/0/out",
            value: Value::Null,
            copy_from: Some("/pipeline/model/model/members/0/hidden/0/0"),
            field: "pipeline.model.model",
            says: "members[0].out",
        },
    ]
}

#[test]
fn damaged_model_bodies_are_refused_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let ex = synthetic(120, 3);
    for (i, case) in cases().into_iter().enumerate() {
        let file = ModelFile::train(&ex, case.kind, &fast_config(), "synthetic", LICENCE_NOTE).unwrap();
        let mut json = serde_json::to_value(&file).unwrap();
        let value = match case.copy_from {
            Some(from) => json.pointer(from).unwrap_or_else(|| panic!("case {i}: no {from}")).clone(),
            None => case.value.clone(),
        };
        *json.pointer_mut(case.at).unwrap_or_else(|| panic!("case {i}: no {}", case.at)) = value;
        let path = dir.path().join(format!("damaged-{i}.json"));
        std::fs::write(&path, json.to_string()).unwrap();
        match ModelFile::load(&path) {
            Err(e @ MlError::ModelFileField { field, .. }) => {
                let text = e.to_string();
                assert_eq!(field, case.field, "case {i} ({}): {text}", case.at);
                assert!(text.contains(&path.display().to_string()), "case {i}: the file is not named: {text}");
                assert!(text.contains(case.says), "case {i} ({}): {text:?} lacks {:?}", case.at, case.says);
            }
            other => panic!(
                "case {i} ({} = {:?}): expected a field error, got {:?}",
                case.at,
                case.value,
                other.map(|_| "a file that loaded")
            ),
        }
    }
}

#[test]
fn undamaged_model_files_still_load() {
    let dir = tempfile::tempdir().unwrap();
    let ex = synthetic(120, 3);
    for kind in [ModelKind::LinearReg, ModelKind::Tree, ModelKind::Forest, ModelKind::MlpEnsemble, ModelKind::Gbm] {
        let file = ModelFile::train(&ex, kind, &fast_config(), "synthetic", LICENCE_NOTE).unwrap();
        let path = dir.path().join(format!("{}.json", kind.name()));
        file.save(&path).unwrap();
        let back = ModelFile::load(&path).unwrap_or_else(|e| panic!("{}: {e}", kind.name()));
        back.predict(&ex.x).unwrap();
    }
}
