//! ML estimators: GPUMemNet CSV loading, bins, feature sets and error messages.

use std::path::{Path, PathBuf};

use estimators::ml::features::{self, CNN_FEATURES, MLP_FEATURES};
use estimators::ml::{Binning, Dataset, Examples, Family, Layer, MlError, Target};

/// The shared GPUMemNet CSVs (CC BY-NC: read in place, never copied). Fails loudly if absent.
pub fn gpumemnet(file: &str) -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/data/gpumemnet").join(file);
    assert!(
        p.is_file(),
        "shared GPUMemNet data missing: {} (expected the shared checkout next to the repo)",
        p.display()
    );
    p
}

fn check_bins(b: &Binning, cases: &[(f64, Option<usize>)]) {
    for &(v, want) in cases {
        assert_eq!(b.class_of(v), want, "value {v} in {:?}", b.names);
    }
}

#[test]
fn mlp_bins_are_right_closed_1000_mib() {
    let b = Binning::gpumemnet_mlp();
    assert_eq!(b.classes(), 5);
    assert_eq!(b.names[0], "(1000, 2000]");
    assert_eq!(b.names[4], "(5000, inf]", "pandas names it this way");
    check_bins(
        &b,
        &[
            (999.0, None),
            (1000.0, None),
            (1000.5, Some(0)),
            (1443.0, Some(0)),
            (2000.0, Some(0)),
            (2000.01, Some(1)),
            (4925.0, Some(3)),
            (5000.0, Some(3)),
            (5000.5, Some(4)),
            (1e9, Some(4)),
            (f64::NAN, None),
        ],
    );
    assert_eq!(b.estimate(0), 2000.0);
    assert_eq!(b.estimate(4), 5000.0, "unbounded top bin reports its lower edge");
}

#[test]
fn cnn_bins_are_left_closed_8000_mib_and_oom_falls_in_the_top_bin() {
    let b = Binning::memory_for(Family::Cnn);
    assert_eq!(b, Binning::memory_for(Family::Transformer));
    assert_eq!(b.classes(), 6);
    check_bins(
        &b,
        &[
            (-1.0, None),
            (0.0, Some(0)),
            (7999.9, Some(0)),
            (8000.0, Some(1)),
            (39999.0, Some(4)),
            (40000.0, Some(5)),
            (estimators::ml::OOM_RELABEL_MIB, Some(5)),
            (49999.0, Some(5)),
            (50000.0, None),
        ],
    );
}

const HEADER: &str = "Filename,Depth,Activations-Params,Activation Function,Total Activations,Total Parameters,Batch Size,Max GPU Memory (MiB),Status\n";

fn cnn_csv(rows: &[&str]) -> String {
    let mut s = HEADER.to_string();
    for r in rows {
        s += r;
        s.push('\n');
    }
    s
}

#[test]
fn oom_rows_are_relabelled_42000_and_not_measured() {
    let text = cnn_csv(&[
        "a_arch:uniform_x,2,\"[('conv2d', 10, 5), ('ReLU', 10, 0)]\",ReLU,20,5,4,36831,OOM_CRASH",
        "b_arch:uniform_x,2,\"[('conv2d', 10, 5), ('ReLU', 10, 0)]\",ReLU,20,5,4,9000,SUCCESSFUL",
        "c_arch:residual_x,2,\"[('conv2d', 10, 5), ('ReLU', 10, 0)]\",ReLU,20,5,4,9000,SUCCESSFUL",
        "d_arch:uniform_x,2,\"[('conv2d', 10, 5), ('ReLU', 10, 0)]\",None,20,5,4,9000,SUCCESSFUL",
    ]);
    let ds = Dataset::from_reader(Path::new("t.csv"), text.as_bytes()).unwrap();
    let ex = Examples::build(&ds, &Target::memory(Family::Cnn)).unwrap();
    assert_eq!(ex.row_ids, vec![1, 2]);
    assert_eq!(ex.value, vec![42000.0, 9000.0]);
    assert_eq!(ex.class, vec![5, 1]);
    assert_eq!(ex.measured, vec![false, true]);
    assert_eq!(ex.excluded.values().sum::<usize>(), 2, "{:?}", ex.excluded);
}

fn check_features(file: &str, row: usize, family: Family, expect: &[f64]) {
    let ds = Dataset::load(&gpumemnet(file)).unwrap();
    let r = &ds.rows[row - 1];
    assert_eq!(r.row, row);
    assert_eq!(r.family, family);
    let got = features::extract(family, r).unwrap();
    assert_eq!(got.len(), expect.len());
    for (i, (g, e)) in got.iter().zip(expect).enumerate() {
        assert!(
            (g - e).abs() <= 1e-9 * e.abs().max(1.0),
            "{file} row {row} feature {i} ({}): got {g}, expected {e}",
            features::feature_names(family)[i]
        );
    }
}

