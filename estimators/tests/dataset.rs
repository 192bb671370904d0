//! GPUMemNet CSV reading (synthetic cases and the real files in ../shared) and seeded subsets.
//! One loader serves `memest compare` and the ML estimators: both see the same rows, and a bad
//! cell is the same error, naming the file, the row and the column, whoever reads it.

use std::io::Write;
use std::path::Path;

use estimators::dataset::{load, parse_activations_params, seeded_subset, DatasetRow};
use estimators::features::Family;
use estimators::ml::features::extract;
use estimators::ml::{Dataset, Examples, Target, OOM_RELABEL_MIB};

use crate::common::{shared, shared_files};

#[test]
fn activations_params_cells() {
    let l = parse_activations_params("[('linear', 629, 792540), ('ReLU', 629, 0)]").unwrap();
    assert_eq!(l.len(), 2);
    assert_eq!((l[0].kind.as_str(), l[0].activations, l[0].parameters), ("linear", 629, 792540));
    assert_eq!(parse_activations_params("[]").unwrap().len(), 0);
    for bad in ["('linear', 1, 2)", "[('linear', 1)]", "[('linear', x, 2)]"] {
        assert!(parse_activations_params(bad).is_err(), "{bad}");
    }
    // Messages name the layer and what it lacks.
    for (bad, needles) in [
        ("[('linear', 1, 2), ('ReLU', 1)]", &["layer 1", "('type', activations, params)"][..]),
        ("[(linear, 1, 2)]", &["layer 0", "quoted layer type", "linear"]),
        ("[('linear', -1, 2)]", &["layer 0", "non-negative integer activation count", "\"-1\""]),
        ("[('linear', 1, 2.5)]", &["layer 0", "non-negative integer parameter count", "\"2.5\""]),
        ("[('linear', 1, 2), ('ReLU', 1, 0]", &["layer 1", "unterminated"]),
        ("linear", &["expected a list"]),
    ] {
        let e = parse_activations_params(bad).unwrap_err();
        assert!(needles.iter().all(|n| e.contains(n)), "{bad}: {e:?} lacks one of {needles:?}");
    }
    let q = parse_activations_params("[(\"it's\", 1, 2)]").unwrap();
    assert_eq!(q[0].kind, "it's");
}

#[test]
fn bad_csv_names_file_row_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let check = |body: &str, needle: &str| {
        let p = dir.path().join("d.csv");
        std::fs::File::create(&p).unwrap().write_all(body.as_bytes()).unwrap();
        let e = load(&p, &[]).unwrap_err().to_string();
        assert!(e.contains("d.csv") && e.contains(needle), "{e:?} lacks {needle:?}");
    };
    let head = "Filename,Activations-Params,Total Activations,Total Parameters,Batch Size,Max GPU Memory (MiB)\n";
    check("Filename,Batch Size\n", "Activations-Params");
    check(&format!("{head}a,\"[('linear', 1, 2)]\",1,2,x,100\n"), "Batch Size");
    check(&format!("{head}a,\"[('linear', 1, 2)]\",1,2,4,lots\n"), "row 1");
    check(&format!("{head}a,\"oops\",1,2,4,100\n"), "Activations-Params");
}

