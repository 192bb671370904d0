//! `memest compare` on the trainer's `dataset` output and with ML model files: rows rebuilt from
//! their own spec/optimizer/AMP, truth read from the right columns, ML applied per family and never
//! silently to its own training rows.

use std::path::{Path, PathBuf};

use estimators::dataset::{load, Spec};
use estimators::features::Family;
use estimators::ml::dataset::Dataset;
use estimators::ml::features::extract;

use crate::common::{shared, venv_python};
use crate::support::{memest, memest_compare, metrics_json, records};

const MIB: f64 = 1024.0 * 1024.0;

const CNN_SPEC: &str = r#"synthetic:{"family":"cnn","input_channels":3,"num_classes":10,"depth":2,"architecture":"uniform","base_filters":8,"input_size":16}"#;
const MLP_SPEC: &str = r#"synthetic:{"family":"mlp","input_size":64,"output_size":10,"depth":3}"#;
const GM_FILE: &str = "input:2346_output:197_depth:2_arch:pyramid_batch:996_act:relu_dropout:0.3382392352475416_dropout:True_batchnorm:True.out";

/// Three rows as `python -m memtrace_trainer dataset --include-cpu` wrote them for CPU runs of
/// these models (`run --device cpu`), with GPU labels then written by hand: the CNN row has an
/// NVML peak (1100 MiB) that differs from `Max GPU Memory` (1000) and an allocator peak (20 MiB);
/// the GPUMemNet row has only `Max GPU Memory` (1500); the synthetic MLP row has no label at all.
fn trainer_csv(dir: &Path) -> PathBuf {
    let q = |s: &str| format!("\"{}\"", s.replace('"', "\"\""));
    let head = "Filename,Depth,Activations-Params,Activation Function,Total Activations,Total Parameters,Batch Size,Batch Normalization Layers,Dropout Layers,Conv2d Count,BatchNorm2d Count,Dropout Count,AdaptiveAvgPool2d Count,Linear Count,Max GPU Memory (MiB),Status,run_id,spec,family,optimizer,amp,max_memory_reserved_mib,max_memory_allocated_mib,device_peak_mib,device_peak_source,oom,step_time_s,device,gpu,torch,cuda,profile";
    let cnn = format!(
        "{},2,\"[('conv2d', 2048, 224), ('ReLU', 2048, 0), ('conv2d', 2048, 584), ('ReLU', 2048, 0), ('adaptive_avg_pool2d', 8, 0), ('linear', 10, 90), ('softmax', 10, 0)]\",ReLU,8220,898,2,,,2,0,0,1,1,1000.0,SUCCESSFUL,cnn-run,{},cnn,sgd,bf16,20.0,5.0,1100.0,nvml-process,false,0.17,cuda,NVIDIA A100-SXM4-40GB,2.15.0+cu132,13.2,a100-40gb",
        q(CNN_SPEC),
        q(CNN_SPEC)
    );
    let gm = format!(
        "{GM_FILE},3,\"[('linear', 1173, 2753031), ('batch_normalization', 1173, 2346), ('ReLU', 1173, 0), ('dropout', 1173, 0), ('linear', 586, 687964), ('batch_normalization', 586, 1172), ('ReLU', 586, 0), ('dropout', 586, 0), ('linear', 197, 115639), ('Softmax', 197, 0)]\",ReLU,7430,3560152,8,2,2,,,,,,1500.0,SUCCESSFUL,gm-run,gpumemnet:{GM_FILE},mlp,adam,fp32,,,,,false,0.45,cuda,,2.15.0+cu132,13.2,"
    );
    let mlp = format!(
        "{},4,\"[('linear', 32, 2080), ('ReLU', 32, 0), ('linear', 16, 528), ('ReLU', 16, 0), ('linear', 10, 170), ('ReLU', 10, 0), ('linear', 10, 110), ('Softmax', 10, 0)]\",ReLU,136,2888,4,0,0,,,,,,,SUCCESSFUL,mlp-run,{},mlp,adam,fp32,,,,,false,0.07,cpu,,2.15.0+cu132,13.2,",
        q(MLP_SPEC),
        q(MLP_SPEC)
    );
    let p = dir.join("dataset.csv");
    std::fs::write(&p, format!("{head}\n{cnn}\n{gm}\n{mlp}\n")).unwrap();
    p
}

