//! `memsim stats` end to end: the `utilization` JSON object, the text section, the launch-only
//! message and the `--sm-count`/`--profile` fallbacks.

use std::path::{Path, PathBuf};

use crate::records;
use crate::support::{json, memsim, write_records};
use serde_json::Value;
use trace::{DeviceInfo, Event, Header, Level, Marker, NameDef, Record};

fn rec(ts: u64, event: Event) -> Record {
    Record { ts_ns: Some(ts), tid: None, device: Some(0), event }
}

/// A kernel named `name` on stream 7.
fn exec(start: u64, end: u64, grid: u32, name: u32) -> Record {
    records::kernel(start, end, grid, 7, Some(name))
}

/// A launch of one 256-thread block on stream 7.
fn launch(ts: u64) -> Record {
    records::launch(ts, 256, 7)
}

fn marker(ts: u64, text: &str) -> Record {
    rec(ts, Event::Marker(Marker { text: text.to_string() }))
}

fn write(dir: &Path, file: &str, device: Option<DeviceInfo>, records: &[Record]) -> PathBuf {
    let mut h = Header::new("test", "0", Level::Device);
    h.devices.extend(device);
    write_records(dir, file, &h, records)
}

fn a100_like(sm_count: u32) -> Option<DeviceInfo> {
    Some(DeviceInfo {
        index: 0,
        name: None,
        total_memory: None,
        sm_count: Some(sm_count),
        compute_capability: Some((8, 0)),
    })
}

/// A forward phase with a GEMM on all SMs and an elementwise kernel on half, then a backward
/// phase with an idle gap: 400 ns of wall, 300 ns busy.
fn cupti_records() -> Vec<Record> {
    vec![
        Record::bare(Event::Name(NameDef { id: 1, text: "ampere_sgemm_128x64_nn".into() })),
        Record::bare(Event::Name(NameDef { id: 2, text: "vectorized_elementwise_kernel".into() })),
        marker(1_000, "phase:forward"),
        launch(1_000),
        launch(1_010),
        exec(1_000, 1_200, 4, 1),
        exec(1_200, 1_300, 2, 2),
        marker(1_300, "phase:backward"),
        launch(1_310),
        exec(1_350, 1_400, 4, 1),
    ]
}

fn num(v: &Value, path: &str) -> f64 {
    v.pointer(path).and_then(Value::as_f64).unwrap_or_else(|| panic!("{path} missing or not a number in {v}"))
}

#[test]
fn json_contract() {
    let dir = tempfile::tempdir().unwrap();
    for file in ["t.jsonl", "t.mtrace"] {
        let t = write(dir.path(), file, a100_like(4), &cupti_records());
        let v = json(&["stats", t.to_str().unwrap(), "--json"]);
        let u = &v["utilization"];
        assert_eq!(u["timing"], "cupti", "{u}");
        assert_eq!(u["sm_count"], 4);
        assert_eq!(u["sm_count_source"], "header");
        assert_eq!(u["compute_capability"], serde_json::json!([8, 0]));
        let close = |path: &str, want: f64| {
            let got = num(u, path);
            assert!((got - want).abs() < 1e-12, "{file} {path}: {got} != {want}");
        };
        close("/run/wall_ns", 400.0);
        close("/run/busy_fraction", 350.0 / 400.0);
        close("/run/sm_activity", (200.0 + 50.0 + 50.0) / 400.0);
        close("/run/occupancy", 350.0 / 400.0);
        close("/run/launch_rate_per_s", 3.0 / 400e-9);
        close("/run/mean_gap_ns", 25.0);
        close("/run/time_share/gemm_conv", 250.0 / 350.0);
        close("/run/time_share/elementwise", 100.0 / 350.0);
        close("/run/time_share/reduction", 0.0);
        close("/run/time_share/other", 0.0);
        close("/phases/forward/busy_fraction", 1.0);
        close("/phases/forward/wall_ns", 300.0);
        close("/phases/backward/busy_fraction", 0.5);
        close("/phases/backward/launch_rate_per_s", 1.0 / 100e-9);
        assert_eq!(u["run"]["top_kernels"][0]["name"], "ampere_sgemm_128x64_nn");
        assert_eq!(u["run"]["top_kernels"][0]["count"], 2);
        assert_eq!(u["run"]["top_kernels"][0]["class"], "gemm_conv");
        // The existing fields stay.
        assert_eq!(v["kernel_exec_records"], 3);
        assert_eq!(v["kernel_busy_ns"], 350);
    }
}