#[test]
fn features_of_real_rows_match_hand_checked_values() {
    use std::f64::consts::PI;
    // Step 2 row 1: depth 3, batch 996, BN and dropout after both hidden layers, ReLU = index 6/11.
    let relu = 6.0 * PI / 11.0;
    check_features(
        "mlp_data_step2.csv",
        1,
        Family::Mlp,
        &[3.0, 996.0, 3560152.0, 7430.0, 2.0, 2.0, relu.sin(), relu.cos()],
    );
    // Step 2 row 2: Softplus (index 9/11), no BN, 8 dropouts.
    let softplus = 9.0 * PI / 11.0;
    check_features(
        "mlp_data_step2.csv",
        2,
        Family::Mlp,
        &[9.0, 939.0, 3639009.0, 13272.0, 0.0, 8.0, softplus.sin(), softplus.cos()],
    );
    // Step 1 has no BN/dropout columns: the counts come from the layer list (none there).
    check_features(
        "mlp_data_step1.csv",
        1,
        Family::Mlp,
        &[9.0, 717.0, 1083897.0, 3069.0, 0.0, 0.0, relu.sin(), relu.cos()],
    );
    // CNN row 1: GELU is index 1 of the 10 CNN activations; 22 conv, 0 BN, 22 dropout.
    let gelu = PI / 10.0;
    check_features(
        "cnn_data_step1_early.csv",
        1,
        Family::Cnn,
        &[22.0, 195826172.0, 195826172.0 * 62.0, 1864805.0, 62.0, 22.0, 0.0, 22.0, gelu.sin(), gelu.cos()],
    );
    assert_eq!(MLP_FEATURES.len(), 8);
    assert_eq!(CNN_FEATURES.len(), 10);
}

/// The counts parsed from `Activations-Params` agree with the count columns the CSVs carry.
#[test]
fn parsed_layer_counts_agree_with_the_csv_count_columns() {
    let check = |file: &str, cols: &[(&str, usize)]| {
        let path = gpumemnet(file);
        let mut rdr = csv::Reader::from_path(&path).unwrap();
        let headers = rdr.headers().unwrap().clone();
        let ds = Dataset::load(&path).unwrap();
        let family = ds.family().unwrap();
        for (rec, row) in rdr.records().zip(&ds.rows) {
            let rec = rec.unwrap();
            let f = features::extract(family, row);
            let Ok(f) = f else { continue };
            for &(col, feat) in cols {
                let c = headers.iter().position(|h| h == col).unwrap();
                let want: f64 = rec[c].parse().unwrap();
                assert_eq!(f[feat], want, "{file} row {} column {col}", row.row);
            }
        }
    };
    check("mlp_data_step2.csv", &[("Batch Normalization Layers", 4), ("Dropout Layers", 5)]);
    check("cnn_data_step1_early.csv", &[("Conv2d Count", 5), ("BatchNorm2d Count", 6), ("Dropout Count", 7)]);
}

#[test]
fn family_rule_convolution_makes_cnn_attention_makes_transformer() {
    let l = |k: &str| Layer { kind: k.into(), activations: 1, parameters: 1 };
    let cases: &[(&[&str], Family)] = &[
        (&["linear", "ReLU"], Family::Mlp),
        (&["linear", "batch_normalization", "dropout"], Family::Mlp),
        (&["conv2d", "linear"], Family::Cnn),
        (&["Conv1d"], Family::Cnn),
        (&["MultiheadAttention", "linear"], Family::Transformer),
        (&["conv2d", "MultiheadAttention"], Family::Transformer),
        (&["NonDynamicallyQuantizableLinear", "LayerNorm"], Family::Transformer),
    ];
    for (kinds, want) in cases {
        let layers: Vec<Layer> = kinds.iter().map(|k| l(k)).collect();
        assert_eq!(Family::from_layer_types(layers.iter().map(|l| l.kind.as_str())), *want, "{kinds:?}");
    }
}