/// The trainer's `job` column carries a run's other settings (sequence length, input shape,
/// checkpointing), so `compare` traces the job that was measured; a cell that is not an object
/// of them is refused where it is.
#[test]
fn the_job_column_carries_the_runs_other_settings() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("runs.csv");
    let head = "Filename,Activations-Params,Total Activations,Total Parameters,Batch Size,Max GPU Memory (MiB),spec,profile,job\n";
    let write = |job: &str| {
        let cell = format!("\"{}\"", job.replace('"', "\"\""));
        std::fs::write(&p, format!("{head}hf:gpt2,[],1,2,4,100,hf:gpt2,h200,{cell}\n")).unwrap();
    };
    write(r#"{"seq_len": 32, "checkpointing": "full"}"#);
    let r = &load(&p, &[]).unwrap().rows[0];
    assert_eq!(serde_json::Value::Object(r.job.clone()), serde_json::json!({"seq_len": 32, "checkpointing": "full"}));
    assert_eq!(r.profile.as_deref(), Some("h200"));
    write("");
    assert!(load(&p, &[]).unwrap().rows[0].job.is_empty());
    for (bad, says) in
        [("[32]", "expected a JSON object"), (r#"{"batch_size": 8}"#, "\"batch_size\" is a column of its own")]
    {
        write(bad);
        let e = load(&p, &[]).unwrap_err().to_string();
        assert!(e.contains("runs.csv") && e.contains("job") && e.contains(says), "{bad}: {e}");
    }
}

#[test]
fn real_gpumemnet_files() {
    let check = |file: &str, rows: usize, family: Family, ooms: usize, zero_labels: usize| {
        let r = load(&shared(file), &[]).unwrap().rows;
        assert_eq!(r.len(), rows, "{file}");
        assert!(r.iter().all(|x| x.family == family), "{file}: all {family:?}");
        assert_eq!(r.iter().filter(|x| x.real_oom).count(), ooms, "{file}");
        // Zero labels are failed measurements (kept; metrics count them as zero truth).
        assert_eq!(r.iter().filter(|x| x.truth == Some(0.0)).count(), zero_labels, "{file}");
        let min = r.iter().filter_map(|x| x.truth).filter(|t| *t > 0.0).fold(f64::INFINITY, f64::min) / 1048576.0;
        assert!(min >= 1000.0, "{file}: device-level labels include the context, min {min}");
    };
    check("gpumemnet/mlp_data_step2.csv", 3000, Family::Mlp, 0, 0);
    check("gpumemnet/cnn_data_step1_early.csv", 2061, Family::Cnn, 384, 54);
}

#[test]
fn seeded_subsets_are_reproducible() {
    let rows: Vec<u32> = (0..100).collect();
    let a = seeded_subset(&rows, 10, 7);
    assert_eq!(a, seeded_subset(&rows, 10, 7));
    assert_ne!(a, seeded_subset(&rows, 10, 8));
    assert_eq!(a.len(), 10);
    assert!(a.windows(2).all(|w| w[0] < w[1]), "file order kept");
    assert_eq!(seeded_subset(&rows, 1000, 7), rows);
}

/// Every row of every GPUMemNet CSV in ../shared: what `memest compare` reads and what the ML
/// estimators read are the same rows (layers, family, truth, OOM, row number) and the same feature
/// vectors, and agree with the file's raw cells.
#[test]
fn compare_and_ml_see_the_same_rows() {
    let files = shared_files("gpumemnet", "csv");
    assert!(files.len() >= 3, "{files:?}");
    for path in &files {
        let name = path.file_name().unwrap().to_string_lossy();
        let rows = load(path, &[]).unwrap().rows;
        let ds = Dataset::load(path).unwrap();
        assert_eq!(rows, ds.rows, "{name}");
        let family = ds.family().unwrap();
        let mut rdr = csv::Reader::from_path(path).unwrap();
        let headers = rdr.headers().unwrap().clone();
        let col = |n: &str| headers.iter().position(|h| h == n);
        let (c_ap, c_mem, c_status) =
            (col("Activations-Params").unwrap(), col("Max GPU Memory (MiB)").unwrap(), col("Status"));
        let mut n = 0;
        for (i, (rec, r)) in rdr.records().zip(&rows).enumerate() {
            let rec = rec.unwrap();
            let at = format!("{name} row {}", i + 1);
            assert_eq!(
                (r.row, r.id.clone()),
                (i + 1, format!("{}-{:05}", path.file_stem().unwrap().to_string_lossy(), i + 1)),
                "{at}"
            );
            assert_eq!(r.filename, rec[0].trim(), "{at}");
            // Layers: one per tuple of the cell; the family is the layer rule's (the generator's
            // where torchsummary listed no layer, as in 85 CNN rows).
            let tuples = rec[c_ap].matches('(').count();
            assert_eq!(r.features.layers.len(), tuples, "{at}");
            if tuples > 0 {
                assert_eq!(
                    r.family,
                    Family::from_layer_types(r.features.layers.iter().map(|l| l.kind.as_str())),
                    "{at}"
                );
            }
            assert_eq!(r.family, family, "{at}: one family per file");
            let oom = c_status.is_some_and(|c| &rec[c] == "OOM_CRASH");
            assert_eq!(r.real_oom, oom, "{at}");
            let mib: f64 = rec[c_mem].parse().unwrap();
            assert_eq!(r.truth_mib(), (!oom).then_some(mib), "{at}");
            assert_eq!(r.truth, (!oom).then_some(mib * 1048576.0), "{at}");
            if let Ok(x) = extract(family, r) {
                assert_eq!(x.len(), estimators::ml::features::feature_names(family).len(), "{at}");
            }
            n += 1;
        }
        assert_eq!(n, rows.len(), "{name}");
        // The ML memory target is the compare truth in MiB (OOM rows relabelled).
        let ex = Examples::build(&ds, &Target::memory(family)).unwrap();
        for (&id, &v) in ex.row_ids.iter().zip(&ex.value) {
            let r = &rows[id - 1];
            assert_eq!(v, if r.real_oom { OOM_RELABEL_MIB } else { r.truth_mib().unwrap() }, "{name} row {id}");
        }
    }
}

const HEAD: &str = "Filename,Depth,Activations-Params,Activation Function,Total Activations,Total Parameters,Batch Size,Max GPU Memory (MiB),Avg GPUTL,Avg SMACT,Status";
const GOOD: &str = "x_arch:uniform_y,1,\"[('linear', 4, 20), ('ReLU', 4, 0)]\",ReLU,8,20,8,1500,50,0.5,SUCCESSFUL";

fn write(dir: &Path, rows: &[&str]) -> std::path::PathBuf {
    let p = dir.join("bad.csv");
    std::fs::write(&p, format!("{HEAD}\n{}\n", rows.join("\n"))).unwrap();
    p
}

/// A malformed cell is one error, naming the file, the data row and the column, from compare's
/// loader and the ML dataset alike; cells only the ML feature sets need are checked only there.
#[test]
fn malformed_cells_name_file_row_and_column_for_every_consumer() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&str, &str, &str, &[&str]); 15] = [
        (
            "\"[('linear', 4, 20), ('ReLU', 4, 0)]\"",
            "\"[('linear', 4, 20), (ReLU, 4, 0)]\"",
            "Activations-Params",
            &["layer 1", "quoted"],
        ),
        (
            "\"[('linear', 4, 20), ('ReLU', 4, 0)]\"",
            "\"[('linear', -4, 20)]\"",
            "Activations-Params",
            &["layer 0", "non-negative"],
        ),
        (",SUCCESSFUL", ",MAYBE", "Status", &["SUCCESSFUL or OOM_CRASH", "\"MAYBE\""]),
        (",SUCCESSFUL", ",", "Status", &["SUCCESSFUL or OOM_CRASH"]),
        ("_y,1,", "_y,deep,", "Depth", &["\"deep\""]),
        (",0.5,", ",lots,", "Avg SMACT", &["\"lots\""]),
        (",8,20,8,", ",8,20.5,8,", "Total Parameters", &["whole number", "\"20.5\""]),
        (",20,8,1500,", ",20,,1500,", "Batch Size", &["whole number"]),
        // Past u64 (saturated to u64::MAX through f64) and past 2^53 as a float (rounded).
        (",8,20,8,", ",8,18446744073709551616,8,", "Total Parameters", &["<= 18446744073709551615"]),
        (",8,20,8,", ",8,1e300,8,", "Total Parameters", &["whole number", "\"1e300\""]),
        (",8,20,8,", ",8,9007199254740993.0,8,", "Total Parameters", &["2^53"]),
        (",8,20,8,", ",8,4503599627370495.7,8,", "Total Parameters", &["whole number"]),
        (",8,20,8,1500,", ",8,20,1e20,1500,", "Batch Size", &["whole number", "\"1e20\""]),
        (",8,1500,", ",8,-3,", "Max GPU Memory (MiB)", &["finite number of MiB", "\"-3\""]),
        (",8,1500,", ",8,inf,", "Max GPU Memory (MiB)", &["finite"]),
    ];
    for (from, to, column, needles) in cases {
        let bad = GOOD.replacen(from, to, 1);
        assert_ne!(bad, GOOD, "{from:?} not in the good row");
        let p = write(dir.path(), &[GOOD, &bad]);
        let compare = load(&p, &[]).unwrap_err().to_string();
        let ml = Dataset::load(&p).unwrap_err().to_string();
        assert_eq!(compare, ml, "one loader, one message");
        for n in ["bad.csv", "row 2", &format!("column {column:?}")].iter().copied().chain(needles.iter().copied()) {
            assert!(compare.contains(n), "{to:?}: {compare:?} lacks {n:?}");
        }
    }
    // Integers past 2^53 are read exactly as digits, and exact whole floats within it as floats.
    let exact = [
        (",8,9007199254740993,8,", 9_007_199_254_740_993u64),
        (",8,2e1,8,", 20),
        (",8,20.000,8,", 20),
        (",8,0.2e2,8,", 20),
        (",8,+2E+1,8,", 20),
        (",8,0e5,8,", 0),
        (",8,9007199254740992.0,8,", 1 << 53),
    ];
    for (to, params) in exact {
        let p = write(dir.path(), &[GOOD, &GOOD.replacen(",8,20,8,", to, 1)]);
        assert_eq!(load(&p, &[]).unwrap().rows[1].features.total_parameters, params, "{to}");
    }
    // Depth and Activation Function may be empty for compare (the trainer's rows of other models);
    // the ML feature sets need them.
    for (from, to, column) in [("_y,1,", "_y,,", "Depth"), (",ReLU,", ",,", "Activation Function")] {
        let p = write(dir.path(), &[GOOD, &GOOD.replacen(from, to, 1)]);
        let rows = load(&p, &[]).unwrap().rows;
        assert_eq!((rows[1].depth.is_none(), rows[1].activation.is_empty()), (column == "Depth", column != "Depth"));
        let ml = Dataset::load(&p).unwrap_err().to_string();
        assert!(ml.contains("bad.csv") && ml.contains("row 2") && ml.contains(column) && ml.contains("empty"), "{ml}");
    }
    // A missing column is named with the header row (row 0).
    let p = dir.path().join("bad.csv");
    std::fs::write(&p, format!("{}\n", HEAD.replace(",Depth", ""))).unwrap();
    // A header alone is no dataset: compare wrote an empty report from it, and exited 0.
    let empty = load(&p, &[]).unwrap_err().to_string();
    assert!(empty.contains("bad.csv") && empty.contains("at least one data row"), "{empty}");
    let ml = Dataset::load(&p).unwrap_err().to_string();
    assert!(
        ml.contains("bad.csv") && ml.contains("row 0") && ml.contains("\"Depth\"") && ml.contains("missing column"),
        "{ml}"
    );
}

