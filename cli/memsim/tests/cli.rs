//! The `memsim` binary end to end: JSON contracts, conversions, collocation and error messages.

use std::path::{Path, PathBuf};

use serde_json::Value;
use trace::{Api, Category, Control, ControlOp, Event, Header, Level, MemoryKind, Record};

const MIB: u64 = 1 << 20;

use crate::records::{alloc, free};
use crate::support::{json, memsim, write_records};

/// Write an allocator-level trace with synthetic addresses and this header metadata.
fn write_with(dir: &Path, name: &str, records: &[Record], meta: &[(&str, &str)]) -> PathBuf {
    let mut h = Header::new("test", "0", Level::Allocator);
    h.synthetic_addresses = true;
    for (k, v) in meta {
        h.metadata.insert(k.to_string(), v.to_string());
    }
    write_records(dir, name, &h, records)
}

/// Write an allocator-level trace with synthetic addresses.
fn write_trace(dir: &Path, name: &str, records: &[Record]) -> PathBuf {
    write_with(dir, name, records, &[])
}

/// `memsim replay` and `memsim colocate` of the trace `t` on a device of `bytes`: each command
/// with its exit status, stdout and stderr (the two give one verdict, so tests ask both).
fn replay_and_colocate(t: &str, bytes: u64) -> [(&'static str, i32, String, String); 2] {
    let cap = format!("{bytes}B");
    ["replay", "colocate"].map(|cmd| {
        let (code, out, err) = memsim(&[cmd, t, "--capacity", &cap]);
        (cmd, code, out, err)
    })
}

/// Three 30 MiB tensors, the middle one freed before a 60 MiB one: native rules give a 30 MiB
/// segment each (>= 10 MiB requests round to 2 MiB multiples) and a fresh 60 MiB segment.
fn three_tensors() -> Vec<Record> {
    vec![
        alloc(1, 30 * MIB, Some(Category::Parameter)),
        alloc(2, 30 * MIB, Some(Category::Activation)),
        alloc(3, 30 * MIB, Some(Category::Activation)),
        free(2),
        alloc(4, 60 * MIB, Some(Category::Activation)),
        free(4),
        free(3),
        free(1),
    ]
}

/// Two jobs, `a.jsonl` and `b.jsonl`, each the three-tensor trace at the same timestamps.
fn twin_jobs(dir: &Path) -> [String; 2] {
    ["a.jsonl", "b.jsonl"].map(|name| write_trace(dir, name, &three_tensors()).to_str().unwrap().to_owned())
}

/// A trace with no device allocation (a run that fell back to the CPU) is not a measurement
/// of a job that needs nothing: said beside the verdict.
#[test]
fn a_trace_without_allocations_is_said_to_measure_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let says = "the trace holds no device allocation, so nothing was measured";
    for (records, expect) in [(vec![], true), (three_tensors(), false)] {
        let t = write_trace(dir.path(), "t.jsonl", &records);
        let (code, _, err) = memsim(&["replay", t.to_str().unwrap(), "--profile", "a100-40gb"]);
        assert_eq!((code, err.contains(says)), (0, expect), "{err}");
    }
    // An out-of-memory error the run recorded is a measurement: its need (100 GiB) was said
    // beside "nothing was measured ... the need is only what the profile puts outside".
    let oom = dir.path().join("oom.jsonl");
    let header = r#"{"kind":"header","format_version":1,"producer":{"name":"t","version":"1"},"level":"allocator","caching_disabled":false}"#;
    let record = r#"{"ts_ns":1,"device":0,"kind":"oom","size":107374182400,"device_free":1000,"stream":0}"#;
    std::fs::write(&oom, format!("{header}\n{record}\n")).unwrap();
    let oom = oom.to_str().unwrap();
    for args in [&["replay", oom][..], &["colocate", oom], &["colocate", oom, oom]] {
        let (code, _, err) = memsim(&[args, &["--profile", "a100-40gb"]].concat());
        assert_eq!(code, 1, "{args:?}: {err}");
        assert!(!err.contains(says) && err.contains("the run ran out of memory"), "{args:?}: {err}");
    }
}

#[test]
fn replay_json_contract() {
    let dir = tempfile::tempdir().unwrap();
    let t = write_trace(dir.path(), "t.jsonl", &three_tensors());
    let v = json(&["replay", t.to_str().unwrap(), "--json"]);
    assert_eq!(v["peak_reserved_bytes"], 150 * MIB);
    assert_eq!(v["peak_allocated_bytes"], 120 * MIB);
    assert_eq!(v["oom"], false);
    assert_eq!(v["oom_at_event"], Value::Null);
    assert_eq!(v["memory_stats"]["reserved_bytes.all.peak"], 150 * MIB);
    assert_eq!(v["memory_stats"]["num_device_alloc"], 4);
    assert_eq!(v["devices"][0]["categories_at_peak"]["parameter"], 30 * MIB);
    assert_eq!(v["devices"][0]["categories_at_peak"]["activation"], 90 * MIB);
}