/// GPUMemNet's `Depth` where a job's features give none, as its generators' cleaners count it:
/// a Transformer's every listed layer (its cleaner counts each Embedding, attention, Linear,
/// LayerNorm and Dropout line), a CNN's convolutions, else the linear layers.
#[test]
fn gpumemnet_depth_without_a_depth_column_counts_as_each_familys_cleaner() {
    let l = |k: &str| Layer { kind: k.into(), activations: 1, parameters: 1 };
    let cases: &[(&[&str], f64)] = &[
        (&["linear", "ReLU", "linear", "dropout"], 2.0),
        (&["conv2d", "ReLU", "conv2d", "linear"], 2.0),
        (&["Embedding", "NonDynamicallyQuantizableLinear", "Dropout", "LayerNorm", "Linear", "Linear"], 6.0),
    ];
    for (kinds, want) in cases {
        let features = estimators::features::Features {
            total_parameters: 1,
            total_activations: 1,
            batch_size: None,
            model: None,
            seq_len: None,
            input_shape: None,
            layers: kinds.iter().map(|k| l(k)).collect(),
        };
        let row = estimators::dataset::DatasetRow::unmeasured("job", features, 8, None, "ReLU");
        assert_eq!(row.gpumemnet_depth(), *want, "{kinds:?}");
    }
}

#[test]
fn real_datasets_load_with_gpumemnet_filters() {
    let step2 =
        Examples::build(&Dataset::load(&gpumemnet("mlp_data_step2.csv")).unwrap(), &Target::memory(Family::Mlp))
            .unwrap();
    assert_eq!(step2.len(), 3000);
    assert!(step2.excluded.is_empty());
    assert_eq!(step2.class_counts().iter().sum::<usize>(), 3000);
    assert_eq!(step2.class_counts()[4], 0, "no step-2 run exceeds 5000 MiB");

    let ds = Dataset::load(&gpumemnet("cnn_data_step1_early.csv")).unwrap();
    assert_eq!(ds.rows.len(), 2061);
    let cnn = Examples::build(&ds, &Target::memory(Family::Cnn)).unwrap();
    let dropped = ds
        .rows
        .iter()
        .filter(|r| r.activation == "None" || matches!(r.architecture(), Some("residual") | Some("dense")))
        .count();
    assert_eq!(cnn.len(), 2061 - dropped);
    assert_eq!(cnn.excluded.values().sum::<usize>(), dropped);
    assert!(cnn.class.iter().zip(&cnn.value).all(|(&c, &v)| c < 6 && v < 50000.0));
}

fn check_error(text: &str, expect: &[&str]) {
    let err = Dataset::from_reader(Path::new("bad.csv"), text.as_bytes())
        .and_then(|ds| Examples::build(&ds, &Target::memory(ds.family()?)))
        .err()
        .unwrap_or_else(|| panic!("malformed CSV must be rejected:\n{text}"));
    let msg = err.to_string();
    for e in expect {
        assert!(msg.contains(e), "error {msg:?} should contain {e:?}");
    }
}

#[test]
fn bad_csv_errors_name_file_row_and_column() {
    let good = "x,1,\"[('linear', 4, 20)]\",ReLU,4,20,8,1500,SUCCESSFUL";
    check_error("Filename,Depth\nx,1\n", &["bad.csv", "missing column", "Activations-Params"]);
    // (data rows under the CNN header, what the error must say)
    let cases: [(&[&str], &[&str]); 8] = [
        (
            &[good, "x,1,\"[('linear', 4, 20)]\",ReLU,4,20,eight,1500,SUCCESSFUL"],
            &["bad.csv", "row 2", "Batch Size", "\"eight\""],
        ),
        (&["x,1,\"[('linear', 4)]\",ReLU,4,20,8,1500,SUCCESSFUL"], &["row 1", "Activations-Params", "layer 0"]),
        (&["x,1,linear,ReLU,4,20,8,1500,SUCCESSFUL"], &["row 1", "Activations-Params", "expected a list"]),
        (&[good, good, "x,1,\"[('linear', 4, 20)]\",ReLU,4,20,8,1500,MAYBE"], &["row 3", "Status", "OOM_CRASH"]),
        (&["x,1,\"[('linear', 4, 20)]\",Swish,4,20,8,1500,SUCCESSFUL"], &["row 1", "Activation Function", "Swish"]),
        (&["x,1,\"[('linear', 4, 20)]\",ReLU,4,20,8,inf,SUCCESSFUL"], &["row 1", "Max GPU Memory (MiB)", "finite"]),
        (&[], &["bad.csv", "at least one data row"]),
        (&[good, "x,1,\"[('conv2d', 4, 20)]\",ReLU,4,20,8,1500,SUCCESSFUL"], &["mix model families", "mlp, cnn"]),
    ];
    for (rows, expect) in cases {
        check_error(&cnn_csv(rows), expect);
    }
    let missing = Dataset::load(Path::new("/nonexistent/gpumemnet.csv")).unwrap_err();
    assert!(matches!(missing, MlError::Io { .. }));
    assert!(missing.to_string().contains("/nonexistent/gpumemnet.csv"));
}
