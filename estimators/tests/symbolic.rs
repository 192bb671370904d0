//! The symbolic estimator on hand-built traces: replay peaks, profile terms, capped reruns,
//! live-peak and the FakeTensor-style forward+backward peak.

use estimators::symbolic::{capped_rerun_ok, symbolic};
use estimators::tracefile::LoadedTrace;
use simulator::alloc::TorchVersion;
use simulator::fit::{outside, Capacity, CapacitySource, Libraries, Outside};
use simulator::profile::Profile;

use crate::common::jsonl_trace;

const MIB: u64 = 1024 * 1024;

fn load(meta: &[(&str, &str)], ops: &[(char, u64, u64)]) -> (tempfile::TempDir, LoadedTrace) {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("t.jsonl");
    std::fs::write(&p, jsonl_trace(meta, ops)).unwrap();
    let t = LoadedTrace::load(&p).unwrap();
    (dir, t)
}

fn terms(p: &Profile, gemm: bool, conv: bool) -> Outside {
    outside(p, "test", Libraries::single(gemm, conv, "test"))
}

fn total(p: &Profile) -> Capacity {
    Capacity { bytes: p.gpu.total_memory, source: CapacitySource::Profile }
}

fn profile() -> Profile {
    let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../profiles/a100-40gb.toml");
    Profile::load(path.to_str().unwrap()).unwrap().0
}

#[test]
fn replay_peaks_and_device_terms() {
    // Requests under 10 MiB share a 20 MiB large-pool segment (kLargeBuffer); 1000 B takes a 2 MiB small one.
    let ops = [
        ('m', 0, 0),
        ('a', 1, 3 * MIB),
        ('a', 2, 4 * MIB),
        ('f', 1, 0),
        ('m', 0, 1),
        ('a', 3, 1000),
        ('m', 0, 2),
        ('a', 4, 8 * MIB),
    ];
    let (_d, t) = load(&[("batch_size", "4")], &ops);
    let p = profile();
    let check = |gemm: bool, conv: bool| {
        let e = symbolic(&t, TorchVersion::V2_4, &terms(&p, gemm, conv), total(&p)).unwrap();
        assert_eq!(
            e.predicted_reserved_peak,
            22 * MIB,
            "one 20 MiB segment shared by 3, 4 and 8 MiB, plus a 2 MiB small-pool segment"
        );
        let o = &p.outside_allocator;
        let mib = o.context_mib + if gemm { o.cublas_mib } else { 0.0 } + if conv { o.cudnn_mib } else { 0.0 };
        assert_eq!(e.outside_allocator, (mib * MIB as f64).round() as u64);
        assert!(e.verdict.fits && e.verdict.need_bytes == e.predicted_device_peak);
        assert_eq!(e.predicted_device_peak, e.predicted_reserved_peak + e.outside_allocator);
        assert!(!e.oom_on_profile_gpu);
    };
    check(false, false);
    check(true, true);
    // live-peak: 3+4 MiB, then 4 MiB + 1000 B + 8 MiB = the larger.
    assert_eq!(t.live_peak(), 12 * MIB + 1000);
    // forward+backward only: stops at the optimizer marker.
    assert_eq!(t.forward_backward_peak(), 7 * MIB);
}

#[test]
fn over_capacity_peak_follows_the_oom_retry_path() {
    // A 30 MiB segment is cached when 40 MiB is requested: 70 MiB reserved without a limit;
    // under a limit, the failed cudaMalloc frees the cached segment and retries (40 MiB).
    let ops = [('a', 1, 30 * MIB), ('f', 1, 0), ('a', 2, 40 * MIB)];
    let (_d, t) = load(&[], &ops);
    let check = |capacity: u64, reserved: u64, oom: bool| {
        let mut p = profile();
        p.gpu.total_memory = capacity + terms(&p, false, false).total_bytes;
        let e = symbolic(&t, TorchVersion::V2_4, &terms(&p, false, false), total(&p)).unwrap();
        assert_eq!((e.predicted_reserved_peak, e.oom_on_profile_gpu), (reserved, oom), "capacity {capacity}");
        // The verdict never contradicts the number beside it.
        assert_eq!(e.verdict.fits, !oom);
        assert_eq!(e.verdict.fits, e.predicted_device_peak <= p.gpu.total_memory);
        assert_eq!(e.predicted_device_peak, reserved + e.outside_allocator);
    };
    check(100 * MIB, 70 * MIB, false);
    check(70 * MIB, 70 * MIB, false);
    check(50 * MIB, 40 * MIB, false);
    check(40 * MIB, 40 * MIB, false);
    // Too small even after the retry: OOM, reported with the unlimited demand.
    check(35 * MIB, 70 * MIB, true);
}

