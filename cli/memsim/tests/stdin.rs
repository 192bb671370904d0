//! Traces read from standard input (`-`) and other streams, as from files; what a stream cannot
//! be (a snapshot pickle, standard input twice) is refused by name.

use std::io::Write;
use std::process::{Command, Stdio};

use serde_json::Value;

use crate::support::{json, memsim};

const TRACE: &str = concat!(
    r#"{"kind":"header","format_version":1,"producer":{"name":"probe","version":"1"},"level":"allocator","caching_disabled":false}"#,
    "\n",
    r#"{"kind":"alloc","device":0,"addr":4096,"size":3000000,"stream":0,"mem":"device","api":"allocator","result":0,"origin":"request"}"#,
    "\n",
    r#"{"kind":"alloc","device":0,"addr":8192,"size":700,"stream":0,"mem":"device","api":"allocator","result":0,"origin":"request"}"#,
    "\n",
    r#"{"kind":"free","device":0,"addr":4096,"stream":0,"mem":"device","api":"allocator","result":0,"origin":"request","stage":"immediate"}"#,
    "\n",
);

/// `memsim ARGS` with `input` on its standard input: exit status, stdout, stderr.
fn memsim_fed(args: &[&str], input: &[u8]) -> (i32, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_memsim"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run memsim");
    // A refusal may come before memsim reads its input: a closed pipe is not the test's fault.
    let _ = child.stdin.take().expect("stdin").write_all(input);
    let out = child.wait_with_output().expect("wait for memsim");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

fn fed_json(args: &[&str], input: &[u8]) -> Value {
    let (code, out, err) = memsim_fed(args, input);
    assert_eq!(code, 0, "memsim {args:?} < input failed: {err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("memsim {args:?}: not JSON ({e}): {out}"))
}

const SAME: [&str; 3] = ["peak_reserved_bytes", "peak_allocated_bytes", "peak_requested_bytes"];

#[test]
fn a_trace_on_standard_input_replays_as_its_file_does() {
    let dir = tempfile::tempdir().unwrap();
    let jsonl = dir.path().join("t.jsonl");
    std::fs::write(&jsonl, TRACE).unwrap();
    let native = dir.path().join("t.mtrace");
    let (code, _, err) = memsim(&["convert", jsonl.to_str().unwrap(), native.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let from_file = json(&["replay", "--json", jsonl.to_str().unwrap()]);
    assert!(from_file["peak_reserved_bytes"].as_u64().unwrap() > 0);
    // Both forms, told apart by their first bytes, as a file's are.
    for bytes in [TRACE.as_bytes().to_vec(), std::fs::read(&native).unwrap()] {
        let piped = fed_json(&["replay", "--json", "-"], &bytes);
        for field in SAME {
            assert_eq!(piped[field], from_file[field], "{field}");
        }
        let stats = fed_json(&["stats", "--json", "-"], &bytes);
        assert_eq!(stats["events"], 3, "{stats}");
    }
    // Converted from standard input to a file.
    let out = dir.path().join("back.mtrace");
    let (code, _, err) = memsim_fed(&["convert", "-", out.to_str().unwrap()], TRACE.as_bytes());
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        json(&["replay", "--json", out.to_str().unwrap()])["peak_reserved_bytes"],
        from_file["peak_reserved_bytes"]
    );
}

#[test]
fn what_a_stream_cannot_be_is_refused_by_name() {
    // A snapshot pickle is read whole and by name: through a stream, its protocol byte is named.
    let pickle = serde_pickle::to_vec(&serde_json::json!({"segments": []}), serde_pickle::SerOptions::new()).unwrap();
    let (code, _, err) = memsim_fed(&["replay", "-"], &pickle);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("PyTorch snapshot pickle") && err.contains(".pickle"), "{err}");
    // Standard input read twice would find it spent.
    for args in [["stats", "-", "-"], ["colocate", "-", "-"]] {
        let (code, _, err) = memsim_fed(&args, TRACE.as_bytes());
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains("standard input") && err.contains("more than once"), "{args:?}: {err}");
    }
    // An empty stream is said to be empty.
    let (code, _, err) = memsim_fed(&["replay", "-"], b"");
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("empty"), "{err}");
    // A regular file is still known by its name.
    let dir = tempfile::tempdir().unwrap();
    let odd = dir.path().join("t.txt");
    std::fs::write(&odd, TRACE).unwrap();
    let (code, _, err) = memsim(&["replay", odd.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("unknown input format") && err.contains("standard input"), "{err}");
}

/// `report` reads its input for the page and again for each profile's verdict: from a pipe the
/// second read found it spent ("/dev/stdin: incomplete trace header ... the input is empty"). A
/// stream is read once; and every command names standard input `- (standard input)`, in errors and
/// warnings alike, not `/dev/stdin` nor `-:`.
#[test]
fn report_reads_standard_input_once_and_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("t.jsonl");
    std::fs::write(&file, TRACE).unwrap();
    let from_file = json(&["report", "--json", "--profile", "a100-40gb", file.to_str().unwrap()]);
    let piped = fed_json(&["report", "--json", "--profile", "a100-40gb", "-"], TRACE.as_bytes());
    for field in ["peak_reserved_bytes", "peak_allocated_bytes", "verdicts"] {
        assert_eq!(piped[field], from_file[field], "{field}");
    }
    let page = dir.path().join("r.html");
    let (code, _, err) = memsim_fed(&["report", "-", "--html", page.to_str().unwrap()], TRACE.as_bytes());
    assert_eq!(code, 0, "{err}");
    // A trace cut short: its warning names standard input as errors do, once, in every command.
    let cut = &TRACE.as_bytes()[..TRACE.len() - 20];
    for cmd in ["report", "replay", "stats"] {
        let mut args = vec![cmd, "-"];
        args.extend((cmd == "report").then_some("--json"));
        let (_, _, err) = memsim_fed(&args, cut);
        assert_eq!(err.matches("- (standard input): truncated").count(), 1, "{cmd}: {err}");
        assert!(!err.contains("-: ") && !err.contains(".memsim-stream-"), "{cmd}: {err}");
    }
    for cmd in ["report", "replay", "stats"] {
        let mut args = vec![cmd, "-"];
        args.extend((cmd == "report").then_some("--json"));
        let (code, _, err) = memsim_fed(&args, b"");
        assert_eq!(code, 2, "{cmd}: {err}");
        assert!(err.contains("- (standard input)") && !err.contains("/dev/stdin"), "{cmd}: {err}");
    }
}

/// `report -` reads a spooled copy of its input, and a pickle there was told to be renamed from
/// the copy's ".mtrace"; it is told what `replay -` tells: give it as a file, not a stream.
#[test]
fn a_pickle_streamed_to_report_is_to_be_given_as_a_file() {
    let pickle = serde_pickle::to_vec(&serde_json::json!({"segments": []}), serde_pickle::SerOptions::new()).unwrap();
    for cmd in ["replay", "report"] {
        let (code, _, err) = memsim_fed(&[cmd, "-", "--json"], &pickle);
        assert_eq!(code, 2, "{cmd}: {err}");
        assert!(err.contains("give it as a .pickle/.pkl file, not a stream"), "{cmd}: {err}");
        assert!(!err.contains("named .mtrace"), "{cmd}: {err}");
    }
}