/// DCGM columns: -1 (no sample) and an empty cell are no value; the ML view and compare's row
/// are one value.
#[test]
fn utilization_minus_one_is_no_sample() {
    let dir = tempfile::tempdir().unwrap();
    let rows = [GOOD.to_string(), GOOD.replacen(",50,0.5,", ",-1,-1,", 1), GOOD.replacen(",50,0.5,", ",,0,", 1)];
    let p = write(dir.path(), &rows.iter().map(String::as_str).collect::<Vec<_>>());
    let r: Vec<DatasetRow> = load(&p, &[]).unwrap().rows;
    let got: Vec<(Option<f64>, Option<f64>, Option<f64>)> =
        r.iter().map(|r| (r.util.gputl, r.util.smact, r.util.smocc)).collect();
    assert_eq!(got, vec![(Some(50.0), Some(0.5), None), (None, None, None), (None, Some(0.0), None)]);
    assert_eq!(Dataset::load(&p).unwrap().rows, r);
}

/// A column no format read here has (a misspelt one is never read: `Status` renamed made every
/// OOM crash a measured peak) is said, and so is no `Status` beside rows that are not MLPs;
/// GPUMemNet's own files, the MLP ones without `Status`, draw no warning.
#[test]
fn unknown_columns_and_a_missing_status_are_said() {
    for path in shared_files("gpumemnet", "csv") {
        let loaded = load(&path, &[]).unwrap();
        assert!(loaded.warnings.is_empty(), "{}: {:?}", path.display(), loaded.warnings);
        assert!(Dataset::load(&path).unwrap().warnings.is_empty());
    }
    let dir = tempfile::tempdir().unwrap();
    // The CNN file's first 50 rows (OOM crashes among them), its Status column renamed.
    let text = std::fs::read_to_string(shared("gpumemnet/cnn_data_step1_early.csv")).unwrap();
    let head: Vec<&str> = text.lines().take(51).collect();
    assert!(head.iter().any(|l| l.ends_with(",OOM_CRASH")));
    let renamed = dir.path().join("renamed.csv");
    std::fs::write(&renamed, head.join("\n").replacen(",Status", ",status", 1) + "\n").unwrap();
    let w = load(&renamed, &[]).unwrap().warnings;
    assert_eq!(w.len(), 2, "{w:?}");
    assert!(w[0].contains("column \"status\" (did you mean \"Status\"?) of no dataset format read here"), "{w:?}");
    assert!(w[1].contains("renamed.csv: no `Status` column (nor the trainer's `oom`)"), "{w:?}");
    assert_eq!(Dataset::load(&renamed).unwrap().warnings, w, "one loader, one warning");
    // GOOD's MLP rows without Status, one column misspelt and one of no format.
    let mlp = dir.path().join("mlp.csv");
    let head = HEAD.replace(",Status", "").replace("Avg SMACT", "Avg SMACTT") + ",Extra";
    std::fs::write(&mlp, format!("{head}\n{}\n", GOOD.replace(",SUCCESSFUL", ",1"))).unwrap();
    let w = load(&mlp, &[]).unwrap().warnings;
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(
        w[0].contains("columns \"Avg SMACTT\", \"Extra\" of no dataset format read here: their cells are ignored"),
        "{w:?}"
    );
}