#[test]
fn capped_rerun_survives_only_with_enough_memory() {
    let ops = [('a', 1, 30 * MIB), ('f', 1, 0), ('a', 2, 30 * MIB)];
    let (_d, t) = load(&[], &ops);
    let check = |estimate: u64, outside: u64, ok: bool| {
        assert_eq!(capped_rerun_ok(&t, TorchVersion::V2_4, estimate, outside).unwrap(), ok, "{estimate} - {outside}");
    };
    check(30 * MIB, 0, true);
    check(29 * MIB, 0, false);
    check(30 * MIB, MIB, false);
    check(31 * MIB, MIB, true);
}

#[test]
fn device_level_trace_is_refused_with_a_reason() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("dev.jsonl");
    let text = jsonl_trace(&[], &[('a', 1, 100)]).replacen("\"level\":\"allocator\"", "\"level\":\"device\"", 1);
    std::fs::write(&p, text).unwrap();
    let t = LoadedTrace::load(&p).unwrap();
    let e =
        estimators::error::chain(&symbolic(&t, TorchVersion::V2_4, &Outside::none(), total(&profile())).unwrap_err());
    assert!(e.contains("dev.jsonl") && e.contains("device-level"), "{e}");
}

/// Which CUDA libraries a job loads: the header when it says, else the features, the trace's
/// cuBLAS workspace and the family, named by where it came from.
#[test]
fn job_libraries_take_the_header_then_the_evidence() {
    use estimators::features::{Family, Features};
    use estimators::tracefile::job_libraries;
    let dir = tempfile::tempdir().unwrap();
    let trace = |name: &str, meta: &[(&str, &str)], workspace: bool| {
        let mut text = jsonl_trace(meta, &[('a', 1, MIB)]);
        if workspace {
            text += &(serde_json::json!({"kind": "alloc", "ts_ns": 9, "device": 0, "addr": 2 * MIB, "size": MIB,
                "stream": 0, "mem": "device", "api": "allocator", "result": 0, "origin": "request",
                "category": "workspace"})
            .to_string()
                + "\n");
        }
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        LoadedTrace::load(&p).unwrap()
    };
    let linear = estimators::features_file::FeaturesFile::parse(
        r#"{"total_parameters": 10, "total_activations": 4, "batch_size": 1, "sequence": [["Linear", 4, 10]]}"#,
        std::path::Path::new("f.json"),
    )
    .unwrap()
    .features;
    let said = trace("said.jsonl", &[("uses_gemm", "false"), ("uses_conv", "true")], true);
    let silent = trace("silent.jsonl", &[], false);
    let with_ws = trace("ws.jsonl", &[], true);
    let check = |t: Option<&LoadedTrace>, f: Option<&Features>, fam: Option<Family>, expect: (bool, bool, &str)| {
        let l = job_libraries(t, f, fam);
        assert_eq!((l.gemm, l.conv, l.source), expect, "{:?} {f:?} {fam:?}", t.map(|t| &t.path));
    };
    check(Some(&said), Some(&linear), Some(Family::Mlp), (false, true, "trace"));
    check(Some(&silent), Some(&linear), None, (true, false, "features"));
    check(Some(&with_ws), None, None, (true, false, "trace workspaces"));
    check(Some(&silent), None, Some(Family::Cnn), (false, true, "trace workspaces and family"));
    check(None, Some(&linear), Some(Family::Cnn), (true, true, "features and family"));
    check(None, None, Some(Family::Cnn), (false, true, "family"));
    check(None, None, None, (false, false, "unknown"));
    // Each key on its own: a header that says only `uses_conv` (or an unreadable `uses_gemm`)
    // leaves cuBLAS to the evidence, with a warning; it used to read as "no GEMM".
    let conv_only = trace("conv.jsonl", &[("uses_conv", "true")], false);
    let maybe = trace("maybe.jsonl", &[("uses_gemm", "maybe"), ("uses_conv", "true")], false);
    check(Some(&conv_only), Some(&linear), Some(Family::Cnn), (true, true, "trace, features and family"));
    check(Some(&maybe), Some(&linear), None, (true, true, "trace and features"));
    check(Some(&conv_only), None, Some(Family::Cnn), (false, true, "trace, its workspaces and family"));
    let libs = job_libraries(Some(&maybe), Some(&linear), None);
    let w = estimators::tracefile::library_warnings(&maybe, &libs);
    assert!(w.len() == 1 && w[0].contains("not `uses_gemm`") && w[0].contains("cuBLAS counted"), "{w:?}");
    assert!(estimators::tracefile::library_warnings(&said, &job_libraries(Some(&said), None, None)).is_empty());
}