#[test]
fn replay_oom_at_capacity() {
    let dir = tempfile::tempdir().unwrap();
    let t = write_trace(dir.path(), "t.mtrace", &three_tensors());
    // 100 MiB: after freeing tensor 2 its cached 30 MiB segment is released and retried, but
    // 60 + 60 > 100 still fails at record 4 (the 60 MiB request).
    let (code, out, err) = memsim(&["replay", t.to_str().unwrap(), "--capacity", "100MiB", "--json"]);
    assert_eq!(code, 1, "does not fit: exit 1 ({err})");
    assert!(err.contains("without --profile"), "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["oom"], true);
    assert_eq!(v["oom_at_event"], 4);
    assert_eq!(v["verdict"]["fits"], false);
    let v = json(&["replay", t.to_str().unwrap(), "--capacity", "150MiB", "--json"]);
    assert_eq!(v["oom"], false);
}

#[test]
fn replay_honours_alloc_conf() {
    let dir = tempfile::tempdir().unwrap();
    let t = write_trace(dir.path(), "t.jsonl", &three_tensors());
    // Expandable segments tile one range of 20 MiB pages: [0,30) maps [0,40); the next 30 MiB
    // takes the free 10 MiB tail and maps one page, [30,60); the third maps two pages, [60,100).
    // After the middle tensor is freed, 60 MiB fits neither the 30 MiB hole nor the 10 MiB tail, so
    // the tail grows by 3 pages: 100 + 60 = 160 MiB mapped at the peak.
    let v = json(&["replay", t.to_str().unwrap(), "--alloc-conf", "expandable_segments:True", "--json"]);
    assert_eq!(v["peak_reserved_bytes"], 160 * MIB);
    let (code, _, err) = memsim(&["replay", t.to_str().unwrap(), "--alloc-conf", "max_split_size_mb:abc"]);
    assert_eq!(code, 2);
    assert!(err.contains("max_split_size_mb"), "{err}");
}

#[test]
fn stats_json_contract() {
    let dir = tempfile::tempdir().unwrap();
    let t = write_trace(dir.path(), "t.jsonl", &three_tensors());
    let v = json(&["stats", t.to_str().unwrap(), "--json"]);
    for key in
        ["events", "allocs", "frees", "kernel_launches", "peak_live_device_bytes", "lost_events", "truncated", "calls"]
    {
        assert!(v.get(key).is_some(), "missing {key}: {v}");
    }
    assert_eq!(v["events"], 8);
    assert_eq!(v["allocs"], 4);
    assert_eq!(v["frees"], 4);
    assert_eq!(v["peak_live_device_bytes"], 120 * MIB);
    assert_eq!(v["calls"]["allocator"], 8);
    assert_eq!(v["truncated"], false);
}

/// Several files in one command: each gives what it gives alone, in the order given; a file
/// that fails is reported beside the others and makes the status 2.
#[test]
fn replay_and_stats_take_many_files() {
    let dir = tempfile::tempdir().unwrap();
    let a = write_trace(dir.path(), "a.mtrace", &three_tensors());
    let b = write_trace(dir.path(), "b.jsonl", &three_tensors()[..3]);
    let missing = dir.path().join("missing.mtrace");
    let (a, b, missing) = (a.to_str().unwrap(), b.to_str().unwrap(), missing.to_str().unwrap());
    for cmd in ["replay", "stats"] {
        let v = json(&[cmd, a, b, "--json"]);
        let alone = [json(&[cmd, a, "--json"]), json(&[cmd, b, "--json"])];
        assert_eq!(v.as_array().map(Vec::len), Some(2), "{cmd}: {v}");
        for (got, want) in v.as_array().unwrap().iter().zip(&alone) {
            assert_eq!(got, want, "{cmd}: a file in a batch is reported as it is alone");
        }
        let (code, out, err) = memsim(&[cmd, b, missing, a, "--json"]);
        assert_eq!(code, 2, "{cmd}: a failed file makes the status 2 ({err})");
        assert!(err.contains("missing.mtrace: no such file"), "{cmd}: {err}");
        let v: Value = serde_json::from_str(&out).unwrap();
        let files: Vec<&str> = v.as_array().unwrap().iter().map(|e| e["file"].as_str().unwrap()).collect();
        assert_eq!(files, [b, missing, a], "{cmd}: in the order given");
        assert!(v[1]["error"].as_str().unwrap().contains("no such file"), "{cmd}: {v}");
        let (code, out, _) = memsim(&[cmd, a, b]);
        assert_eq!(code, 0);
        assert!(out.find(a).unwrap() < out.find(b).unwrap(), "{cmd}: text sections in order: {out}");
    }
    assert_eq!(json(&["replay", a, b, "--json"])[1]["peak_reserved_bytes"], 90 * MIB);
    let (code, _, err) = memsim(&["replay"]);
    assert_eq!(code, 2, "no file: usage error ({err})");
}

#[test]
fn convert_round_trips_and_exports() {
    let dir = tempfile::tempdir().unwrap();
    let t = write_trace(dir.path(), "t.jsonl", &three_tensors());
    let bin = dir.path().join("t.mtrace");
    let back = dir.path().join("back.jsonl");
    assert_eq!(memsim(&["convert", t.to_str().unwrap(), bin.to_str().unwrap()]).0, 0);
    assert_eq!(memsim(&["convert", bin.to_str().unwrap(), back.to_str().unwrap()]).0, 0);
    assert_eq!(std::fs::read_to_string(&t).unwrap(), std::fs::read_to_string(&back).unwrap());
    // And back to the native form, byte for byte.
    let again = dir.path().join("again.mtrace");
    let (code, _, err) = memsim(&["convert", back.to_str().unwrap(), again.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains(&format!("{} records: ", three_tensors().len())), "{err}");
    assert_eq!(std::fs::read(&bin).unwrap(), std::fs::read(&again).unwrap());

    let perfetto = dir.path().join("t.json");
    assert_eq!(memsim(&["convert", bin.to_str().unwrap(), perfetto.to_str().unwrap()]).0, 0);
    let v: Value = serde_json::from_slice(&std::fs::read(&perfetto).unwrap()).unwrap();
    let counters: Vec<&Value> = v["traceEvents"].as_array().unwrap().iter().filter(|e| e["ph"] == "C").collect();
    let max_reserved = counters.iter().filter_map(|e| e["args"]["reserved"].as_u64()).max();
    assert_eq!(max_reserved, Some(150 * MIB));
    // A recorded OOM is an instant on the time line, not left out.
    let mut failed = three_tensors();
    let oom = trace::Oom { size: 64 * MIB, device_free: Some(MIB), stream: 0 };
    failed.push(Record { ts_ns: Some(99), tid: None, device: Some(0), event: Event::Oom(oom) });
    let t = write_trace(dir.path(), "oom.jsonl", &failed);
    let out = dir.path().join("oom.json");
    assert_eq!(memsim(&["convert", t.to_str().unwrap(), out.to_str().unwrap()]).0, 0);
    let v: Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    let ooms: Vec<&Value> = v["traceEvents"].as_array().unwrap().iter().filter(|e| e["cat"] == "oom").collect();
    assert_eq!(ooms.len(), 1, "{v}");
    assert_eq!(ooms[0]["args"]["size"], 64 * MIB);
    assert_eq!(ooms[0]["name"], format!("OOM (device 0): {} B requested", 64 * MIB));

    let pickle = dir.path().join("t.pickle");
    let (code, _, err) = memsim(&["convert", bin.to_str().unwrap(), pickle.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(std::fs::metadata(&pickle).unwrap().len() > 0);
}

/// A converted snapshot cut at a record boundary (`head -n`) replayed as a smaller job, with no
/// word even under `--strict`: the converter now ends it as the shim does, and says so in its
/// header, so the cut is told from the whole in either form.
#[test]
fn a_converted_snapshot_cut_at_a_record_is_said() {
    let dir = tempfile::tempdir().unwrap();
    let snap = crate::snapshot_support::shared_path("MAGMA27--assignment2-systems--memory_snapshot.pickle");
    for name in ["whole.jsonl", "whole.mtrace"] {
        let whole = dir.path().join(name);
        assert_eq!(memsim(&["convert", snap.to_str().unwrap(), whole.to_str().unwrap()]).0, 0);
        let (code, _, err) = memsim(&["replay", "--strict", whole.to_str().unwrap(), "--capacity", "1TiB"]);
        assert_eq!(code, 0, "the whole: {err}");
        assert!(!err.contains("cut short"), "{err}");
        // The same records less the last, in the same form.
        let reader = trace::Reader::open(&whole).unwrap();
        let header = reader.header().clone();
        let records: Vec<Record> = reader.map(Result::unwrap).collect();
        let cut_name = format!("cut.{}", name.rsplit('.').next().unwrap());
        let cut = write_records(dir.path(), &cut_name, &header, &records[..records.len() - 1]);
        let (code, _, err) = memsim(&["replay", cut.to_str().unwrap(), "--capacity", "1TiB"]);
        assert_eq!(code, 0, "{err}");
        assert!(err.contains("cut short"), "{name}: {err}");
        let (code, _, err) = memsim(&["replay", "--strict", cut.to_str().unwrap(), "--capacity", "1TiB"]);
        assert_eq!(code, 2, "{name}: {err}");
    }
}

#[test]
fn colocate_fits_and_smallest_capacity() {
    let dir = tempfile::tempdir().unwrap();
    let [a, b] = twin_jobs(dir.path());
    let (a, b) = (a.as_str(), b.as_str());
    // Same timestamps: both peak together at 150 MiB each.
    let v = json(&["colocate", a, b, "--capacity", "400MiB", "--context", "10MiB", "--json"]);
    assert_eq!(v["mode"], "timestamps");
    assert_eq!(v["fits"], true);
    assert_eq!(v["combined_need_bytes"], 320 * MIB);
    // Job a goes first at each tie. At C >= 260 MiB a reaches 150 MiB without releasing its cache;
    // b then has C - 150 - 20 and, after releasing its cached 30 MiB segment, needs 120 MiB:
    // C >= 290 MiB. Below 260, a releases and keeps 120, and b would need C >= 260: no fit.
    assert_eq!(v["smallest_fitting_capacity"], 290 * MIB);
    let (code, out, _) = memsim(&["colocate", a, b, "--capacity", "200MiB", "--context", "10MiB"]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("DOES NOT FIT"), "{out}");
    let v = json(&["colocate", a, b, "--capacity", "400MiB", "--align", "worst", "--json"]);
    assert_eq!(v["mode"], "sum-of-peaks");
    assert_eq!(v["combined_need_bytes"], 300 * MIB);
    assert_eq!(v["smallest_fitting_capacity"], 300 * MIB);
}

#[test]
fn colocate_counts_the_libraries_each_job_loads() {
    let dir = tempfile::tempdir().unwrap();
    let profile = dir.path().join("p.toml");
    std::fs::write(
        &profile,
        "[gpu]\nname = \"test\"\ntotal_memory = 1073741824\ncompute_capability = [8, 0]\nsm_count = 1\n\
         [software]\ntorch = \"2.9\"\ncuda = \"13.0\"\nallocator = \"2.9\"\n\
         [outside_allocator]\ncontext_mib = 100.0\ncublas_mib = 10.0\ncudnn_mib = 1.0\n\
         [workspace]\ncublas_workspace_config = \":4096:2\"\ncublaslt_workspace_kib = 1024\n",
    )
    .unwrap();
    let job = |name: &str, meta: &[(&str, &str)]| {
        write_with(dir.path(), name, &[alloc(1, 30 * MIB, None)], meta).to_str().unwrap().to_string()
    };
    let conv = job("conv.jsonl", &[("uses_gemm", "true"), ("uses_conv", "true")]);
    let mlp = job("mlp.jsonl", &[("uses_gemm", "true"), ("uses_conv", "false")]);
    let unknown = job("unknown.jsonl", &[]);
    let v = json(&["colocate", &conv, &mlp, &unknown, "--profile", profile.to_str().unwrap(), "--json"]);
    let contexts: Vec<u64> =
        v["jobs"].as_array().unwrap().iter().map(|j| j["outside_allocator"]["total_bytes"].as_u64().unwrap()).collect();
    assert_eq!(contexts, vec![111 * MIB, 110 * MIB, 100 * MIB]);
    assert_eq!(v["combined_need_bytes"], 3 * 30 * MIB + 321 * MIB);
    // The trace that does not say which libraries it loads is warned about.
    assert!(v["warnings"].as_array().unwrap().iter().any(|w| w.as_str().unwrap().contains("unknown.jsonl")), "{v}");

    // A flag spelt outside its domain is not read as false: it is ignored, and said so.
    let odd = job("odd.jsonl", &[("uses_gemm", "True"), ("uses_conv", "false")]);
    let v = json(&["colocate", &odd, "--profile", profile.to_str().unwrap(), "--json"]);
    assert_eq!(v["jobs"][0]["outside_allocator"]["total_bytes"], 100 * MIB, "{v}");
    let warned = "odd.jsonl: header metadata `uses_gemm` = \"True\": expected true or false; ignored";
    assert!(v["warnings"].as_array().unwrap().iter().any(|w| w.as_str().unwrap().ends_with(warned)), "{v}");
    let (code, _, err) = memsim(&["replay", &odd, "--profile", profile.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains(warned), "{err}");
    // ... and the library it leaves unsaid is said not to be counted (cuBLAS was 0 in silence).
    assert!(err.contains("does not say whether the job uses cuBLAS (no readable uses_gemm"), "{err}");
    let conv_only = job("conv_only.jsonl", &[("uses_conv", "true")]);
    let (_, _, err) = memsim(&["replay", &conv_only, "--profile", profile.to_str().unwrap()]);
    assert!(err.contains("cuBLAS's memory is not counted") && !err.contains("uses cuDNN"), "{err}");

    // A trace emulated for another GPU profile is judged with a warning saying so; a plain meta
    // trace emulated nothing, and one emulated for this profile (or its architecture) is silent.
    let elsewhere = "the trace was emulated for the h200 profile, not p";
    for (meta, warns) in [
        (vec![("profile", "h200")], true),
        (vec![("profile", "h200"), ("cuda_emulation", "false")], false),
        (vec![("profile", "p")], false),
        // A renamed copy of the traced profile (read where memsim finds profiles) emulates the
        // same; another GPU does not, whatever the trace says of it.
        (vec![("profile", profile.to_str().unwrap())], false),
        (vec![("profile", "h200"), ("compute_capability", "8.0")], true),
    ] {
        let t = job("traced.jsonl", &meta);
        let (_, _, err) = memsim(&["replay", &t, "--profile", profile.to_str().unwrap()]);
        assert_eq!(err.contains(elsewhere), warns, "{meta:?}: {err}");
    }
}

#[test]
fn a_job_that_autotunes_its_convolutions_is_said_to_by_every_judge() {
    let dir = tempfile::tempdir().unwrap();
    let tuned = write_with(dir.path(), "tuned.jsonl", &[alloc(1, 30 * MIB, None)], &[("cudnn_benchmark", "true")]);
    let plain = write_with(dir.path(), "plain.jsonl", &[alloc(1, 30 * MIB, None)], &[("cudnn_benchmark", "false")]);
    let said = "turns on torch.backends.cudnn.benchmark";
    for (args, warns) in [
        (vec!["replay", tuned.to_str().unwrap()], true),
        (vec!["replay", plain.to_str().unwrap()], false),
        (vec!["colocate", tuned.to_str().unwrap(), plain.to_str().unwrap()], true),
        (vec!["colocate", plain.to_str().unwrap(), "--context", "1MiB"], false),
        (vec!["colocate", tuned.to_str().unwrap(), "--context", "1MiB"], true),
    ] {
        let (code, _, err) = memsim(&args);
        assert_eq!(code, 0, "{args:?}: {err}");
        assert_eq!(err.matches(said).count(), usize::from(warns), "{args:?}: {err}");
    }
}

#[test]
fn errors_are_clear() {
    let dir = tempfile::tempdir().unwrap();
    let (code, _, err) = memsim(&["replay", "/nonexistent/x.mtrace"]);
    assert_eq!(code, 2);
    assert!(err.contains("/nonexistent/x.mtrace") && err.contains("no such file"), "{err}");

    let odd = dir.path().join("x.csv");
    std::fs::write(&odd, "a,b\n").unwrap();
    let (code, _, err) = memsim(&["stats", odd.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(err.contains("unknown input format"), "{err}");

    // A device-level trace with the cache on is refused, with what to do instead.
    let dev = device_trace_with_cache_on(dir.path());
    let (code, _, err) = memsim(&["replay", dev.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(err.contains("PYTORCH_NO_CUDA_MEMORY_CACHING=1"), "{err}");

    // A free of an address never allocated is reported, not a crash.
    let t = write_trace(dir.path(), "bad.jsonl", &[alloc(1, 512, None), free(99)]);
    let v = json(&["replay", t.to_str().unwrap(), "--json"]);
    assert_eq!(v["rejected"], 1);
    assert!(v["rejected_examples"][0].as_str().unwrap().contains("0x63"), "{v}");

    // Control events reach the model: empty_cache releases the cached segment.
    let mut recs = three_tensors();
    recs.push(Record::bare(Event::Control(Control { op: ControlOp::EmptyCache })));
    let t = write_trace(dir.path(), "ec.jsonl", &recs);
    let v = json(&["replay", t.to_str().unwrap(), "--json"]);
    assert_eq!(v["memory_stats"]["reserved_bytes.all.current"], 0);
}

/// A symbolic-style trace: logical clock, no wall-clock time.
fn write_logical(dir: &Path, name: &str, records: &[Record], meta: &[(&str, &str)]) -> PathBuf {
    let mut all = vec![("clock", "logical")];
    all.extend_from_slice(meta);
    write_with(dir, name, records, &all)
}

const TEST_PROFILE: &str =
    "[gpu]\nname = \"test\"\ntotal_memory = 1073741824\ncompute_capability = [8, 0]\nsm_count = 1\n\
     [software]\ntorch = \"2.9\"\ncuda = \"13.0\"\nallocator = \"2.9\"\n\
     [outside_allocator]\ncontext_mib = 100.0\ncublas_mib = 10.0\ncudnn_mib = 1.0\n\
     [workspace]\ncublas_workspace_config = \":4096:2\"\ncublaslt_workspace_kib = 1024\n";

#[test]
fn colocate_without_timestamps_sums_device_peaks_and_never_fits_above_capacity() {
    let dir = tempfile::tempdir().unwrap();
    let a = write_logical(dir.path(), "a.jsonl", &three_tensors(), &[]);
    let b = write_logical(dir.path(), "b.jsonl", &three_tensors(), &[]);
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
    // Each needs 150 + 10 = 160 MiB; together 320 MiB, whatever the interleaving.
    for cap in [200u64, 319, 320, 400] {
        let c = format!("{cap}MiB");
        let (code, out, err) = memsim(&["colocate", a, b, "--capacity", &c, "--context", "10MiB", "--json"]);
        let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out} {err}"));
        assert_eq!(v["mode"], "sum-of-peaks");
        assert!(v["mode_reason"].as_str().unwrap().contains("timestamps"));
        assert_eq!(v["combined_need_bytes"], 320 * MIB);
        assert_eq!(v["smallest_fitting_capacity"], 320 * MIB);
        let fits = v["fits"].as_bool().unwrap();
        assert_eq!(fits, cap >= 320, "capacity {cap}");
        assert_eq!(v["verdict"]["fits"], fits);
        // Never FITS above the capacity.
        assert!(!fits || v["combined_need_bytes"].as_u64().unwrap() <= cap * MIB);
        assert_eq!(code, if fits { 0 } else { 1 });
        // Each job fits alone at 200 MiB and more.
        for j in v["jobs"].as_array().unwrap() {
            assert_eq!(j["fits_alone"], true, "capacity {cap}: {j}");
            assert_eq!(j["device_peak_bytes"], 160 * MIB);
        }
    }
    let (code, out, _) = memsim(&["colocate", a, b, "--capacity", "300MiB", "--context", "10MiB"]);
    assert_eq!(code, 1);
    assert!(out.contains("fits alone") && !out.contains("DOES NOT FIT ALONE"), "{out}");
    // The basis is said once ("sum of safe device peaks: ... the sum of device peaks" before).
    assert!(
        out.contains("sum of safe device peaks: not every trace has wall-clock") && out.contains("DOES NOT FIT"),
        "{out}"
    );
    assert_eq!(out.matches("device peaks").count(), 1, "{out}");
    // Without a profile no margin applies: each job's safe number says it is the point, as
    // replay's does.
    assert_eq!(out.matches("(no safety margin), device peak").count(), 2, "{out}");
    // The aligned replay cannot be asked for without time.
    let (code, _, err) = memsim(&["colocate", a, b, "--align", "timestamps"]);
    assert_eq!(code, 2);
    assert!(err.contains("a.jsonl") && err.contains("timestamps"), "{err}");
}

#[test]
fn colocate_aligned_verdict_matches_its_numbers() {
    let dir = tempfile::tempdir().unwrap();
    let [a, b] = twin_jobs(dir.path());
    let (a, b) = (a.as_str(), b.as_str());
    for cap in (250u64..=340).step_by(10) {
        let c = format!("{cap}MiB");
        let (code, out, _) = memsim(&["colocate", a, b, "--capacity", &c, "--context", "10MiB", "--json"]);
        let v: Value = serde_json::from_str(&out).unwrap();
        let need = v["combined_need_bytes"].as_u64().unwrap();
        let fits = v["fits"].as_bool().unwrap();
        assert_eq!(code, if fits { 0 } else { 1 });
        assert!(!fits || need <= cap * MIB, "capacity {cap}: FITS with need {need}");
        assert!(fits || need > cap * MIB, "capacity {cap}: DOES NOT FIT with need {need}");
        let least = v["smallest_fitting_capacity"].as_u64().unwrap();
        assert_eq!(fits, least <= cap * MIB, "capacity {cap}: smallest {least}");
    }
}

/// Two snapshots whose start states are rebuilt at their traces' first instant: those segments are
/// placed without the allocator's capacity check, so a shared replay below their sum ran without
/// an OOM, and the smallest capacity came out below the combined need printed beside it.
#[test]
fn colocate_smallest_capacity_holds_the_start_states() {
    let snap = crate::snapshot_support::shared_path;
    let a = snap("Wedsonlin--assignment2-systems--results_medium_128_inference_memory_snapshot.pickle");
    let b = snap("bcrafton--assignment2-systems--memory_snapshot.pickle");
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
    let v = json(&["colocate", a, b, "--context", "0", "--json"]);
    assert_eq!(v["mode"], "timestamps", "{v}");
    let need = v["combined_need_bytes"].as_u64().unwrap();
    let least = v["smallest_fitting_capacity"].as_u64().unwrap();
    assert!(least >= need, "smallest capacity {least} below the combined need {need} at the start");
    for cap in [least - MIB, least, least + 64 * MIB] {
        let c = format!("{cap}B");
        let (code, out, _) = memsim(&["colocate", a, b, "--context", "0", "--capacity", &c, "--json"]);
        let v: Value = serde_json::from_str(&out).unwrap();
        let fits = v["fits"].as_bool().unwrap();
        assert_eq!(code, if fits { 0 } else { 1 });
        assert_eq!(fits, cap >= least, "capacity {cap}: smallest {least}: {v}");
        assert!(v["smallest_fitting_capacity"].as_u64().unwrap() <= cap || !fits, "{v}");
        assert!(fits || v["smallest_fitting_capacity"].as_u64().unwrap() > cap, "{v}");
        // One answer whatever capacity is asked about (the lower bound was the largest job's
        // unlimited peak, above what it needs at a capacity where it frees its cache).
        assert_eq!(v["smallest_fitting_capacity"].as_u64().unwrap(), least, "capacity {cap}");
    }
}

/// One job alone: `colocate` says what `replay` says at every capacity, including below its
/// unlimited peak, where the allocator frees its own cache and retries. Before, "fits alone"
/// stood beside DOES NOT FIT, the set judged on the unlimited peak.
#[test]
fn colocate_of_one_job_agrees_with_its_replay() {
    let s = crate::snapshot_support::shared_path("Maphsge4--select_n--snapshot.pickle");
    let s = s.to_str().unwrap();
    let unlimited = json(&["replay", s, "--profile", "a100-40gb", "--json"]);
    let peak = unlimited["verdict"]["need_bytes"].as_u64().unwrap();
    let least =
        json(&["colocate", s, "--profile", "a100-40gb", "--json"])["smallest_fitting_capacity"].as_u64().unwrap();
    assert!(least < peak, "the retry chain fits this run below its unlimited peak ({least} vs {peak})");
    // The smallest is byte-exact and one answer, whatever capacity is asked about (it was
    // rounded up to 2 MiB, and clamped to the capacity asked, and without one it was the peak).
    let bare = json(&["colocate", s, "--context", "0", "--json"])["smallest_fitting_capacity"].as_u64().unwrap();
    let at = |cap: u64| -> Value {
        let (_, out, err) = memsim(&["colocate", s, "--context", "0", "--capacity", &format!("{cap}B"), "--json"]);
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {err}"))
    };
    assert_eq!(at(bare)["fits"], true);
    assert_eq!(at(bare - 1)["fits"], false);
    for cap in [bare - 1, bare, bare + 3 * MIB + 1] {
        assert_eq!(at(cap)["smallest_fitting_capacity"].as_u64().unwrap(), bare, "capacity {cap}");
    }
    // "fits alone" beside a larger unlimited need says what it needs at this capacity.
    let (_, out, _) = memsim(&["colocate", s, "--context", "0", "--capacity", &format!("{bare}B")]);
    assert!(out.contains("fits alone (needs ") && out.contains(" at this capacity)"), "{out}");
    for cap in [least - 2 * MIB, least, (least + peak) / 2, peak + 64 * MIB] {
        let c = format!("{cap}B");
        let (rcode, rout, _) = memsim(&["replay", s, "--profile", "a100-40gb", "--capacity", &c, "--json"]);
        let (ccode, cout, _) = memsim(&["colocate", s, "--profile", "a100-40gb", "--capacity", &c, "--json"]);
        let (r, v): (Value, Value) = (serde_json::from_str(&rout).unwrap(), serde_json::from_str(&cout).unwrap());
        assert_eq!((ccode, v["fits"].clone()), (rcode, r["verdict"]["fits"].clone()), "capacity {cap}: {v}");
        assert_eq!(v["jobs"][0]["fits_alone"], v["fits"], "capacity {cap}: {v}");
        let fits = v["fits"].as_bool().unwrap();
        // The need too, fitting or not (it was the unlimited peak when not: two numbers for one
        // replay at one capacity).
        assert_eq!(v["combined_need_bytes"], r["verdict"]["need_bytes"], "capacity {cap}");
        assert_eq!(v["verdict"]["need_bytes"], r["verdict"]["need_bytes"], "capacity {cap}");
        let smallest = v["smallest_fitting_capacity"].as_u64().unwrap();
        assert!(if fits { smallest <= cap } else { smallest > cap }, "capacity {cap}: smallest {smallest}");
    }
}

/// One job on several devices is judged by colocate as its replay judges it (it was refused,
/// while replay and memest gave a verdict); beside another job it is still refused.
#[test]
fn colocate_of_one_job_on_several_devices_is_its_replay() {
    let s = crate::snapshot_support::shared_path("Constructor-Sun--code_location--memory_snapshot.pickle");
    let s = s.to_str().unwrap();
    for cap in ["80GiB", "200GiB"] {
        let (rcode, rout, _) = memsim(&["replay", s, "--profile", "h200", "--capacity", cap, "--json"]);
        let (ccode, cout, err) = memsim(&["colocate", s, "--profile", "h200", "--capacity", cap, "--json"]);
        let (r, v): (Value, Value) = (serde_json::from_str(&rout).unwrap(), serde_json::from_str(&cout).unwrap());
        assert_eq!((ccode, v["fits"].clone()), (rcode, r["verdict"]["fits"].clone()), "{cap}: {v} {err}");
        assert!(v["mode_reason"].as_str().unwrap().contains("one job on devices [0, 1, 2]"), "{v}");
    }
    let other = crate::snapshot_support::shared_path("MAGMA27--assignment2-systems--memory_snapshot.pickle");
    let (code, _, err) = memsim(&["colocate", s, other.to_str().unwrap(), "--capacity", "80GiB"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("uses devices [0, 1, 2]"), "{err}");
}

/// On several devices, the top-level `memory_stats` are of the device the peaks are of; they were
/// device 0's beside device 1's peak.
#[test]
fn replay_memory_stats_are_of_the_peak_device() {
    let s = crate::snapshot_support::shared_path("Constructor-Sun--code_location--memory_snapshot.pickle");
    let v = json(&["replay", s.to_str().unwrap(), "--json"]);
    assert!(v["devices"].as_array().unwrap().len() > 1);
    assert_eq!(v["memory_stats"]["reserved_bytes.all.peak"], v["peak_reserved_bytes"], "{}", v["memory_stats"]);
}

/// With a setting under which the allocator releases some segments and keeps others, the run's
/// releases are not replayed as `empty_cache` (that could fall below the run), and it is said.
#[test]
fn partial_release_settings_keep_the_recorded_releases_out() {
    let s = crate::snapshot_support::shared_path("Maphsge4--select_n--snapshot.pickle");
    let s = s.to_str().unwrap();
    let plain = json(&["replay", s, "--json"]);
    assert!(plain["recorded_releases"].as_u64().unwrap() > 0 && plain["recorded_releases_kept"] == 0, "{plain}");
    let (code, out, err) = memsim(&["replay", s, "--alloc-conf", "max_split_size_mb:200", "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (v["recorded_releases"].as_u64(), v["recorded_releases_kept"].clone()),
        (Some(0), plain["recorded_releases"].clone())
    );
    assert!(err.contains("releases of cached memory the run recorded were not replayed"), "{err}");
}

/// A run that recorded an out-of-memory error: the request it failed is in no allocation record,
/// so the replay's peak leaves it out. The need counts it, and every judging command says the run
/// ran out of memory. Before, the verdict was FITS, silently.
#[test]
fn a_recorded_out_of_memory_error_is_in_the_need_and_said() {
    let dir = tempfile::tempdir().unwrap();
    let oom = Record {
        ts_ns: None,
        tid: None,
        device: Some(0),
        event: Event::Oom(trace::Oom { size: 100 * MIB, device_free: Some(MIB), stream: 0 }),
    };
    let mut records = three_tensors();
    records.insert(3, oom);
    // Without timestamps (one job alone), and with them beside another job (the aligned replay,
    // which missed it).
    let timed = write_with(dir.path(), "timed.jsonl", &records, &[]);
    let small = write_with(dir.path(), "small.jsonl", &[alloc(1, 2 * MIB, None)], &[]);
    let (timed, small) = (timed.to_str().unwrap(), small.to_str().unwrap());
    let v = json(&["colocate", timed, small, "--json"]);
    assert_eq!(v["mode"], "timestamps", "{v}");
    let (code, out, _) = memsim(&["colocate", timed, small, "--capacity", &format!("{}B", 180 * MIB)]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("DOES NOT FIT"), "{out}");
    let t = write_logical(dir.path(), "o.jsonl", &records, &[]);
    let t = t.to_str().unwrap();
    let v = json(&["replay", t, "--json"]);
    let peak = v["peak_reserved_bytes"].as_u64().unwrap();
    // 90 MiB allocated when it failed (three 30 MiB tensors), plus the 100 MiB request.
    assert_eq!(v["recorded_oom"]["need_bytes"], 190 * MIB, "{v}");
    assert!(peak < 190 * MIB, "the peak alone is {peak}");
    for (cmd, code, out, err) in replay_and_colocate(t, 180 * MIB) {
        assert_eq!(code, 1, "{cmd}: {out}{err}");
        assert!(
            err.contains("the run ran out of memory (record 3, device 0: a request of 104857600 B"),
            "{cmd}: {err}"
        );
        assert!(out.contains("DOES NOT FIT"), "{cmd}: {out}");
    }
    // Among several files, the warning names the file that ran out of memory.
    let plain = write_logical(dir.path(), "plain.jsonl", &three_tensors(), &[]);
    let (code, _, err) = memsim(&["replay", plain.to_str().unwrap(), t]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains(&format!("memsim: warning: {t}: the run ran out of memory (record 3")), "{err}");
}

/// `r` as memory held outside the allocator: `mem` allocated or released by `api`.
fn held(r: Record, mem: MemoryKind, api: Api) -> Record {
    let mut r = r;
    match &mut r.event {
        Event::Alloc(a) => (a.mem, a.api) = (mem, api),
        Event::Free(f) => (f.mem, f.api) = (mem, api),
        _ => {}
    }
    r
}

/// `r` as a VMM physical handle's creation (`cuMemCreate`) or release (`cuMemRelease`).
fn vmm(r: Record) -> Record {
    let api = if matches!(r.event, Event::Free(_)) { Api::CuMemRelease } else { Api::CuMemCreate };
    held(r, MemoryKind::Physical, api)
}

/// 100 MiB held as a VMM handle throughout, while the job caches two 30 MiB segments and then
/// asks for 60 MiB: unlimited it reserves 120 MiB, and a limit below that frees the cache.
fn cache_beside_held() -> Vec<Record> {
    vec![
        vmm(alloc(900, 100 * MIB, None)),
        alloc(1, 30 * MIB, None),
        alloc(2, 30 * MIB, None),
        free(1),
        free(2),
        alloc(3, 60 * MIB, None),
        free(3),
        vmm(free(900)),
    ]
}

/// Device memory the trace holds outside the caching allocator (a VMM handle from cuMemCreate,
/// managed memory) is in the need: the model places none of it, and the replay said FITS on a
/// device the job had filled, silently.
#[test]
fn device_memory_held_outside_the_allocator_is_in_the_need() {
    let dir = tempfile::tempdir().unwrap();
    let mut records = three_tensors();
    records.insert(0, held(alloc(900, 200 * MIB, None), MemoryKind::Physical, Api::CuMemCreate));
    records.insert(1, held(alloc(901, 40 * MIB, None), MemoryKind::Managed, Api::CudaMallocManaged));
    // The shim records every cudaFree as device memory, managed or not.
    records.insert(2, held(free(901), MemoryKind::Device, Api::CudaFree));
    // Released, so 40 MiB more at another address is not 40 MiB more held.
    records.insert(3, held(alloc(902, 40 * MIB, None), MemoryKind::Managed, Api::CudaMallocManaged));
    records.push(held(free(902), MemoryKind::Device, Api::CudaFree));
    records.push(held(free(900), MemoryKind::Physical, Api::CuMemRelease));
    let t = write_logical(dir.path(), "t.jsonl", &records, &[]);
    let t = t.to_str().unwrap();
    let v = json(&["replay", t, "--json"]);
    assert_eq!(v["peak_reserved_bytes"], 150 * MIB, "{v}");
    assert_eq!(v["recorded_outside_bytes"], 240 * MIB, "the most held at once: {v}");
    for (cmd, code, out, err) in replay_and_colocate(t, 300 * MIB) {
        assert_eq!(code, 1, "{cmd}: 150 MiB reserved + 240 MiB held beside it: {out}{err}");
        assert!(out.contains("DOES NOT FIT") && out.contains("390.00 MiB"), "{cmd}: {out}");
        assert!(err.contains("outside the caching allocator"), "{cmd}: {err}");
    }
    // Beside the profile's library terms (which a trace of a real run never turns on), the
    // overlap is said.
    let dir2 = tempfile::tempdir().unwrap();
    let profile = dir2.path().join("p.toml");
    std::fs::write(&profile, TEST_PROFILE).unwrap();
    let both = write_logical(dir2.path(), "both.jsonl", &records, &[("uses_gemm", "true"), ("uses_conv", "false")]);
    let (_, _, err) = memsim(&["replay", both.to_str().unwrap(), "--profile", profile.to_str().unwrap()]);
    assert!(err.contains("a library's own allocations may be counted twice"), "{err}");
}

/// What a trace holds outside the allocator counts at the allocator's busiest moment, not its
/// own peak on top of the allocator's (which said DOES NOT FIT of a job that fits); and at a
/// capacity, the allocator gets what the held memory leaves, freeing its cache as a real one
/// would when `cudaMalloc` fails.
#[test]
fn memory_held_outside_counts_where_it_is_held() {
    let dir = tempfile::tempdir().unwrap();
    // 200 MiB held and released before the tensors' 150 MiB: the device holds 200 at most.
    let mut before = vec![vmm(alloc(900, 200 * MIB, None)), vmm(free(900))];
    before.extend(three_tensors());
    let t = write_logical(dir.path(), "before.jsonl", &before, &[]);
    let t = t.to_str().unwrap();
    let v = json(&["replay", t, "--json"]);
    assert_eq!(v["peak_reserved_bytes"], 150 * MIB, "{v}");
    assert_eq!(v["recorded_outside_bytes"], 200 * MIB, "{v}");
    assert_eq!(v["outside_beside_peak_bytes"], 50 * MIB, "200 at once, 150 of it the reserved peak: {v}");
    for (cmd, code, out, err) in replay_and_colocate(t, 250 * MIB) {
        assert_eq!(code, 0, "{cmd}: {out}{err}");
        assert!(out.contains("FITS") && out.contains("200.00 MiB"), "{cmd}: {out}");
    }
    // 100 MiB held throughout; the job caches two 30 MiB segments, then asks for 60 MiB.
    // Unlimited, it reserves 120 MiB (220 with the held memory); on 200 MiB the allocator has
    // 100, frees its cache at the failed cudaMalloc and goes on: 160 MiB at most.
    let held = cache_beside_held();
    let t = write_logical(dir.path(), "held.jsonl", &held, &[]);
    let t = t.to_str().unwrap();
    let v = json(&["replay", t, "--json"]);
    assert_eq!(v["peak_reserved_bytes"], 120 * MIB, "{v}");
    let cap = format!("{}B", 200 * MIB);
    let v = json(&["replay", t, "--capacity", &cap, "--json"]);
    assert_eq!(v["peak_reserved_bytes"], 60 * MIB, "the cache freed at the held memory's limit: {v}");
    assert_eq!(v["verdict"]["need_bytes"], 160 * MIB, "{v}");
    assert_eq!(v["verdict"]["fits"], true, "{v}");
    let (code, out, err) = memsim(&["colocate", t, "--capacity", &cap]);
    assert_eq!(code, 0, "one job is its replay: {out}{err}");
}

/// A program that resets the peak statistics (after a warm-up, or to log each step) made the
/// replay's peak the one since the reset: a phase of 100 MiB before an `empty_cache` and a
/// reset was a need of 10 MiB, an underestimate a scheduler would act on.
#[test]
fn a_reset_of_the_peak_statistics_is_not_a_smaller_need() {
    let dir = tempfile::tempdir().unwrap();
    let ctl = |op| Record { ts_ns: None, tid: None, device: Some(0), event: Event::Control(Control { op }) };
    let records = vec![
        alloc(1, 100 * MIB, None),
        free(1),
        ctl(ControlOp::EmptyCache),
        ctl(ControlOp::ResetPeakStats),
        alloc(2, 10 * MIB, None),
        free(2),
    ];
    let t = write_logical(dir.path(), "reset.jsonl", &records, &[]);
    let t = t.to_str().unwrap();
    let v = json(&["replay", t, "--json"]);
    assert_eq!(v["peak_reserved_bytes"], 100 * MIB, "{v}");
    assert_eq!(v["peak_allocated_bytes"], 100 * MIB, "{v}");
    assert_eq!(v["peak_resets"], 1, "{v}");
    let (code, out, err) = memsim(&["replay", t, "--capacity", "64MiB"]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(err.contains("resets the peak statistics 1 times"), "{err}");
}

/// Beside another job on one time axis, a job's memory held outside its allocator is its own:
/// its allocator gets the capacity less the other job and less that memory, and frees its cache
/// at that limit; the combined need counts the held memory at its moments.
#[test]
fn colocate_aligned_counts_each_jobs_held_memory_at_its_moments() {
    let dir = tempfile::tempdir().unwrap();
    let at = |r: Record, ts: u64| Record { ts_ns: Some(ts), ..r };
    let a = cache_beside_held();
    let a: Vec<Record> = a.into_iter().zip(1..).map(|(r, ts)| at(r, ts)).collect();
    let a = write_trace(dir.path(), "a.jsonl", &a);
    let b = write_trace(dir.path(), "b.jsonl", &[at(alloc(50, 2 * MIB, None), 1)]);
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
    let v = json(&["colocate", a, b, "--capacity", "200MiB", "--json"]);
    assert_eq!(v["mode"], "timestamps", "{v}");
    // b's 2 MiB request takes a 20 MiB segment. a's allocator has 200 - 20 - 100 = 80 MiB: at
    // the 60 MiB request it frees its two cached 30 MiB segments. At most 60 reserved + 100
    // held + b's 20.
    assert_eq!(v["combined_need_bytes"], 180 * MIB, "{v}");
    assert_eq!(v["fits"], true, "{v}");
    // Unlimited, a would reserve 120 MiB beside its 100 held: 240 MiB with b.
    let v = json(&["colocate", a, b, "--json"]);
    assert_eq!(v["combined_need_bytes"], 240 * MIB, "{v}");
}

/// `--capacity 100TiB` beside a profile of a 1 GiB GPU (a unit typed wrong, or another GPU)
/// was judged in silence.
#[test]
fn a_capacity_past_the_profiles_gpu_is_said() {
    let dir = tempfile::tempdir().unwrap();
    let profile = dir.path().join("p.toml");
    std::fs::write(&profile, TEST_PROFILE).unwrap();
    let t = write_logical(dir.path(), "t.jsonl", &three_tensors(), &[]);
    let (t, p) = (t.to_str().unwrap(), profile.to_str().unwrap());
    for cmd in ["replay", "colocate"] {
        let (code, out, err) = memsim(&[cmd, t, "--profile", p, "--capacity", "2GiB"]);
        assert_eq!(code, 0, "{cmd}: {out}{err}");
        assert!(
            err.contains("--capacity 2048.00 MiB is more than the profile's GPU (test) has in all"),
            "{cmd}: {err}"
        );
        let (_, _, err) = memsim(&[cmd, t, "--profile", p, "--capacity", "512MiB"]);
        assert!(!err.contains("is more than the profile's GPU"), "{cmd}: {err}");
    }
    // `profile --capacity` checks a capacity as those commands read it, and says it too.
    for json in [&[][..], &["--json"][..]] {
        let (code, out, err) = memsim(&[&["profile", p, "--capacity", "2GiB"][..], json].concat());
        assert_eq!(code, 0, "{out}{err}");
        assert!(err.contains("--capacity 2048.00 MiB is more than the profile's GPU (test) has in all"), "{err}");
        let (_, _, err) = memsim(&[&["profile", p, "--capacity", "512MiB"][..], json].concat());
        assert!(!err.contains("is more than"), "{err}");
    }
}

/// PyTorch writes a free with the requested size of its alloc: a symbolic trace's free carries
/// the rounded block size, and the exported snapshot freed a 1000-byte alloc as 1024 bytes
/// (memory_viz then rebuilt past states at the wrong size).
#[test]
fn an_exported_free_has_the_size_of_its_alloc() {
    let dir = tempfile::tempdir().unwrap();
    let mut f = free(1);
    if let Event::Free(x) = &mut f.event {
        x.size = Some(1024);
    }
    let t = write_logical(dir.path(), "t.jsonl", &[alloc(1, 1000, None), f], &[]);
    let out = dir.path().join("t.pickle");
    let (code, _, err) = memsim(&["convert", t.to_str().unwrap(), out.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let snap = simulator::snapshot::read_snapshot(&out).unwrap();
    let sizes: Vec<(String, u64)> = snap.device_traces[0]
        .iter()
        .map(|e| (format!("{:?}", e.action), e.size))
        .filter(|(a, _)| !a.starts_with("Segment"))
        .collect();
    assert_eq!(
        sizes,
        [("Alloc".to_string(), 1000), ("FreeRequested".to_string(), 1000), ("FreeCompleted".to_string(), 1000)],
        "{err}"
    );
}

/// An output that is the input destroyed it (`report T --html T` left a page where the trace
/// was; `convert T T` rewrote it while reading it); a page named other than .html was written.
#[test]
fn an_output_that_is_the_input_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let t = write_logical(dir.path(), "t.jsonl", &three_tensors(), &[]);
    let before = std::fs::read(&t).unwrap();
    let link = dir.path().join("link.jsonl");
    std::os::unix::fs::symlink(&t, &link).unwrap();
    let (t, l) = (t.to_str().unwrap(), link.to_str().unwrap());
    for args in [vec!["convert", t, t], vec!["convert", t, l], vec!["report", t, "--html", t]] {
        let (code, _, err) = memsim(&args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains("the output is the input file") || err.contains("ending in .html"), "{args:?}: {err}");
    }
    assert_eq!(std::fs::read(t).unwrap(), before, "the input was changed");
    let page = dir.path().join("t.html");
    std::fs::write(&page, "x").unwrap();
    let (code, _, err) = memsim(&["report", page.to_str().unwrap(), "--html", page.to_str().unwrap()]);
    assert!(code == 2 && err.contains("the output is the input file"), "{err}");
    let (code, _, err) = memsim(&["report", t, "--html", dir.path().join("r.txt").to_str().unwrap()]);
    assert!(code == 2 && err.contains("expected a file name ending in .html"), "{err}");
    // A folder, or a folder that does not exist: said before the replay.
    let folder = dir.path().join("d.html");
    std::fs::create_dir(&folder).unwrap();
    let missing = dir.path().join("no").join("r.html");
    for (out, says) in [(&folder, "a folder; expected a file name"), (&missing, "does not exist")] {
        let (code, _, err) = memsim(&["report", t, "--html", out.to_str().unwrap()]);
        assert!(code == 2 && err.contains(says) && !err.contains("warning"), "{says}: {err}");
    }
    // A symbolic trace's timestamps are event numbers: the Perfetto export says so, not "µs".
    let json_out = dir.path().join("t.json");
    let (code, _, err) = memsim(&["convert", t, json_out.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&json_out).unwrap()).unwrap();
    assert!(v["metadata"]["time_axis"].as_str().unwrap().contains("event numbers"), "{}", v["metadata"]);
    // A snapshot has no place for categories and markers: said.
    let out = dir.path().join("t.pickle");
    let (code, _, err) = memsim(&["convert", t, out.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("keeps no allocation category and no marker: 4 categorized allocations"), "{err}");
}

/// A run that recorded an empty allocator setting printed `alloc conf` with nothing after it.
#[test]
fn an_empty_alloc_conf_is_said_to_be_the_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let t = write_logical(dir.path(), "t.jsonl", &three_tensors(), &[]);
    let (code, out, err) = memsim(&["replay", t.to_str().unwrap(), "--alloc-conf", ""]);
    assert_eq!(code, 0, "{err}");
    // Given on the command line, the line says so: the recorded settings are not these.
    assert!(out.contains("  alloc conf          (none set: PyTorch's defaults; from --alloc-conf)\n"), "{out}");
    let (_, out, _) = memsim(&["replay", t.to_str().unwrap(), "--alloc-conf", "expandable_segments:True"]);
    assert!(out.contains("  alloc conf          expandable_segments:True (from --alloc-conf)\n"), "{out}");
}

/// A need one byte over the capacity printed as MiB reads as two equal numbers beside DOES NOT
/// FIT: such a pair is printed in bytes, in every verdict line.
#[test]
fn a_verdict_never_stands_beside_two_equal_numbers() {
    let dir = tempfile::tempdir().unwrap();
    let t = write_logical(dir.path(), "t.jsonl", &[alloc(1, 30 * MIB, None)], &[]);
    for (cmd, code, out, _) in replay_and_colocate(t.to_str().unwrap(), 30 * MIB - 1) {
        assert_eq!(code, 1, "{cmd}: {out}");
        let needs = format!("needs {} B", 30 * MIB);
        assert!(out.contains(&needs) && out.contains(&format!("{} B", 30 * MIB - 1)), "{cmd}: {out}");
    }
}

/// `validate --capacity` below what the run itself held, or with no recorded release for it to
/// predict, was taken without a word. Below the run's own peak there is no run to validate: a
/// warning there stood beside EXACT on a device smaller than what the run held, and beside a
/// MISMATCH the impossible capacity caused.
#[test]
fn validate_says_what_a_capacity_cannot_do() {
    let snap = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/snapshots/rebuild_native.pickle");
    let snap = snap.to_str().unwrap();
    let (code, out, err) = memsim(&["validate", snap, "--capacity", "2MiB"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--capacity 2.00 MiB: below the run's recorded peak reserved (34.00 MiB)"), "{err}");
    assert!(out.is_empty(), "no verdict: {out}");
    let (code, _, err) = memsim(&["validate", snap, "--capacity", "34MiB"]);
    assert_eq!(code, 0, "at the run's own peak: {err}");
    let (code, _, err) = memsim(&["validate", snap, "--capacity", "80GiB"]);
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("below the run's"), "{err}");
    let (_, _, plain) = memsim(&["validate", snap]);
    assert!(!plain.contains("--capacity"), "no flag, nothing said: {plain}");
    // A real run that released nothing: there is no burst for a capacity to predict.
    let real = crate::snapshot_support::shared_path("MAGMA27--assignment2-systems--memory_snapshot.pickle");
    let (code, _, err) = memsim(&["validate", real.to_str().unwrap(), "--capacity", "80GiB"]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("--capacity has nothing to predict: the snapshot records no segment_free"), "{err}");
    // A trace records no placement to validate against: said as such, not as a pickle opcode.
    let dir = tempfile::tempdir().unwrap();
    let t = write_trace(dir.path(), "t.mtrace", &three_tensors());
    let (code, _, err) = memsim(&["validate", t.to_str().unwrap()]);
    assert!(code == 2 && err.contains("a trace, not a snapshot") && err.contains("memsim replay"), "{err}");
    // Named as a trace and not one: a snapshot renamed .mtrace, and a folder, were both "a
    // trace" too.
    let renamed = dir.path().join("snap.mtrace");
    std::fs::copy(snap, &renamed).unwrap();
    let folder = dir.path().join("adir.mtrace");
    std::fs::create_dir(&folder).unwrap();
    for (path, expect) in [(&renamed, "starts as a Python pickle does"), (&folder, "Is a directory")] {
        let (code, _, err) = memsim(&["validate", path.to_str().unwrap()]);
        assert!(
            code == 2 && err.contains("named as a trace, and cannot be read as one") && err.contains(expect),
            "{err}"
        );
        assert!(!err.contains("a trace, not a snapshot"), "{err}");
    }
    // A stream named as a trace is not opened to find out: that waited for a writer forever.
    let fifo = dir.path().join("f.mtrace");
    assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_memsim"))
        .args(["validate", fifo.to_str().unwrap()])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let waited = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if waited.elapsed() > std::time::Duration::from_secs(30) {
            child.kill().unwrap();
            panic!("validate of a FIFO still waits after 30 s");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert!(status.code() == Some(2) && err.contains("a trace, not a snapshot"), "{err}");
}

/// On several GPUs the peak of live bytes is of all of them at once, and says so: it read as one
/// device holding 105 GiB.
#[test]
fn stats_says_a_peak_summed_over_devices() {
    let snap = crate::snapshot_support::shared_path("Constructor-Sun--code_location--memory_snapshot.pickle");
    let (code, out, err) = memsim(&["stats", snap.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("B, summed over the trace's devices)"), "{out}");
    let one = crate::snapshot_support::shared_path("MAGMA27--assignment2-systems--memory_snapshot.pickle");
    let (_, out, _) = memsim(&["stats", one.to_str().unwrap()]);
    assert!(out.contains("peak live device") && !out.contains("summed over"), "{out}");
}

/// An allocation at an address whose block the trace never freed (a missed free): replay and
/// stats both keep the earlier block live, and say so. Both were silent.
#[test]
fn an_allocation_over_a_live_address_is_said() {
    let dir = tempfile::tempdir().unwrap();
    let t = write_trace(dir.path(), "t.jsonl", &[alloc(1, 30 * MIB, None), alloc(1, 10 * MIB, None), free(1)]);
    let t = t.to_str().unwrap();
    let (code, out, err) = memsim(&["replay", t, "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!((v["allocations_over_live"].as_u64(), v["peak_allocated_bytes"].as_u64()), (Some(1), Some(40 * MIB)));
    assert!(
        err.contains("1 allocations at an address whose block the trace never freed (the first: record 1"),
        "{err}"
    );
    let v = json(&["stats", t, "--json"]);
    assert_eq!((v["allocs_over_live"].as_u64(), v["live_device_bytes"].as_u64()), (Some(1), Some(30 * MIB)), "{v}");
}

/// A request no device holds (past the model's largest segment) fails even in the unlimited
/// replay, so the peak never counts it: the verdict rests on what the failed request needed, and
/// cannot say FITS above the line saying the allocation fails.
#[test]
fn an_allocation_that_fails_everywhere_is_in_the_need() {
    let dir = tempfile::tempdir().unwrap();
    let t = write_trace(dir.path(), "huge.jsonl", &[alloc(1, 30 * MIB, None), alloc(2, 1 << 50, None)]);
    let t = t.to_str().unwrap();
    let (code, out, _) = memsim(&["replay", t, "--capacity", "40GiB", "--json"]);
    assert_eq!(code, 1, "{out}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["verdict"]["fits"], false, "{v}");
    assert!(v["verdict"]["need_bytes"].as_u64().unwrap() >= 1 << 50, "{v}");
    assert_eq!(v["peak_reserved_bytes"], 30 * MIB, "the failed request is not in the peak");
    assert_eq!(v["oom_need_bytes"], 30 * MIB + (1u64 << 50), "{v}");
    let (_, text, _) = memsim(&["replay", t, "--capacity", "40GiB"]);
    assert!(text.contains("DOES NOT FIT") && text.contains("replayed at the budget, it fails at record 1"), "{text}");
    // Without a capacity the failure is said too: the text showed a peak of 30 MiB and nothing
    // else, and the JSON said "oom": false beside the failed request's need.
    let v = json(&["replay", t, "--json"]);
    assert_eq!((v["oom"].as_bool(), v["oom_at_event"].as_u64()), (Some(true), Some(1)), "{v}");
    let (code, text, _) = memsim(&["replay", t]);
    assert_eq!(code, 0, "no capacity, no verdict");
    assert!(text.contains("fails at record 1, whatever the capacity") && text.contains("at least"), "{text}");
}

/// The model follows the native caching allocator; a run under `backend:cudaMallocAsync` (given
/// as a flag, or recorded in the trace's environment) is replayed by those rules, and said so.
#[test]
fn the_cuda_malloc_async_backend_is_replayed_as_native_with_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let plain = write_trace(dir.path(), "t.jsonl", &three_tensors());
    let mut h = Header::new("test", "0", Level::Allocator);
    h.synthetic_addresses = true;
    h.env.insert("PYTORCH_CUDA_ALLOC_CONF".into(), "backend:cudaMallocAsync".into());
    let recorded = write_records(dir.path(), "async.jsonl", &h, &three_tensors());
    let said = "backend:cudaMallocAsync is not modelled";
    let (code, _, err) = memsim(&["replay", plain.to_str().unwrap(), "--alloc-conf", "backend:cudaMallocAsync"]);
    assert!(code == 0 && err.contains(said), "{err}");
    let (code, _, err) = memsim(&["replay", plain.to_str().unwrap(), "--alloc-conf", "backend:native"]);
    assert!(code == 0 && !err.contains(said), "{err}");
    let v = json(&["colocate", recorded.to_str().unwrap(), "--context", "0", "--json"]);
    assert!(v["warnings"].as_array().unwrap().iter().any(|w| w.as_str().unwrap().contains(said)), "{v}");
}

/// `TEST_PROFILE` written to `dir`, and the three tensors as a logical trace that loads cuBLAS.
fn profile_and_gemm_trace(dir: &Path) -> (PathBuf, PathBuf) {
    let profile = dir.join("p.toml");
    std::fs::write(&profile, TEST_PROFILE).unwrap();
    let t = write_logical(dir, "t.jsonl", &three_tensors(), &[("uses_gemm", "true"), ("uses_conv", "false")]);
    (profile, t)
}

/// A symbolic trace taken to memory_viz's `.pickle` and back keeps its header: still symbolic
/// (a margin), still loading cuBLAS. Before, it came back as a real run's measurement.
#[test]
fn a_symbolic_trace_through_a_snapshot_is_still_symbolic() {
    let dir = tempfile::tempdir().unwrap();
    let (profile, t) = profile_and_gemm_trace(dir.path());
    let p = profile.to_str().unwrap();
    let pickle = dir.path().join("t.pickle");
    let (code, _, err) = memsim(&["convert", t.to_str().unwrap(), pickle.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let direct = json(&["replay", t.to_str().unwrap(), "--profile", p, "--json"]);
    let through = json(&["replay", pickle.to_str().unwrap(), "--profile", p, "--json"]);
    for k in ["peak_device_bytes", "peak_device_safe_bytes"] {
        assert_eq!(direct[k], through[k], "{k}: {through}");
    }
    assert_eq!(direct["outside_allocator"]["libraries"], through["outside_allocator"]["libraries"]);
    assert_eq!(direct["margin"]["note"], through["margin"]["note"]);
}

#[test]
fn replay_capacity_is_the_device_total_with_the_profile_subtracted() {
    let dir = tempfile::tempdir().unwrap();
    let (profile, t) = profile_and_gemm_trace(dir.path());
    let p = profile.to_str().unwrap();
    let t = t.to_str().unwrap();
    // 150 MiB reserved + 110 MiB outside (context + cuBLAS) = 260 MiB on the device.
    let v = json(&["replay", t, "--profile", p, "--capacity", "260MiB", "--json"]);
    assert_eq!(v["peak_device_bytes"], 260 * MIB);
    assert_eq!(v["capacity"]["bytes"], 260 * MIB);
    assert_eq!(v["allocator_budget_bytes"], 150 * MIB);
    assert_eq!(v["outside_allocator"]["total_bytes"], 110 * MIB);
    assert_eq!(v["verdict"]["fits"], true);
    // At 259 MiB the failed cudaMalloc releases the cached 30 MiB segment and retries: 120 MiB
    // reserved + 110 MiB outside fits.
    let v = json(&["replay", t, "--profile", p, "--capacity", "259MiB", "--json"]);
    assert_eq!((v["verdict"]["fits"].as_bool(), v["peak_device_bytes"].as_u64()), (Some(true), Some(230 * MIB)));
    let (code, out, _) = memsim(&["replay", t, "--profile", p, "--capacity", "229MiB", "--json"]);
    assert_eq!(code, 1, "does not fit: exit 1");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["verdict"]["fits"], false);
    assert_eq!(v["verdict"]["need_bytes"], 260 * MIB, "what it would have needed");
    // The default capacity is the profile's total memory.
    let v = json(&["replay", t, "--profile", p, "--json"]);
    assert_eq!(v["capacity"]["bytes"], 1u64 << 30);
    assert_eq!(v["capacity"]["source"], "profile");
    // Sizes are accepted in MiB as well as GiB; a size without a unit is bytes.
    let v = json(&["replay", t, "--profile", p, "--capacity", "1GiB", "--json"]);
    assert_eq!(v["capacity"]["bytes"], 1u64 << 30);
    let (code, _, err) = memsim(&["replay", t, "--capacity", "40 furlongs"]);
    assert_eq!(code, 2);
    assert!(err.contains("furlongs"), "{err}");
    // Text output says what its peaks count and gives the verdict.
    let (_, out, _) = memsim(&["replay", t, "--profile", p, "--capacity", "229MiB"]);
    assert!(out.contains("peaks:") && out.contains("DOES NOT FIT"), "{out}");
}

#[test]
fn truncated_and_unknown_input_is_never_silent() {
    let dir = tempfile::tempdir().unwrap();
    let t = write_trace(dir.path(), "t.mtrace", &three_tensors());
    let bytes = std::fs::read(&t).unwrap();
    let cut = dir.path().join("cut.mtrace");
    std::fs::write(&cut, &bytes[..bytes.len() - 3]).unwrap();
    let cut = cut.to_str().unwrap();
    for cmd in ["replay", "stats"] {
        let (code, _, err) = memsim(&[cmd, cut]);
        assert_eq!(code, 0, "{cmd}: {err}");
        assert!(err.contains("cut.mtrace: truncated") && err.contains("after byte"), "{cmd}: {err}");
        let (code, _, err) = memsim(&[cmd, cut, "--strict"]);
        assert_eq!(code, 2, "{cmd} --strict: {err}");
        assert!(err.contains("--strict"), "{err}");
    }
    let out = dir.path().join("out.jsonl");
    let (code, _, err) = memsim(&["convert", cut, out.to_str().unwrap(), "--strict"]);
    assert_eq!(code, 2, "{err}");
    assert!(!out.exists(), "no partial output");
    // Without --strict, every record before the cut is converted.
    let (code, _, err) = memsim(&["convert", cut, out.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("input was truncated"), "{err}");
    let got: Vec<Record> = trace::Reader::open(&out).unwrap().collect::<Result<_, _>>().unwrap();
    let whole = three_tensors();
    assert_eq!(got, whole[..whole.len() - 1]);
    // JSON Lines cut mid-line.
    let j = write_trace(dir.path(), "t.jsonl", &three_tensors());
    let text = std::fs::read_to_string(&j).unwrap();
    let cutj = dir.path().join("cut.jsonl");
    std::fs::write(&cutj, &text[..text.len() - 20]).unwrap();
    let (code, out, err) = memsim(&["replay", cutj.to_str().unwrap(), "--json"]);
    assert_eq!(code, 0);
    assert!(err.contains("truncated"), "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert!(v["warnings"][0].as_str().unwrap().contains("truncated"));
    // An unknown record kind is counted and warned about.
    let mut lines: Vec<&str> = text.lines().collect();
    let odd = r#"{"kind":"from_the_future","ts_ns":5}"#;
    lines.insert(2, odd);
    let unk = dir.path().join("unknown.jsonl");
    std::fs::write(&unk, lines.join("\n") + "\n").unwrap();
    let (code, _, err) = memsim(&["replay", unk.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("1 records of kinds this version does not know"), "{err}");
    // A bad record mid-file: the file named once, the line counted as the file counts it.
    lines[2] = r#"{"kind":"alloc", bad"#;
    let broken = dir.path().join("broken.jsonl");
    std::fs::write(&broken, lines.join("\n") + "\n").unwrap();
    let (code, _, err) = memsim(&["replay", broken.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert_eq!(err.matches("broken.jsonl").count(), 1, "{err}");
    assert!(err.contains("after 1 whole records") && err.contains("line 3"), "{err}");
}

#[test]
fn profile_command_reads_profiles_once_for_everyone() {
    let dir = tempfile::tempdir().unwrap();
    let profile = dir.path().join("p.toml");
    std::fs::write(&profile, format!("{TEST_PROFILE}[provenance]\nunmeasured = [\"outside_allocator.cublas_mib\"]\n"))
        .unwrap();
    let p = profile.to_str().unwrap();
    let v = json(&["profile", p, "--json"]);
    assert_eq!(v["name"], "p");
    assert_eq!(v["gpu"]["compute_capability"], serde_json::json!([8, 0]));
    assert_eq!(v["derived"]["cublas_workspace_bytes"], 8 * MIB);
    // A missing cublaslt_per_call means false: no per-call Lt workspace.
    assert_eq!(v["workspace"]["cublaslt_per_call"], false);
    assert_eq!(v["derived"]["cublaslt_workspace_bytes"], 0);
    // A missing cudnn_workspace_factor means the tracer's 1.0.
    assert_eq!(v["derived"]["cudnn_workspace_factor"], 1.0);
    assert_eq!(v["provenance"]["unmeasured"][0], "outside_allocator.cublas_mib");
    // Using the unmeasured constant warns; a job without GEMMs does not use it.
    let gemm = write_logical(dir.path(), "g.jsonl", &three_tensors(), &[("uses_gemm", "true")]);
    let (_, _, err) = memsim(&["replay", gemm.to_str().unwrap(), "--profile", p]);
    assert!(err.contains("outside_allocator.cublas_mib is marked unmeasured"), "{err}");
    let plain = write_logical(dir.path(), "n.jsonl", &three_tensors(), &[("uses_gemm", "false")]);
    let (_, _, err) = memsim(&["replay", plain.to_str().unwrap(), "--profile", p]);
    assert!(!err.contains("unmeasured"), "{err}");
    // A folder given as the profile is named as one, not "not found" (it exists).
    let folder = dir.path().to_str().unwrap();
    let (code, _, err) = memsim(&["profile", folder]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("not a file") && err.contains("a100-40gb") && !err.contains("not found"), "{err}");
    // A typo in [provenance] is an error naming the key.
    std::fs::write(&profile, format!("{TEST_PROFILE}[provenance]\nunmeasured = [\"outside.cublas\"]\n")).unwrap();
    let (code, _, err) = memsim(&["profile", p]);
    assert_eq!(code, 2);
    assert!(err.contains("outside.cublas") && err.contains("provenance"), "{err}");
    // A constant larger than the whole GPU (1 GiB here) is refused, naming it: 1e30 MiB turned
    // into u64::MAX bytes and wrapped the sums it entered, to a FITS below the stock profile's.
    for (from, to) in [("context_mib = 100.0", "context_mib = 1e30"), ("cudnn_mib = 1.0", "cudnn_mib = 1025")] {
        std::fs::write(&profile, TEST_PROFILE.replace(from, to)).unwrap();
        let (code, _, err) = memsim(&["profile", p]);
        assert_eq!(code, 2, "{to}: {err}");
        let key = to.split(' ').next().unwrap();
        assert!(
            err.contains(&format!("outside_allocator.{key}")) && err.contains("more than the GPU's whole memory"),
            "{err}"
        );
    }
    // Software versions are checked as the allocator field is: "banana" was shown as torch
    // banana, and an allocator version torch's does not imply replayed one release's rules
    // under another's name.
    for (from, to, expect) in [
        ("torch = \"2.9\"", "torch = \"banana\"", "software.torch = \"banana\": invalid PyTorch version"),
        ("torch = \"2.9\"", "torch = \"1.13\"", "software.torch = \"1.13\": PyTorch version \"1.13\" is older than 2.4"),
        (
            "torch = \"2.9\"",
            "torch = \"2.4.1\"",
            "software.allocator = \"2.9\" does not match software.torch = \"2.4.1\", whose allocator rules are the 2.4 \
             family's: expected \"2.4\"",
        ),
        ("cuda = \"13.0\"", "cuda = \"twelve\"", "software.cuda = \"twelve\": expected a version number"),
        ("cuda = \"13.0\"", "cuda = \"13.0\"\ncudnn = \"9.x\"", "software.cudnn = \"9.x\": expected a version number"),
    ] {
        assert!(TEST_PROFILE.contains(from), "{from}");
        std::fs::write(&profile, TEST_PROFILE.replace(from, to)).unwrap();
        let (code, _, err) = memsim(&["profile", p]);
        assert!(code == 2 && err.contains(expect), "{to}: {code} {err}");
    }
    // A later release of a family, and a local build's suffix, are one of its versions.
    for (torch, allocator) in [("2.6.0+cu124", "2.5"), ("2.15", "2.9"), ("2.4.1", "2.4")] {
        let text = TEST_PROFILE
            .replace("torch = \"2.9\"", &format!("torch = \"{torch}\""))
            .replace("allocator = \"2.9\"", &format!("allocator = \"{allocator}\""));
        std::fs::write(&profile, text).unwrap();
        let (code, _, err) = memsim(&["profile", p]);
        assert_eq!(code, 0, "torch {torch}: {err}");
    }
    // The shipped profiles load, and the H200's placeholders are declared.
    let h200 = json(&["profile", "h200", "--json"]);
    assert!(h200["provenance"]["unmeasured"].as_array().unwrap().len() >= 3, "{h200}");
}

/// A snapshot with no events is its start state alone: its peak is there, and so is the picture
/// at the peak (before, it was taken only at a request, and read 0 segments beside 104 MiB).
#[test]
fn a_trace_that_is_only_its_start_state_has_a_picture_at_its_peak() {
    let snap = crate::snapshot_support::shared_path("Charran78--DocuBox--dump_snapshot.pickle");
    let v = json(&["replay", snap.to_str().unwrap(), "--json"]);
    assert_eq!(v["requests"], 0, "no events: {v}");
    let at = &v["devices"][0]["at_peak"];
    assert!(v["peak_reserved_bytes"].as_u64().unwrap() > 0);
    assert!(at["segments"].as_u64().unwrap() > 0, "{at}");
    let r = json(&["report", snap.to_str().unwrap(), "--json"]);
    assert_eq!(at["segments"], r["segments_at_peak"], "replay and report see the same peak");
}

#[test]
fn stats_and_replay_say_why_their_peaks_differ_on_a_converted_snapshot() {
    let snap = crate::snapshot_support::shared_path("bcrafton--assignment2-systems--memory_snapshot.pickle");
    let s = json(&["stats", snap.to_str().unwrap(), "--json"]);
    let start = s["start_state_allocated_bytes"].as_u64().unwrap();
    assert!(start > 0, "the snapshot began with blocks allocated: {s}");
    assert!(s["peak_live_device_counts"].as_str().unwrap().contains("before the trace began"));
    let (_, out, _) = memsim(&["stats", snap.to_str().unwrap()]);
    assert!(out.contains("alive when the trace began"), "{out}");
    let r = json(&["replay", snap.to_str().unwrap(), "--json"]);
    assert!(r["peaks_count"].as_str().unwrap().contains("start state"));
    // Replay's peak counts the start state that stats' does not.
    assert!(r["peak_allocated_bytes"].as_u64().unwrap() > s["peak_live_device_bytes"].as_u64().unwrap());
}

/// A trace of 1 MiB or more is decoded on a second thread, in batches (`input::pipelined`); in a
/// many-file command each file is read on its own thread, record by record. Both give the same
/// report, the same truncation warning, and the same error for a frame that does not decode.
#[test]
fn a_large_trace_reads_the_same_on_a_decoding_thread() {
    let dir = tempfile::tempdir().unwrap();
    let mut recs = Vec::new();
    for i in 0..60_000u64 {
        let cat = [None, Some(Category::Activation), Some(Category::Gradient)][(i % 3) as usize];
        recs.push(alloc(0x1000 * (i + 1), (i * 7919 % 5000 + 1) * 512, cat));
        if i >= 16 {
            recs.push(free(0x1000 * (i - 15)));
        }
    }
    let big = write_trace(dir.path(), "big.mtrace", &recs);
    let bytes = std::fs::read(&big).unwrap();
    assert!(bytes.len() > 1 << 20, "the trace must reach the decoding thread's threshold");
    let small = write_trace(dir.path(), "small.mtrace", &three_tensors());
    let small = small.to_str().unwrap();
    let cut = dir.path().join("cut.mtrace");
    std::fs::write(&cut, &bytes[..bytes.len() - 3]).unwrap();
    // A whole frame (tag 1, two body bytes) whose record prefix sets reserved bits, then bytes
    // that must never be read.
    let bad = dir.path().join("bad.mtrace");
    std::fs::write(&bad, [&bytes[..], &[1, 2, 0xff, 0], &bytes[bytes.len() - 100..]].concat()).unwrap();
    for cmd in ["replay", "stats"] {
        for file in [&big, &cut] {
            let f = file.to_str().unwrap();
            let (code, out, err) = memsim(&[cmd, f, "--json"]);
            assert_eq!(code, 0, "{cmd} {f}: {err}");
            let alone: Value = serde_json::from_str(&out).unwrap();
            let batch = json(&[cmd, f, small, "--json"]);
            assert_eq!(batch[0], alone, "{cmd} {f}: on the decoding thread and off it");
            assert_eq!(err.contains("cut.mtrace: truncated"), *file == cut, "{cmd} {f}: {err}");
        }
        let (code, _, err) = memsim(&[cmd, bad.to_str().unwrap()]);
        assert_eq!(code, 2, "{cmd}: {err}");
        let at = format!("corrupt trace frame at byte {}", bytes.len());
        assert!(err.contains("bad.mtrace") && err.contains(&at) && err.contains("reserved bits"), "{cmd}: {err}");
        let (code, out, _) = memsim(&[cmd, bad.to_str().unwrap(), small, "--json"]);
        assert_eq!(code, 2);
        let batch: Value = serde_json::from_str(&out).unwrap();
        assert!(batch[0]["error"].as_str().unwrap().contains(&at), "{cmd}: {batch}");
        // Among several files an error's causes are said once each, as for one file.
        let pickle = dir.path().join("bad.pickle");
        std::fs::write(&pickle, b"garbage").unwrap();
        let (code, _, err) = memsim(&[cmd, pickle.to_str().unwrap(), small]);
        assert_eq!(code, 2);
        assert_eq!(err.matches("unsupported opcode").count(), 1, "{cmd}: {err}");
    }
    assert_eq!(json(&["stats", big.to_str().unwrap(), "--json"])["events"], recs.len());
    // With a budget the batches reach the capped replay as single records do, whether it runs
    // out of memory mid-trace (exit 1) or fits.
    let f = big.to_str().unwrap();
    let peak = json(&["replay", f, "--json"])["peak_reserved_bytes"].as_u64().unwrap();
    for (cap, fits) in [(peak / 2, false), (peak * 2, true)] {
        let cap = cap.to_string();
        let (code, out, err) = memsim(&["replay", f, "--capacity", &cap, "--json"]);
        assert_eq!(code, if fits { 0 } else { 1 }, "--capacity {cap}: {err}");
        let alone: Value = serde_json::from_str(&out).unwrap();
        assert_eq!((alone["oom"].as_bool(), alone["verdict"]["fits"].as_bool()), (Some(!fits), Some(fits)), "{cap}");
        let (_, out, _) = memsim(&["replay", f, small, "--capacity", &cap, "--json"]);
        let batch: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(batch[0], alone, "--capacity {cap}: on the decoding thread and off it");
    }
}

/// `memsim stats t | head -c0`: a reader that goes away ends the binary as it ends other tools
/// (by SIGPIPE, which `exit::process_main` restores; or exit 0 when its output fit the pipe
/// first), never with an error message. The in-process path (SIGPIPE ignored, a `BrokenPipe`
/// error) is the unit test in `exit.rs`.
#[test]
fn a_closed_pipe_ends_quietly() {
    use std::os::unix::process::ExitStatusExt;
    let dir = tempfile::tempdir().unwrap();
    let t = write_trace(dir.path(), "t.jsonl", &three_tensors());
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_memsim"))
        .args(["stats", t.to_str().unwrap(), t.to_str().unwrap(), t.to_str().unwrap()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() || out.status.signal() == Some(libc::SIGPIPE), "{:?}: {stderr}", out.status);
    assert!(!stderr.contains("error"), "{stderr}");
}

/// A real run's trace from another GPU architecture was judged on the profile in silence.
#[test]
fn a_trace_recorded_on_another_gpu_is_said_to_be() {
    let dir = tempfile::tempdir().unwrap();
    let trace = |name: &str, device: &str| {
        let p = dir.path().join(name);
        let header = format!(
            "{{\"kind\":\"header\",\"format_version\":1,\"producer\":{{\"name\":\"hand\",\"version\":\"1\"}},\
             \"level\":\"allocator\",\"caching_disabled\":false,\"synthetic_addresses\":true,\"devices\":[{device}]}}"
        );
        let alloc = "{\"ts_ns\":1,\"device\":0,\"kind\":\"alloc\",\"addr\":1,\"size\":1048576,\"stream\":0,\
                     \"mem\":\"device\",\"api\":\"allocator\",\"result\":0,\"origin\":\"request\"}";
        std::fs::write(&p, format!("{header}\n{alloc}\n")).unwrap();
        p
    };
    let said = "the trace was recorded on";
    for (device, warns) in [
        (r#"{"index":0,"name":"NVIDIA H100 80GB HBM3","compute_capability":[9,0]}"#, true),
        (r#"{"index":0,"name":"NVIDIA A100-PCIE-40GB","compute_capability":[8,0]}"#, false),
        (r#"{"index":0,"name":"NVIDIA A100-SXM4-40GB"}"#, false),
        (r#"{"index":0,"name":"Tesla T4"}"#, true),
    ] {
        let t = trace("t.jsonl", device);
        let (code, _, err) = memsim(&["replay", t.to_str().unwrap(), "--profile", "a100-40gb"]);
        assert_eq!(code, 0, "{err}");
        assert_eq!(err.contains(said), warns, "{device}: {err}");
    }
}

/// A job's memory fraction is of the device's total in a shared replay: it was of what the
/// other jobs left it, so the order of the traces on the command line changed the verdict
/// (DOES NOT FIT beside a need within the capacity).
#[test]
fn colocate_takes_a_jobs_memory_fraction_of_the_device_whatever_the_order() {
    let dir = tempfile::tempdir().unwrap();
    let header = "{\"kind\":\"header\",\"format_version\":1,\"producer\":{\"name\":\"t\",\"version\":\"0\"},\
                  \"level\":\"allocator\",\"caching_disabled\":false,\"synthetic_addresses\":true}";
    let alloc = |ts: u64, size: u64| {
        format!(
            "{{\"kind\":\"alloc\",\"ts_ns\":{ts},\"device\":0,\"addr\":1,\"size\":{size},\"stream\":0,\"mem\":\"device\",\
             \"api\":\"allocator\",\"result\":0,\"origin\":\"request\"}}"
        )
    };
    let big = dir.path().join("big.jsonl");
    std::fs::write(&big, format!("{header}\n{}\n", alloc(1000, 20 << 30))).unwrap();
    let half = dir.path().join("half.jsonl");
    let fraction = "{\"ts_ns\":5000,\"kind\":\"control\",\"device\":0,\"op\":\"set_memory_fraction\",\"fraction\":0.5}";
    std::fs::write(&half, format!("{header}\n{fraction}\n{}\n", alloc(6000, 15 << 30))).unwrap();
    let (big, half) = (big.to_str().unwrap(), half.to_str().unwrap());
    for order in [[big, half], [half, big]] {
        let (code, out, err) = memsim(&["colocate", order[0], order[1], "--capacity", "40GiB", "--context", "0"]);
        assert_eq!(code, 0, "{order:?}: {out}{err}");
        assert!(out.contains("needs 35840.00 MiB of 40960.00 MiB (--capacity): FITS"), "{order:?}: {out}");
    }
    // A fraction of 0 lets the allocator reserve nothing: no device meets the need, which is
    // said as such, not printed as a 16 EiB device.
    let none = dir.path().join("none.jsonl");
    let zero = fraction.replace("0.5", "0");
    std::fs::write(&none, format!("{header}\n{zero}\n{}\n", alloc(6000, 1 << 20))).unwrap();
    let (code, out, err) = memsim(&["replay", none.to_str().unwrap(), "--capacity", "40GiB"]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.contains("verdict: needs more than any device holds"), "{out}");
    assert!(err.contains("lets its allocator reserve nothing of any device"), "{err}");
    assert!(!format!("{out}{err}").contains("17592186044416"), "{out}{err}");
}

/// A shim trace taken with the cache off (each cudaMalloc/cudaFree one request, recorded as the
/// call it became), ending with this `process_exit` after `tail`.
fn cache_off_trace(dir: &Path, name: &str, tail: &[Record], lost_events: u64) -> PathBuf {
    let mut h = Header::new("libmemtrace", "0.1.0", Level::Device);
    h.pid = Some(1);
    h.caching_disabled = true;
    let call = |ts: u64, event| Record { ts_ns: Some(ts), tid: Some(1), device: Some(0), event };
    let mut records = Vec::new();
    for i in 0..8u64 {
        let addr = 0x7f00_0000_0000 + i * 2 * MIB;
        records.push(call(
            2 * i,
            Event::Alloc(trace::Alloc::device(addr, 2 * MIB, Api::CudaMalloc, trace::Origin::Outcome)),
        ));
        let f = trace::Free::device(addr, Api::CudaFree, trace::Origin::Outcome, trace::FreeStage::Immediate);
        records.push(call(2 * i + 1, Event::Free(f)));
    }
    records.extend_from_slice(tail);
    let exit = trace::ProcessExit { status: Some(0), signal: None, lost_events };
    records.push(call(100, Event::ProcessExit(exit)));
    write_records(dir, name, &h, &records)
}

/// A shim trace whose recorder lost events (its ring was full: the count is in its
/// `process_exit`), or that stopped recording at `MEMTRACE_MAX_BYTES` (its marker), was judged
/// and converted as whole: no warning, `--strict` 0, the count dropped by a conversion. Every
/// command that reads it says so, and `--strict` refuses it.
#[test]
fn lost_events_and_a_byte_limit_stop_are_never_silent() {
    let dir = tempfile::tempdir().unwrap();
    let stop = Record {
        ts_ns: Some(50),
        tid: Some(1),
        device: None,
        event: Event::Marker(trace::Marker {
            text: "memtrace: MEMTRACE_MAX_BYTES=20000 reached; recording stopped".into(),
        }),
    };
    let lost = cache_off_trace(dir.path(), "lost.mtrace", &[], 309_402);
    let limit = cache_off_trace(dir.path(), "limit.mtrace", &[stop], 0);
    let whole = cache_off_trace(dir.path(), "whole.mtrace", &[], 0);
    let says_lost = "lost.mtrace: 309402 events were lost by the recorder";
    let says_limit = "limit.mtrace: recording stopped at the producer's byte limit (MEMTRACE_MAX_BYTES=20000)";
    for (t, says) in [(&lost, says_lost), (&limit, says_limit), (&whole, "")] {
        let t = t.to_str().unwrap();
        let html = dir.path().join("r.html");
        let html = html.to_str().unwrap();
        let commands: [Vec<&str>; 4] = [
            vec!["replay", t],
            vec!["stats", t],
            vec!["report", t, "--html", html, "--profile", "a100-40gb"],
            vec!["colocate", t, t, "--capacity", "1GiB"],
        ];
        for args in commands {
            let (code, _, err) = memsim(&args);
            assert_eq!(code, 0, "{args:?}: {err}");
            let said = if says.is_empty() {
                !err.contains("lost by") && !err.contains("byte limit")
            } else {
                err.contains(says)
            };
            assert!(said, "{args:?}: {err}");
            let strict: Vec<&str> = args.iter().copied().chain(["--strict"]).collect();
            let (code, _, err) = memsim(&strict);
            assert_eq!(code, if says.is_empty() { 0 } else { 2 }, "{strict:?}: {err}");
            assert!(says.is_empty() || (err.contains(says) && err.contains("(--strict)")), "{strict:?}: {err}");
        }
        // In the JSON a program reads, too.
        let v = json(&["replay", t, "--json"]);
        let warned =
            v["warnings"].as_array().unwrap().iter().any(|w| !says.is_empty() && w.as_str().unwrap().contains(says));
        assert_eq!(warned, !says.is_empty(), "{v}");
        let v = json(&["stats", t, "--json"]);
        let warned =
            v["warnings"].as_array().unwrap().iter().any(|w| !says.is_empty() && w.as_str().unwrap().contains(says));
        assert_eq!(warned, !says.is_empty(), "{v}");
        // A conversion to a form that cannot carry it says so; to a trace, it keeps it.
        for out in ["c.pickle", "c.json", "c.jsonl"] {
            let out = dir.path().join(out);
            let (code, _, err) = memsim(&["convert", t, out.to_str().unwrap()]);
            assert_eq!(code, 0, "{err}");
            assert!(says.is_empty() || err.contains(says), "{out:?}: {err}");
            let dropped = err.contains("the output does not record that its input is incomplete");
            assert_eq!(dropped, !says.is_empty() && !out.to_str().unwrap().ends_with(".jsonl"), "{out:?}: {err}");
            if out.to_str().unwrap().ends_with(".jsonl") {
                let (code, _, err) = memsim(&["replay", out.to_str().unwrap()]);
                assert_eq!(code, 0, "{err}");
                let kept = says.split_once(": ").map_or("", |(_, rest)| rest);
                assert!(says.is_empty() || err.contains(&format!("c.jsonl: {kept}")), "{err}");
            }
            let (code, _, err) = memsim(&["convert", t, out.to_str().unwrap(), "--strict"]);
            assert_eq!(code, if says.is_empty() { 0 } else { 2 }, "{out:?}: {err}");
        }
    }
    // `stats` names the limit in its JSON and text.
    let v = json(&["stats", limit.to_str().unwrap(), "--json"]);
    assert_eq!(v["byte_limit"], 20000);
    assert_eq!(json(&["stats", whole.to_str().unwrap(), "--json"]).get("byte_limit"), None);
    let (_, out, _) = memsim(&["stats", limit.to_str().unwrap()]);
    assert!(out.contains("INCOMPLETE: recording stopped at the byte limit (MEMTRACE_MAX_BYTES=20000)"), "{out}");
}

/// `memsim convert` of a cache-off shim trace wrote a snapshot of segment events and no
/// allocation (the requests kept their cudaMalloc/cudaFree form), and `memsim validate` of it
/// compared none (0 of N segment events, a predicted peak of 0) yet passed it as "explained by
/// the unrecoverable start state". The requests are exported as requests and validate; a
/// snapshot of segment events alone is said by convert and refused by validate.
#[test]
fn a_cache_off_trace_converts_to_a_snapshot_that_validates() {
    let dir = tempfile::tempdir().unwrap();
    let t = cache_off_trace(dir.path(), "c10.mtrace", &[], 0);
    let pickle = dir.path().join("c10.pickle");
    let (code, _, err) = memsim(&["convert", t.to_str().unwrap(), pickle.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("no allocation"), "{err}");
    let v = json(&["validate", pickle.to_str().unwrap(), "--json"]);
    assert_eq!((v["allocs"].as_u64(), v["alloc_addr_matches"].as_u64()), (Some(8), Some(8)), "{v}");
    assert_eq!((v["verdict"].as_str(), v["nothing_compared"].as_bool()), (Some("exact"), Some(false)), "{v}");

    // An allocator-level trace of outcomes (`body`, JSON Lines), with its end state, converted
    // to a snapshot: its path and what convert said.
    let to_pickle = |name: &str, body: &str| {
        let jsonl = dir.path().join(format!("{name}.jsonl"));
        let header = r#"{"kind":"header","format_version":1,"producer":{"name":"test","version":"0"},"level":"allocator","synthetic_addresses":false,"metadata":{}}"#;
        std::fs::write(&jsonl, format!("{header}\n{body}")).unwrap();
        let pickle = dir.path().join(format!("{name}.pickle"));
        let (code, _, err) = memsim(&["convert", jsonl.to_str().unwrap(), pickle.to_str().unwrap()]);
        assert_eq!(code, 0, "{err}");
        (pickle, err)
    };
    // Segment events alone.
    let (pickle, err) = to_pickle(
        "seg",
        r#"{"ts_ns":1,"device":0,"kind":"alloc","addr":1048576000,"size":20971520,"stream":0,"mem":"device","api":"cudaMalloc","result":0,"origin":"outcome"}
{"ts_ns":2,"device":0,"kind":"alloc","addr":1048576000,"size":2097152,"stream":0,"mem":"device","api":"cudaMalloc","result":0,"origin":"outcome"}
{"ts_ns":3,"device":0,"kind":"free","addr":1048576000,"size":2097152,"stream":0,"mem":"device","api":"cudaFree","result":0,"origin":"outcome","stage":"immediate"}
{"ts_ns":4,"device":0,"kind":"segment_state","at":"end","addr":1048576000,"total_size":20971520,"stream":0,"pool":"large","blocks":[{"addr":1048576000,"size":20971520,"requested_size":0,"state":"inactive"}]}
"#,
    );
    assert!(err.contains("seg.pickle: the snapshot holds 3 segment events but no allocation"), "{err}");
    for json in [false, true] {
        let args = [&["validate", pickle.to_str().unwrap()][..], if json { &["--json"] } else { &[] }].concat();
        let (code, out, err) = memsim(&args);
        assert_eq!(code, 2, "{args:?}: {out}{err}");
        assert!(
            err.contains("records 3 segment events but no allocation") && err.contains("nothing to validate"),
            "{err}"
        );
        assert!(!out.contains("explained"), "{out}");
    }
    // A release burst alone is what the model replays (as empty_cache) and matches: judged, not
    // refused as nothing to validate.
    let (pickle, _) = to_pickle(
        "rel",
        r#"{"ts_ns":3,"device":0,"kind":"free","addr":1048576000,"size":20971520,"stream":0,"mem":"device","api":"cudaFree","result":0,"origin":"outcome","stage":"immediate"}
{"ts_ns":4,"device":0,"kind":"segment_state","at":"end","addr":1069547520,"total_size":2097152,"stream":0,"pool":"small","blocks":[{"addr":1069547520,"size":2097152,"requested_size":0,"state":"inactive"}]}
"#,
    );
    let (code, out, err) = memsim(&["validate", pickle.to_str().unwrap()]);
    assert!(code != 2 && !err.contains("nothing to validate"), "{out}{err}");
    assert!(out.contains("segment events    1/1 match"), "{out}");
}

/// A device-level trace of one 20 MiB allocation, recorded with PyTorch's cache on.
fn device_trace_with_cache_on(dir: &Path) -> PathBuf {
    let mut h = Header::new("libmemtrace", "0", Level::Device);
    h.pid = Some(1);
    write_records(dir, "dev.mtrace", &h, &[alloc(0x7000_0000, 20 * MIB, None)])
}

/// The refusal of a device-level trace with the cache on told a program without PyTorch that
/// PYTORCH_NO_CUDA_MEMORY_CACHING=1 makes its calls its requests; under it such a program's
/// calls are left out of the replay as another module's, so the advice is PyTorch's alone.
#[test]
fn the_cache_on_refusal_says_what_a_program_without_pytorch_gets() {
    let dir = tempfile::tempdir().unwrap();
    let dev = device_trace_with_cache_on(dir.path());
    let (code, _, err) = memsim(&["replay", dev.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(!err.contains("whose calls are its requests"), "{err}");
    assert!(err.contains("For a PyTorch program") && err.contains("A program without PyTorch"), "{err}");

    // What it says of such a program under the variable is what the replay does: its own
    // calls (made by its module, not PyTorch's allocator) are left out.
    let mut h = Header::new("libmemtrace", "0", Level::Device);
    h.pid = Some(1);
    h.caching_disabled = true;
    let a = trace::Alloc {
        caller: Some(0),
        ..trace::Alloc::device(0x7000_0000, MIB, Api::CudaMalloc, trace::Origin::Outcome)
    };
    let own = write_records(
        dir.path(),
        "own.mtrace",
        &h,
        &[
            Record::bare(Event::Name(trace::NameDef { id: 0, text: "thr".into() })),
            Record { ts_ns: Some(1), tid: Some(1), device: Some(0), event: Event::Alloc(a) },
            Record::bare(Event::ProcessExit(trace::ProcessExit { status: Some(0), signal: None, lost_events: 0 })),
        ],
    );
    let v = json(&["replay", own.to_str().unwrap(), "--json"]);
    assert_eq!(v["requests"], 0, "{v}");
}

/// A negative size is a bad size, said by the size parser: it was "unexpected argument '-1'
/// found", with a tip to pass it as a positional argument.
#[test]
fn a_negative_size_is_refused_as_a_size() {
    let dir = tempfile::tempdir().unwrap();
    let t = write_trace(dir.path(), "t.mtrace", &three_tensors());
    let t = t.to_str().unwrap();
    let html = dir.path().join("r.html");
    for args in [
        vec!["replay", t, "--capacity", "-1"],
        vec!["replay", t, "--capacity", "-1.5"],
        vec!["colocate", t, t, "--capacity", "-1"],
        vec!["colocate", t, t, "--context", "-1"],
        vec!["report", t, "--html", html.to_str().unwrap(), "--capacity", "-1"],
        vec!["profile", "a100-40gb", "--capacity", "-1"],
    ] {
        let (code, _, err) = memsim(&args);
        let flag = args[args.len() - 2];
        assert!(
            code == 2 && err.contains(&format!("for '{flag} <SIZE>'")) && err.contains("invalid size"),
            "{args:?}: {err}"
        );
        assert!(!err.contains("unexpected argument"), "{args:?}: {err}");
    }
    assert!(!html.exists());
}
