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

/// On several GPUs the page shows the device a verdict rests on (the highest reserved peak),
/// not the one with the most allocations: a page of device 0 beside a verdict of device 1 said
/// two things about one run.
#[test]
fn several_devices_show_the_one_with_the_highest_reserved_peak() {
    use crate::records::{alloc, free};
    let on = |mut r: trace::Record, d: u32| {
        r.device = Some(d);
        r
    };
    // Device 0: ten 1 MiB tensors (the busiest). Device 1: one 100 MiB tensor.
    let mut recs: Vec<trace::Record> = (1..=10).map(|a| on(alloc(a, MIB, None), 0)).collect();
    recs.push(on(alloc(100, 100 * MIB, None), 1));
    recs.push(on(free(100), 1));
    let r = report::collect(&header(), &recs, &ReplayOptions::default()).unwrap();
    assert_eq!((r.device, r.devices), (1, 2));
    assert_eq!((r.peak_allocated, r.peak_reserved), (100 * MIB, 100 * MIB));
    assert_eq!(r.peak_at, 10);
    assert!(r.samples.iter().all(|s| s.allocated <= 100 * MIB && s.at >= 10), "{:?}", r.samples);
}

/// The "where" cell: a real snapshot's stack starts with the unwinder and the allocator; the cell
/// shows the program's Python frames, else (autograd's thread has none) the operator calls and
/// autograd nodes, else what PyTorch's memory viewer keeps.
#[test]
fn the_where_cell_shows_the_programs_own_frames() {
    use simulator::report::site::site;
    use trace::Frame;
    let f = |filename: &str, name: &str| Frame { filename: filename.into(), line: 0, name: name.into() };
    let head = [
        f("??", "torch::unwind::unwind()"),
        f("??", "torch::CapturedTraceback::gather(bool, bool, bool)"),
        f("memory_snapshot.cpp", "torch::cuda::(anonymous namespace)::gather_with_cpp()"),
        f("CUDACachingAllocator.cpp", "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(int)"),
        f("RegisterCUDA.cpp", "at::(anonymous namespace)::wrapper_CUDA_mm(at::Tensor const&, at::Tensor const&)"),
    ];
    let check = |tail: Vec<Frame>, expect: &[&str]| {
        let frames: Vec<Frame> = head.iter().cloned().chain(tail).collect();
        assert_eq!(site(&frames), expect.iter().map(|s| s.to_string()).collect::<Vec<_>>());
    };
    let train = || Frame { filename: "train.py".into(), line: 42, name: "forward".into() };
    check(
        vec![f("??", "at::_ops::mm::call(at::Tensor const&)"), train(), f("??", "PyEval_EvalFrameDefault")],
        &["train.py:42 in forward"],
    );
    // A library's operation, then the program's own line past the module plumbing.
    let lib = |file: &str, line: u32, name: &str| Frame {
        filename: format!("/env/lib/python3.11/site-packages/torch/nn/{file}"),
        line,
        name: name.into(),
    };
    check(
        vec![lib("modules/linear.py", 125, "forward"), lib("modules/module.py", 1747, "_call_impl"), train()],
        &["/env/lib/python3.11/site-packages/torch/nn/modules/linear.py:125 in forward", "train.py:42 in forward"],
    );
    check(
        vec![lib("modules/linear.py", 125, "forward"), lib("modules/module.py", 1747, "_call_impl")],
        &[
            "/env/lib/python3.11/site-packages/torch/nn/modules/linear.py:125 in forward",
            "/env/lib/python3.11/site-packages/torch/nn/modules/module.py:1747 in _call_impl",
        ],
    );
    check(
        vec![
            f("??", "at::_ops::mm::redispatch(c10::DispatchKeySet)"),
            f("??", "at::_ops::mm::call(at::Tensor const&)"),
            f("", "torch::autograd::generated::details::mm_mat1_backward(at::Tensor const&)"),
            f("??", "torch::autograd::generated::MmBackward0::apply(std::vector<at::Tensor>&&)"),
            f("??", "torch::autograd::Engine::thread_main()"),
        ],
        &[
            "??:0 in at::_ops::mm::call(at::Tensor const&)",
            "??:0 in torch::autograd::generated::MmBackward0::apply(std::vector<at::Tensor>&&)",
        ],
    );
    // Nothing but the allocator: what the viewer keeps.
    check(
        vec![],
        &[
            "CUDACachingAllocator.cpp:0 in c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(int)",
            "RegisterCUDA.cpp:0 in at::(anonymous namespace)::wrapper_CUDA_mm(at::Tensor const&, at::Tensor const&)",
        ],
    );
}
