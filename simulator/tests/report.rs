//! The memory report: what `report::collect` finds on a hand-made trace with known answers, and
//! the page it renders (`memsim report` end to end: the memsim crate's tests).

use simulator::replay::ReplayOptions;
use simulator::report::{self, html};

use crate::records::{header, records};

const MIB: u64 = 1 << 20;

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

/// Marks are what the one marker grammar (`trace::marker::parse`) says: `iter:N` and known
/// phases; user text that only looks like one (`phase:warmup`, `iter:end`) is not drawn.
#[test]
fn marks_follow_the_marker_grammar() {
    use trace::{Event, Marker, Record};
    let mark =
        |t: &str| Record { ts_ns: None, tid: None, device: Some(0), event: Event::Marker(Marker { text: t.into() }) };
    let mut recs = vec![mark("iter:0"), mark("phase:forward"), mark("phase:warmup"), mark("iter:end"), mark("hello")];
    recs.extend(records());
    let r = report::collect(&header(), &recs, &ReplayOptions::default()).unwrap();
    let marks: Vec<(&str, bool)> = r.marks.iter().map(|m| (m.text.as_str(), m.is_iter())).collect();
    assert_eq!(marks, vec![("iter:0", true), ("phase:forward", false)]);
}