/// What one trainer row must become: spec, optimizer, amp, truth column and values (MiB).
struct Expect {
    spec: Spec,
    family: Family,
    optimizer: Option<&'static str>,
    amp: Option<&'static str>,
    truth_mib: Option<f64>,
    truth_column: &'static str,
    reserved_mib: Option<f64>,
}

#[test]
fn trainer_rows_keep_spec_settings_and_label_columns() {
    let dir = tempfile::tempdir().unwrap();
    let rows = load(&trainer_csv(dir.path()), &[]).unwrap().rows;
    let check = |i: usize, e: Expect| {
        let r = &rows[i];
        assert_eq!(r.spec, e.spec, "row {i}");
        assert_eq!(r.family, e.family, "row {i}");
        assert_eq!(r.optimizer.as_deref(), e.optimizer, "row {i}");
        assert_eq!(r.amp.as_deref(), e.amp, "row {i}");
        assert_eq!(r.truth, e.truth_mib.map(|m| m * MIB), "row {i}");
        assert_eq!(r.truth_column, e.truth_column, "row {i}");
        assert_eq!(r.reserved_truth, e.reserved_mib.map(|m| m * MIB), "row {i}");
    };
    assert_eq!(rows.len(), 3);
    check(
        0,
        Expect {
            spec: Spec::Model(CNN_SPEC.into()),
            family: Family::Cnn,
            optimizer: Some("sgd"),
            amp: Some("bf16"),
            truth_mib: Some(1100.0),
            truth_column: "device_peak_mib",
            reserved_mib: Some(20.0),
        },
    );
    check(
        1,
        Expect {
            spec: Spec::Model(format!("gpumemnet:{GM_FILE}")),
            family: Family::Mlp,
            optimizer: Some("adam"),
            amp: None,
            truth_mib: Some(1500.0),
            truth_column: "Max GPU Memory (MiB)",
            reserved_mib: None,
        },
    );
    check(
        2,
        Expect {
            spec: Spec::Model(MLP_SPEC.into()),
            family: Family::Mlp,
            optimizer: Some("adam"),
            amp: None,
            truth_mib: None,
            truth_column: "Max GPU Memory (MiB)",
            reserved_mib: None,
        },
    );
    assert_eq!(Spec::parse("mypkg.train:make"), Spec::Entry("mypkg.train:make".into()));
    assert_eq!(Spec::parse("hf:gpt2"), Spec::Model("hf:gpt2".into()));
}

#[test]
fn trainer_row_bad_cells_name_file_row_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let good = std::fs::read_to_string(trainer_csv(dir.path())).unwrap();
    let check = |from: &str, to: &str, column: &str| {
        let p = dir.path().join("bad.csv");
        std::fs::write(&p, good.replacen(from, to, 1)).unwrap();
        let e = load(&p, &[]).unwrap_err().to_string();
        assert!(e.contains("bad.csv") && e.contains("row 1") && e.contains(column), "{e}");
    };
    check(",cnn,sgd,", ",cnn,nesterov,", "optimizer");
    check(",sgd,bf16,", ",sgd,int4,", "amp");
    check(",1100.0,nvml", ",lots,nvml", "device_peak_mib");
    check(",bf16,20.0,", ",bf16,-3,", "max_memory_reserved_mib");
    check(",nvml-process,false,", ",nvml-process,maybe,", "oom");
    // The file itself parses: only the edited cell is at fault.
    assert_eq!(load(&trainer_csv(dir.path()), &[]).unwrap().rows.len(), 3);
}

