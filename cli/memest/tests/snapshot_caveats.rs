//! A trace converted from a PyTorch snapshot carries the snapshot's caveats in its header
//! (`snapshot.caveats`, `snapshot.state_only`): `memest estimate` says them as memsim does, and
//! under `--strict` refuses a snapshot that holds only its state at dump time, as memsim does.

use std::path::Path;

use serde_json::json;

use crate::support::memest_code;

const MIB: u64 = 1 << 20;

/// memsim's words for a snapshot that records no allocator event.
const CAVEAT: &str = "the snapshot records no allocator events";

/// A state-only snapshot (one 20 MiB segment, one allocated block, no allocator events),
/// converted by `memsim convert` to the trace `name` in `dir`.
fn converted_state_only(dir: &Path, name: &str) -> String {
    let (addr, size) = (1u64 << 30, 20 * MIB);
    let segment = json!({"device": 0, "address": addr, "total_size": size, "stream": 0, "segment_type": "large",
        "allocated_size": size, "active_size": size,
        "blocks": [{"address": addr, "size": size, "requested_size": size, "state": "active_allocated"}]});
    let snap = json!({"segments": [segment], "device_traces": [[]]});
    let pickle = dir.join("state.pickle");
    std::fs::write(&pickle, serde_pickle::to_vec(&snap, serde_pickle::SerOptions::new()).unwrap()).unwrap();
    let out = dir.join(name);
    let args = ["memsim", "convert", pickle.to_str().unwrap(), out.to_str().unwrap()];
    assert_eq!(memsim_cli::main(args.map(Into::into)), 0, "memsim convert");
    out.to_str().unwrap().to_string()
}

/// memest read the converted trace without a word of its caveats, and `--strict` estimated from
/// a snapshot's state at dump time although its help says such an input is an error.
#[test]
fn a_converted_snapshots_caveats_are_said_once_and_strict_refuses_its_state_alone() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["s.jsonl", "s.mtrace"] {
        let t = converted_state_only(dir.path(), name);
        let (code, out, err) = memest_code(&["estimate", "--trace", &t]);
        assert!(code == 0 || code == 1, "{name}: {code}: {out}{err}");
        assert_eq!(err.matches(CAVEAT).count(), 1, "{name}: {err}");
        assert!(err.contains(&format!("memest: warning: {t}: {CAVEAT}")), "{name}: {err}");

        // The JSON's warnings say it too, once.
        let (_, out, err) = memest_code(&["estimate", "--trace", &t, "--json"]);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{name}: {e}: {out}{err}"));
        let said = v["warnings"].as_array().unwrap().iter().filter(|w| w.as_str().unwrap().contains(CAVEAT)).count();
        assert_eq!(said, 1, "{name}: {}", v["warnings"]);

        for json in [false, true] {
            let mut args = vec!["estimate", "--trace", &t, "--strict"];
            if json {
                args.push("--json");
            }
            let (code, out, err) = memest_code(&args);
            assert_eq!(code, 2, "{name} {args:?}: {out}{err}");
            assert!(out.is_empty(), "{name} {args:?}: no output under --strict: {out}");
            assert!(err.contains("records no allocator events") && err.contains("(--strict)"), "{name}: {err}");
        }
    }
}