#[test]
fn text_output() {
    let dir = tempfile::tempdir().unwrap();
    let t = write(dir.path(), "t.jsonl", a100_like(4), &cupti_records());
    let (code, out, err) = memsim(&["stats", t.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("utilization       device 0 (4 SMs, compute capability 8.0)"), "{out}");
    let run_line = out.lines().find(|l| l.trim_start().starts_with("run ")).unwrap_or_else(|| panic!("{out}"));
    assert!(run_line.contains("87.5%") && run_line.contains("75.0%"), "{run_line}");
    assert!(out.contains("ampere_sgemm_128x64_nn"), "{out}");
}

#[test]
fn launches_only_trace_says_how_to_get_timing() {
    let dir = tempfile::tempdir().unwrap();
    let records = [marker(0, "phase:forward"), launch(0), launch(500), launch(1_000)];
    let t = write(dir.path(), "l.jsonl", a100_like(4), &records);
    let v = json(&["stats", t.to_str().unwrap(), "--json"]);
    let u = &v["utilization"];
    assert_eq!(u["timing"], "launches_only");
    assert_eq!(u["run"]["launches"], 3);
    assert!(u["run"]["busy_fraction"].is_null(), "{u}");
    assert!((num(u, "/phases/forward/launch_rate_per_s") - 3.0 / 1e-6).abs() < 1e-6);
    assert!(u["notes"].to_string().contains("MEMTRACE_CUPTI=1"), "{u}");
    let (code, out, _) = memsim(&["stats", t.to_str().unwrap()]);
    assert_eq!(code, 0);
    assert!(out.contains("MEMTRACE_CUPTI=1"), "{out}");
}

#[test]
fn sm_count_and_profile_fallbacks() {
    let dir = tempfile::tempdir().unwrap();
    let t = write(dir.path(), "n.jsonl", None, &cupti_records());
    let path = t.to_str().unwrap();
    let v = json(&["stats", path, "--json"]);
    assert!(v["utilization"]["run"]["sm_activity"].is_null());
    assert!(v["utilization"]["notes"].to_string().contains("--sm-count"), "{v}");

    let v = json(&["stats", path, "--json", "--sm-count", "8"]);
    assert_eq!(v["utilization"]["sm_count_source"], "fallback");
    assert!(
        (num(&v, "/utilization/run/sm_activity") - (200.0 * 0.5 + 100.0 * 0.25 + 50.0 * 0.5) / 400.0).abs() < 1e-12
    );
    assert!(v["utilization"]["run"]["occupancy"].is_null());

    // The H200 profile: 132 SMs, compute capability 9.0.
    let v = json(&["stats", path, "--json", "--profile", "h200"]);
    assert_eq!(v["utilization"]["sm_count"], 132);
    assert_eq!(v["utilization"]["compute_capability"], serde_json::json!([9, 0]));
    assert!((num(&v, "/utilization/run/occupancy") - 350.0 / 400.0).abs() < 1e-12);

    let (code, _, err) = memsim(&["stats", path, "--profile", "no-such-gpu"]);
    assert_eq!(code, 2);
    assert!(err.contains("--profile no-such-gpu") && err.contains("not found"), "{err}");

    // The header's SM count wins: a flag it overrides is said to have no effect; 0 SMs is refused.
    let h = write(dir.path(), "h.jsonl", a100_like(4), &cupti_records());
    let (code, _, err) = memsim(&["stats", h.to_str().unwrap(), "--sm-count", "50"]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("--sm-count 50 has no effect: the trace header records the GPU's 4 SMs"), "{err}");
    let (code, _, err) = memsim(&["stats", path, "--sm-count", "0"]);
    assert_eq!(code, 2, "{err}");
    // A profile standing in for nothing the header lacks, or for a trace with no kernel at all,
    // is said to have no effect.
    let (code, _, err) = memsim(&["stats", h.to_str().unwrap(), "--profile", "h200"]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("--profile h200 has no effect: the trace header records the SM count"), "{err}");
    let (_, _, err) = memsim(&["stats", path, "--profile", "h200"]);
    assert!(!err.contains("no effect"), "{err}");
    let empty = write(dir.path(), "e.jsonl", None, &[]);
    let (code, _, err) = memsim(&["stats", empty.to_str().unwrap(), "--profile", "h200", "--sm-count", "8"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("--sm-count 8 and --profile h200 have no effect: the trace records no kernel launch"),
        "{err}"
    );
    // --top lists kernels: with none it was taken in silence.
    let (code, _, err) = memsim(&["stats", empty.to_str().unwrap(), "--top", "3"]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("--top 3 has no effect: the trace records no kernel launch to list"), "{err}");
    let (_, _, err) = memsim(&["stats", path, "--top", "3"]);
    assert!(!err.contains("no effect"), "{err}");
}