/// The GPUMemNet row of the trainer's dataset gives exactly the ML feature vector of the same row
/// in GPUMemNet's own CSV (at the trainer run's batch size): compare's `ml` sees what the model
/// was trained on.
#[test]
fn trainer_row_has_the_gpumemnet_feature_vector() {
    let dir = tempfile::tempdir().unwrap();
    let rows = load(&trainer_csv(dir.path()), &[]).unwrap().rows;
    let ours = extract(Family::Mlp, &rows[1]).unwrap();
    let theirs = Dataset::load(&shared("gpumemnet/mlp_data_step2.csv")).unwrap();
    let mut row = theirs.rows.into_iter().find(|r| r.filename == GM_FILE).expect("row in the step-2 CSV");
    row.batch = 8;
    assert_eq!(ours, extract(Family::Mlp, &row).unwrap());
    assert_eq!(rows[1].family, Family::Mlp);
    assert_eq!(rows[0].family, Family::Cnn);
}

/// A tree classifier trained on the first 240 rows of the step-2 MLP CSV (excerpt in `dir`).
fn mlp_model(dir: &Path) -> (PathBuf, PathBuf) {
    let text = std::fs::read_to_string(shared("gpumemnet/mlp_data_step2.csv")).unwrap();
    let excerpt = dir.join("excerpt.csv");
    std::fs::write(&excerpt, text.lines().take(241).collect::<Vec<_>>().join("\n")).unwrap();
    let model = dir.join("tree.json");
    let (e, m) = (excerpt.to_str().unwrap(), model.to_str().unwrap());
    let (ok, _, err) = memest(&["ml", "train", "--dataset", e, "--family", "mlp", "--model", "tree", "--out", m]);
    assert!(ok, "{err}");
    (excerpt, model)
}

fn group<'a>(metrics: &'a serde_json::Value, est: &str, level: &str) -> &'a serde_json::Value {
    metrics
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["estimator"] == est && g["level"] == level && g["group"] == "all")
        .unwrap_or_else(|| panic!("no {est}/{level} group in {metrics}"))
}