/// Rows that repeat an earlier row cell for cell are said once, with their count and the first
/// rows, by the one loader compare and ml share (they were scored and trained on twice in silence).
#[test]
fn repeated_rows_are_said_once() {
    let dir = tempfile::tempdir().unwrap();
    let other = GOOD.replacen(",8,1500,", ",8,1600,", 1);
    let p = write(dir.path(), &[GOOD, &other, GOOD, GOOD]);
    let w = load(&p, &[]).unwrap().warnings;
    let said: Vec<&String> = w.iter().filter(|w| w.contains("repeat an earlier row")).collect();
    assert_eq!(said.len(), 1, "{w:?}");
    assert!(
        said[0].contains("bad.csv: 2 rows repeat") && said[0].contains("row 3 repeats row 1, row 4 repeats row 1"),
        "{said:?}"
    );
    assert_eq!(Dataset::load(&p).unwrap().warnings, w, "one loader, one warning");
    let p = write(dir.path(), &[GOOD, &other]);
    assert!(!load(&p, &[]).unwrap().warnings.iter().any(|w| w.contains("repeat")));
}

/// A measured peak past any device (1e12 MiB) is refused for compare, naming the file, row and
/// column: it was scored, and outweighed every other row.
#[test]
fn a_peak_past_any_device_is_refused_for_compare() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(dir.path(), &[GOOD, &GOOD.replacen(",8,1500,", ",8,1e12,", 1)]);
    let rows = load(&p, &[]).unwrap().rows;
    let err = estimators::dataset::refuse_past_any_device(&p, &rows).unwrap_err().to_string();
    assert!(err.contains("bad.csv: row 2: column \"Max GPU Memory (MiB)\"") && err.contains("256 TiB"), "{err}");
    assert!(estimators::dataset::refuse_past_any_device(&p, &rows[..1]).is_ok());
}
