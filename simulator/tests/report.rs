//! The memory report: what `report::collect` finds on a hand-made trace with known answers, the
//! page it renders, and `memsim report` end to end (profiles, --estimate, bad input).

use std::path::{Path, PathBuf};
use std::process::Command;

use simulator::replay::ReplayOptions;
use simulator::report::{self, html};
use trace::{Category, Event, Frame, Header, Level, Record, StackDef};

use crate::cli::{alloc, free};

const MIB: u64 = 1 << 20;

/// Three 30 MiB tensors; the second freed; a 60 MiB one allocated at the top of a known stack
/// (the peak: 30 + 30 + 60 = 120 MiB allocated, 150 MiB reserved), then everything freed.
fn records() -> Vec<Record> {
    let stack = Record {
        ts_ns: None,
        tid: None,
        device: Some(0),
        event: Event::Stack(StackDef {
            id: 7,
            frames: vec![Frame { filename: "train.py".into(), line: 42, name: "forward".into() }],
        }),
    };
    let mut big = alloc(4, 60 * MIB, Some(Category::Activation));
    if let Event::Alloc(a) = &mut big.event {
        a.stack = Some(7);
    }
    vec![
        alloc(1, 30 * MIB, Some(Category::Parameter)),
        alloc(2, 30 * MIB, Some(Category::Activation)),
        alloc(3, 30 * MIB, Some(Category::Activation)),
        free(2),
        stack,
        big,
        free(4),
        free(3),
        free(1),
    ]
}

fn header() -> Header {
    let mut h = Header::new("test", "0", Level::Allocator);
    h.synthetic_addresses = true;
    h
}

fn write(dir: &Path) -> PathBuf {
    let path = dir.join("t.jsonl");
    let mut w = trace::TraceWriter::create(&path, &header()).unwrap();
    for r in records() {
        w.write(&r).unwrap();
    }
    w.finish().unwrap();
    path
}

#[test]
fn collect_finds_the_peak_what_is_alive_and_the_segments() {
    let r = report::collect(&header(), &records(), &ReplayOptions::default()).unwrap();
    assert_eq!((r.peak_allocated, r.peak_reserved), (120 * MIB, 150 * MIB));
    assert_eq!(r.peak_at, 5, "the 60 MiB request is record 5");
    assert_eq!(r.reserved_at_peak, 150 * MIB);
    assert_eq!(r.categories_at_peak, vec![("activation".to_string(), 90 * MIB), ("parameter".to_string(), 30 * MIB)]);
    assert_eq!(r.live_count, 3);
    assert_eq!((r.top[0].size, r.top[0].category.as_str()), (60 * MIB, "activation"));
    assert_eq!(r.top[0].frames, vec!["train.py:42 in forward".to_string()]);
    assert!(r.top[1].frames.is_empty());
    // Four segments (30, 30, 30, 60 MiB): tensor 2's is free at the peak.
    let mut sizes: Vec<u64> = r.segments.iter().map(|s| s.size / MIB).collect();
    sizes.sort();
    assert_eq!(sizes, vec![30, 30, 30, 60]);
    let free: u64 = r
        .segments
        .iter()
        .flat_map(|s| &s.blocks)
        .filter(|b| b.state == simulator::alloc::BlockViewState::Inactive)
        .map(|b| b.size)
        .sum();
    assert_eq!(free, 30 * MIB);
    // The curve ends where the trace does, with nothing allocated.
    let last = r.samples.last().unwrap();
    assert_eq!((last.allocated, last.by_category.iter().sum::<u64>()), (0, 0));
}

#[test]
fn the_page_is_self_contained_and_says_the_numbers() {
    let r = report::collect(&header(), &records(), &ReplayOptions::default()).unwrap();
    let page =
        html::render(&r, &html::Extras { title: "t.jsonl".into(), allocator: "2.9".into(), ..Default::default() });
    for expect in [
        r#"<p id="headline" data-mib="150.0">peak reserved 150.0 MiB (peak allocated 120.0 MiB)</p>"#,
        "Memory over the run",
        "What is alive at the peak",
        "Segments at the peak",
        "<code>train.py:42 in forward</code>",
        r#"<svg id="timeline""#,
        r#"<svg id="segments""#,
    ] {
        assert!(page.contains(expect), "missing {expect}");
    }
    for absent in ["<script", "http://", "https://"] {
        let outside_svg_ns = page.replace("http://www.w3.org/2000/svg", "");
        assert!(!outside_svg_ns.contains(absent), "the page must not load anything: found {absent}");
    }
}

fn memsim(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_memsim")).args(args).output().expect("run memsim");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

#[test]
fn memsim_report_writes_the_page_with_verdicts_and_estimators() {
    let dir = tempfile::tempdir().unwrap();
    let t = write(dir.path());
    let est = dir.path().join("est.json");
    std::fs::write(
        &est,
        r#"{"gpu": "NVIDIA A100-SXM4-40GB", "verdict": {"need_mib": 1234.5, "point_mib": 1200.0, "capacity_mib": 40536.0, "fits": true},
            "estimates": {"symbolic": {"device_mib": 1200.0, "level": "device", "ignores": "x"},
                          "analytic": {"device_mib": 900.0, "level": "device", "ignores": "y"}},
            "unavailable": {"ml": "no model"}}"#,
    )
    .unwrap();
    let out = dir.path().join("r.html");
    let args = ["report", t.to_str().unwrap(), "--html", out.to_str().unwrap(), "--profile", "a100-40gb"];
    let (code, stdout, err) = memsim(&[&args[..], &["--estimate", est.to_str().unwrap()]].concat());
    assert_eq!(code, 0, "{err}");
    assert!(stdout.contains("peak reserved 150.0 MiB"), "{stdout}");
    let page = std::fs::read_to_string(&out).unwrap();
    assert!(page.contains(r#"data-mib="1234.5">needs 1234.5 MiB on NVIDIA A100-SXM4-40GB (point 1200.0)"#));
    assert!(page.contains("The estimators side by side") && page.contains("no model"));
    assert!(page.contains("The verdict per GPU profile") && page.contains(">a100-40gb<"));
}

#[test]
fn memsim_report_refuses_bad_input_without_writing() {
    let dir = tempfile::tempdir().unwrap();
    let t = write(dir.path());
    let out = dir.path().join("r.html");
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, "{\"not\": \"an estimate\"}").unwrap();
    for (args, expect) in [
        (
            vec!["report", t.to_str().unwrap(), "--html", out.to_str().unwrap(), "--estimate", bad.to_str().unwrap()],
            "field `estimates` missing",
        ),
        (vec!["report", "/nonexistent.jsonl", "--html", out.to_str().unwrap()], "no such file"),
        (vec!["report", t.to_str().unwrap(), "--html", out.to_str().unwrap(), "--profile", "nope"], "nope"),
    ] {
        let (code, _, err) = memsim(&args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains(expect), "{args:?}: {err}");
        assert!(!out.exists(), "{args:?}: no partial page");
    }
}