#[test]
fn compare_on_trainer_dataset_rebuilds_specs_and_scores_both_levels() {
    venv_python();
    let dir = tempfile::tempdir().unwrap();
    let data = trainer_csv(dir.path());
    let (_, model) = mlp_model(dir.path());
    let out = dir.path().join("cmp");
    let (ok, stdout, err) = memest_compare(&data, &out, &["--ml-model", model.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert!(stdout.contains("symbolic (reserved)"), "{stdout}");
    assert!(err.contains("1 of the 3 rows have no measured peak (truth): estimated, not scored"), "{err}");
    let recs = records(&out);
    let specs: Vec<&str> = recs.iter().map(|r| r["spec"].as_str().unwrap()).collect();
    assert_eq!(specs, [CNN_SPEC.to_string(), format!("gpumemnet:{GM_FILE}"), MLP_SPEC.to_string()]);
    // The trainer traced each row with the row's own settings.
    let header = |id: &str| -> serde_json::Value {
        let t = std::fs::read_to_string(out.join("traces").join(format!("{id}.jsonl"))).unwrap();
        serde_json::from_str(t.lines().next().unwrap()).unwrap()
    };
    let cnn_meta = &header(recs[0]["id"].as_str().unwrap())["metadata"];
    assert_eq!((cnn_meta["optimizer"].as_str(), cnn_meta["amp"].as_str()), (Some("sgd"), Some("bf16")), "{cnn_meta}");
    assert_eq!(header(recs[1]["id"].as_str().unwrap())["metadata"]["batch_size"], "8");
    // Truth: NVML peak over `Max GPU Memory`; the allocator peak separately; none for the CPU row.
    let truth: Vec<Option<f64>> = recs.iter().map(|r| r["truth_bytes"].as_f64()).collect();
    assert_eq!(truth, [Some(1100.0 * MIB), Some(1500.0 * MIB), None]);
    assert_eq!(recs[0]["reserved_truth_bytes"].as_f64(), Some(20.0 * MIB));
    for r in &recs {
        let sym = &r["estimates"]["symbolic"];
        assert!(sym["device_bytes"].as_u64().is_some_and(|b| b > 0), "{sym}");
    }
    let metrics = metrics_json(&out);
    // Device level scores the two labelled rows; its MRE is the median of their relative errors.
    let dev = group(&metrics, "symbolic", "device");
    assert_eq!((dev["metrics"]["runs"].as_u64(), dev["unlabelled"].as_u64()), (Some(2), Some(1)));
    let rel = |i: usize, level: &str, truth: f64| {
        (recs[i]["estimates"]["symbolic"][level].as_f64().unwrap() - truth).abs() / truth
    };
    let expect = (rel(0, "device_bytes", 1100.0 * MIB) + rel(1, "device_bytes", 1500.0 * MIB)) / 2.0;
    assert!((dev["metrics"]["mre"].as_f64().unwrap() - expect).abs() < 1e-9, "{dev}");
    // Reserved level: only the CNN row has `max_memory_reserved_mib`.
    let res = group(&metrics, "symbolic", "reserved");
    assert_eq!((res["metrics"]["runs"].as_u64(), res["unlabelled"].as_u64()), (Some(1), Some(2)));
    assert!((res["metrics"]["mre"].as_f64().unwrap() - rel(0, "reserved_bytes", 20.0 * MIB)).abs() < 1e-9);
    // ML: the MLP model answers the MLP rows; the CNN row is null with the reason.
    let ml: Vec<&serde_json::Value> = recs.iter().map(|r| &r["estimates"]["ml"]).collect();
    assert!(
        ml[0]["device_bytes"].is_null() && ml[0]["error"].as_str().unwrap().contains("no ML model for family cnn"),
        "{}",
        ml[0]
    );
    assert!(ml[1]["device_bytes"].as_u64().is_some() && ml[2]["device_bytes"].as_u64().is_some());
    assert_eq!(group(&metrics, "ml", "device")["metrics"]["estimated"].as_u64(), Some(1), "one labelled MLP row");
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(report.contains("symbolic (reserved)") && report.contains("not a held-out result"), "{report}");
    let csv = std::fs::read_to_string(out.join("runs.csv")).unwrap();
    assert!(csv.lines().next().unwrap().contains("ml_mib") && csv.contains("reserved_truth_mib"));
}

#[test]
fn ml_is_not_scored_on_its_own_training_rows_unless_asked() {
    venv_python();
    let dir = tempfile::tempdir().unwrap();
    let (excerpt, model) = mlp_model(dir.path());
    let out = dir.path().join("cmp");
    let compare_ml = |data: &Path, extra: &[&str]| {
        let mut v = vec!["--limit", "2", "--no-fake-tensor", "--reuse-traces", "--ml-model", model.to_str().unwrap()];
        v.extend_from_slice(extra);
        memest_compare(data, &out, &v)
    };
    let run = |extra: &[&str]| {
        let (ok, _, err) = compare_ml(&excerpt, extra);
        assert!(ok, "{err}");
        err
    };
    let err = run(&[]);
    assert!(err.contains("trained on them"), "{err}");
    for r in records(&out) {
        let e = r["estimates"]["ml"]["error"].as_str().unwrap_or_default().to_string();
        assert!(e.contains("training row"), "{e}");
    }
    let err = run(&["--ml-include-training-rows"]);
    assert!(err.contains("memest: warning: ml on") && err.contains("in-sample"), "{err}");
    for r in records(&out) {
        assert!(r["estimates"]["ml"]["device_bytes"].as_u64().is_some(), "{r}");
    }
    assert!(std::fs::read_to_string(out.join("report.md")).unwrap().contains("in-sample"));
    // The same rows under another name: known by what they hold (the name was the evidence once).
    let copy = dir.path().join("renamed.csv");
    std::fs::copy(&excerpt, &copy).unwrap();
    let (ok, _, err) = compare_ml(&copy, &[]);
    assert!(ok && err.contains("memest: warning: ml is null on 2 rows of") && err.contains("trained on them"), "{err}");
    for r in records(&out) {
        let e = r["estimates"]["ml"]["error"].as_str().unwrap_or_default().to_string();
        assert!(e.contains("training row"), "renamed copy: {e}");
    }
}

#[test]
fn compare_on_a_cluster_backend_scores_what_the_local_backend_scores() {
    // `--backend slurm` through submitit's in-process executor: the same array code a Slurm
    // cluster runs, with the trainer's answers read back exactly as from a local process.
    venv_python();
    let dir = tempfile::tempdir().unwrap();
    let data = trainer_csv(dir.path());
    let mut estimates = Vec::new();
    for backend in [&["--backend", "local"][..], &["--backend", "slurm", "--submitit-cluster", "debug", "--jobs", "2"]]
    {
        let out = dir.path().join(backend[1]);
        let (ok, _, err) = memest_compare(&data, &out, backend);
        assert!(ok, "{err}");
        let recs = records(&out);
        estimates.push(recs.iter().map(|r| r["estimates"]["symbolic"]["device_bytes"].clone()).collect::<Vec<_>>());
        if backend[1] == "slurm" {
            assert!(out.join("traces/submitit").is_dir(), "the array's submitit folder");
        }
    }
    assert_eq!(estimates[0], estimates[1]);
    assert!(estimates[0].iter().all(|v| v.as_f64().is_some()), "{:?}", estimates[0]);
    let (ok, _, err) = memest_compare(&data, &dir.path().join("x"), &["--partition", "gpu"]);
    assert!(ok && err.contains("--partition has no effect without --backend slurm"), "{err}");
}

/// A trainer row is traced with the settings its run had (`job`), and a row measured on another
/// GPU than --profile is said to be: `compare` scored gpt2 at its default sequence against a
/// run at 32, and an H200 run as an A100's, in silence.
#[test]
fn compare_traces_the_job_that_was_run() {
    venv_python();
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("runs.csv");
    let spec = r#"synthetic:{""family"":""mlp"",""input_size"":16,""output_size"":4,""depth"":2}"#;
    std::fs::write(
        &csv,
        format!(
            "Filename,Activations-Params,Total Activations,Total Parameters,Batch Size,Max GPU Memory (MiB),spec,\
             optimizer,profile,job\n\"{spec}\",[],1,2,4,500,\"{spec}\",adam,h200,\"{{\"\"grad_accum\"\": 2}}\"\n"
        ),
    )
    .unwrap();
    let out = dir.path().join("cmp");
    let compare = |extra: &[&str]| {
        let mut args = vec!["--no-fake-tensor"];
        args.extend_from_slice(extra);
        let (ok, _, err) = memest_compare(&csv, &out, &args);
        assert!(ok, "{err}");
        err
    };
    let err = compare(&[]);
    assert!(!err.contains("the trainer gave"), "{err}");
    assert!(err.contains("1 of the 1 rows were measured on another GPU than --profile a100-40gb (1 on h200"), "{err}");
    let configs = std::fs::read_to_string(out.join("traces/configs.jsonl")).unwrap();
    let config: serde_json::Value = serde_json::from_str(configs.lines().next().unwrap()).unwrap();
    assert_eq!(config["grad_accum"], 2, "{configs}");
    let trace = std::fs::read_to_string(out.join("traces/runs-00001.jsonl")).unwrap();
    let header: serde_json::Value = serde_json::from_str(trace.lines().next().unwrap()).unwrap();
    assert_eq!(header["metadata"]["grad_accum"], "2", "{header}");
    // Reused as long as the row's settings are the trace's; traced again once they are not.
    let err = compare(&["--reuse-traces"]);
    assert!(!err.contains("traced again"), "{err}");
    let text = std::fs::read_to_string(&csv).unwrap().replace("\": 2}", "\": 3}");
    std::fs::write(&csv, text).unwrap();
    let err = compare(&["--reuse-traces"]);
    assert!(err.contains("traced again") && err.contains(r#"job {"grad_accum":2}, not {"grad_accum":3}"#), "{err}");
    let trace = std::fs::read_to_string(out.join("traces/runs-00001.jsonl")).unwrap();
    let header: serde_json::Value = serde_json::from_str(trace.lines().next().unwrap()).unwrap();
    assert_eq!(header["metadata"]["grad_accum"], "3", "{header}");
    // A setting the model has no use for is said, as the trainer says it of a batch line's field.
    let text = std::fs::read_to_string(&csv).unwrap().replace("\": 3}", "\": 3, \"\"seq_len\"\": 32}");
    std::fs::write(&csv, text).unwrap();
    let err = compare(&[]);
    assert!(err.contains("the trainer gave 1 warnings") && err.contains("field 'seq_len' 32 has no effect"), "{err}");
    // A GPU no profile is known of: `dataset` leaves `profile` empty and names it in `gpu`.
    let text = std::fs::read_to_string(&csv)
        .unwrap()
        .replace("profile,job", "profile,gpu,job")
        .replace(",adam,h200,", ",adam,,NVIDIA H100 80GB HBM3,");
    std::fs::write(&csv, text).unwrap();
    let err = compare(&["--reuse-traces"]);
    assert!(
        err.contains(
            "1 of the 1 rows were measured on another GPU than --profile a100-40gb (1 on NVIDIA H100 80GB HBM3"
        ),
        "{err}"
    );
}

/// The A100 profile in `dir`, its `[calibration.rows]` replaced by `rows` of dataset `stem`, named
/// by position (its `[calibration.row_digests]` left out).
pub fn calibrated_on(dir: &Path, stem: &str, rows: &[u64]) -> PathBuf {
    let base = std::fs::read_to_string(crate::common::repo().join("profiles/a100-40gb.toml")).unwrap();
    let cut = base.find("\n[calibration.rows]\n").unwrap();
    let rest = &base[cut + 1..];
    let after = rest.find("\n[calibration.row_digests]\n").unwrap() + 1;
    let after = rest[after..].find("\n[").map_or(rest.len(), |i| after + i + 1);
    let list: Vec<String> = rows.iter().map(u64::to_string).collect();
    let profile = dir.join("cal.toml");
    let text =
        format!("{}\n[calibration.rows]\n\"{stem}\" = [{}]\n\n{}", &base[..cut], list.join(", "), &rest[after..]);
    std::fs::write(&profile, text).unwrap();
    profile
}

#[test]
fn compare_with_every_row_left_out_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    // Two rows of a measured dataset, under a stem of their own.
    let text = std::fs::read_to_string(shared("gpumemnet/mlp_data_step1.csv")).unwrap();
    let data = dir.path().join("two.csv");
    std::fs::write(&data, text.lines().take(3).collect::<Vec<_>>().join("\n") + "\n").unwrap();
    let profile = calibrated_on(dir.path(), "two", &[1, 2]);
    let out = dir.path().join("cmp");
    let (ok, _, err) = memest_compare(&data, &out, &["--profile", profile.to_str().unwrap(), "--exclude-calibrated"]);
    assert!(!ok);
    assert!(
        err.contains(
            "no row to compare: the datasets hold 2 rows and all of them were left out (2 by --exclude-calibrated)"
        ),
        "{err}"
    );
    assert!(!out.exists(), "nothing is written");
}
