//! GPUMemNet CSV reading (synthetic cases and the real files in ../shared) and seeded subsets.

use std::io::Write;

use estimators::dataset::{load_gpumemnet_csv, parse_activations_params, seeded_subset};
use estimators::features::Family;

use crate::common::shared;

#[test]
fn activations_params_cells() {
    let l = parse_activations_params("[('linear', 629, 792540), ('ReLU', 629, 0)]").unwrap();
    assert_eq!(l.len(), 2);
    assert_eq!((l[0].kind.as_str(), l[0].activations, l[0].parameters), ("linear", 629, 792540));
    assert_eq!(parse_activations_params("[]").unwrap().len(), 0);
    for bad in ["('linear', 1, 2)", "[('linear', 1)]", "[('linear', x, 2)]"] {
        assert!(parse_activations_params(bad).is_err(), "{bad}");
    }
}

#[test]
fn bad_csv_names_file_row_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let check = |body: &str, needle: &str| {
        let p = dir.path().join("d.csv");
        std::fs::File::create(&p).unwrap().write_all(body.as_bytes()).unwrap();
        let e = load_gpumemnet_csv(&p).unwrap_err().to_string();
        assert!(e.contains("d.csv") && e.contains(needle), "{e:?} lacks {needle:?}");
    };
    let head = "Filename,Activations-Params,Total Activations,Total Parameters,Batch Size,Max GPU Memory (MiB)\n";
    check("Filename,Batch Size\n", "Activations-Params");
    check(&format!("{head}a,\"[('linear', 1, 2)]\",1,2,x,100\n"), "Batch Size");
    check(&format!("{head}a,\"[('linear', 1, 2)]\",1,2,4,lots\n"), "row 1");
    check(&format!("{head}a,\"oops\",1,2,4,100\n"), "Activations-Params");
}

#[test]
fn real_gpumemnet_files() {
    let check = |file: &str, rows: usize, family: Family, ooms: usize, zero_labels: usize| {
        let r = load_gpumemnet_csv(&shared(file)).unwrap();
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
