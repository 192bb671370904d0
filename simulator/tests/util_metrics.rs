//! Utilization metrics on hand-built traces with known kernel intervals: busy fraction, SM
//! activity, occupancy, gaps, phases, kernel classes, launch-only traces and missing device facts.

use simulator::utilization::{
    classify, KernelClass, ScopeMetrics, Source, Timing, UtilOptions, UtilizationBuilder, UtilizationReport,
};
use trace::{DeviceInfo, Event, Header, Level, Marker, NameDef, Record};

use crate::records::{self, kernel};

/// A kernel on device 0: `[start, end)`, `grid` blocks of 256 threads with 32 registers (100%
/// theoretical occupancy on 8.0), on `stream`.
fn k(start: u64, end: u64, grid: u32, stream: i64) -> Record {
    kernel(start, end, grid, stream, None)
}

fn on_device(mut r: Record, device: u32) -> Record {
    r.device = Some(device);
    r
}

fn phase(ts: u64, p: &str) -> Record {
    Record { ts_ns: Some(ts), tid: None, device: None, event: Event::Marker(Marker { text: format!("phase:{p}") }) }
}

fn name(id: u32, text: &str) -> Record {
    Record::bare(Event::Name(NameDef { id, text: text.to_string() }))
}

/// A launch of one 32-thread block on stream 0.
fn launch(ts: u64) -> Record {
    records::launch(ts, 32, 0)
}

/// A header for one A100-like device with 4 SMs (small grids make SM shares easy to read).
fn header(sm_count: Option<u32>, cc: Option<(u32, u32)>) -> Header {
    let mut h = Header::new("test", "0", Level::Device);
    h.devices.push(DeviceInfo { index: 0, name: None, total_memory: None, sm_count, compute_capability: cc });
    h
}

fn report_with(h: &Header, opts: UtilOptions, records: &[Record]) -> UtilizationReport {
    let mut b = UtilizationBuilder::new(h, opts);
    for r in records {
        b.observe(r);
    }
    b.finish()
}

fn report(records: &[Record]) -> UtilizationReport {
    report_with(&header(Some(4), Some((8, 0))), UtilOptions::default(), records)
}

/// Expected time-weighted metrics of one scope.
#[derive(Debug, Clone, Copy)]
struct Expect {
    wall_ns: u64,
    busy_ns: u64,
    sm_activity: f64,
    occupancy: f64,
    kernels: u64,
    mean_gap_ns: Option<f64>,
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-12
}

fn check_scope(what: &str, m: &ScopeMetrics, e: Expect) {
    assert_eq!(m.wall_ns, e.wall_ns, "{what}: wall");
    assert_eq!(m.busy_ns, Some(e.busy_ns), "{what}: busy");
    let busy = e.busy_ns as f64 / e.wall_ns as f64;
    assert!(
        close(m.busy_fraction.expect("busy_fraction"), busy),
        "{what}: busy fraction {:?} != {busy}",
        m.busy_fraction
    );
    let sm = m.sm_activity.expect("sm_activity");
    assert!(close(sm, e.sm_activity), "{what}: SM activity {sm} != {}", e.sm_activity);
    let occ = m.occupancy.expect("occupancy");
    assert!(close(occ, e.occupancy), "{what}: occupancy {occ} != {}", e.occupancy);
    assert_eq!(m.kernels, e.kernels, "{what}: kernels");
    match (m.mean_gap_ns, e.mean_gap_ns) {
        (Some(a), Some(b)) => assert!(close(a, b), "{what}: mean gap {a} != {b}"),
        (a, b) => assert_eq!(a, b, "{what}: mean gap"),
    }
}

fn check(what: &str, records: &[Record], run: Expect) {
    let r = report(records);
    assert_eq!(r.timing, Timing::Cupti, "{what}");
    check_scope(what, &r.run, run);
}

#[test]
fn gapped_kernels() {
    // [0,100) on all 4 SMs, idle 100 ns, [200,300) on 2 of 4 SMs.
    check(
        "gapped",
        &[k(0, 100, 4, 7), k(200, 300, 2, 7)],
        Expect {
            wall_ns: 300,
            busy_ns: 200,
            sm_activity: (100.0 * 1.0 + 100.0 * 0.5) / 300.0,
            occupancy: 200.0 / 300.0,
            kernels: 2,
            mean_gap_ns: Some(100.0),
        },
    );
}

#[test]
fn overlapping_kernels_on_two_streams() {
    // [0,100) and [50,150), 2 blocks each: the union is 150 ns; SMs 2/4, 4/4, 2/4.
    check(
        "overlap",
        &[k(0, 100, 2, 7), k(50, 150, 2, 8)],
        Expect {
            wall_ns: 150,
            busy_ns: 150,
            sm_activity: (50.0 * 0.5 + 50.0 * 1.0 + 50.0 * 0.5) / 150.0,
            occupancy: 1.0,
            kernels: 2,
            mean_gap_ns: Some(0.0),
        },
    );
    // Two full-device kernels at once cannot make more than every SM active.
    check(
        "saturated",
        &[k(0, 100, 4, 7), k(0, 100, 8, 8)],
        Expect { wall_ns: 100, busy_ns: 100, sm_activity: 1.0, occupancy: 1.0, kernels: 2, mean_gap_ns: Some(0.0) },
    );
}

#[test]
fn multi_stream_gaps_and_record_order() {
    // Stream 7: [0,100) then [350,500); stream 8: [300,400). Records arrive out of order, as
    // CUPTI buffers do. Union 100 + 200 = 300 of 500; gaps before each later kernel: 200, 0.
    let records = [k(350, 500, 1, 7), k(0, 100, 1, 7), k(300, 400, 1, 8)];
    check(
        "multi-stream",
        &records,
        Expect {
            wall_ns: 500,
            busy_ns: 300,
            sm_activity: (100.0 * 0.25 + 50.0 * 0.25 + 50.0 * 0.5 + 100.0 * 0.25) / 500.0,
            occupancy: 300.0 / 500.0,
            kernels: 3,
            mean_gap_ns: Some(100.0),
        },
    );
}

#[test]
fn zero_length_and_invalid_records() {
    let mut bad = k(0, 10, 1, 7);
    if let Event::KernelExec(e) = &mut bad.event {
        e.start_ns = 50;
        e.end_ns = 40;
    }
    let r = report(&[k(0, 100, 4, 7), k(100, 100, 4, 7), bad]);
    assert_eq!(r.invalid_kernel_records, 1);
    check_scope(
        "zero-length",
        &r.run,
        Expect { wall_ns: 100, busy_ns: 100, sm_activity: 1.0, occupancy: 1.0, kernels: 2, mean_gap_ns: Some(0.0) },
    );
}

#[test]
fn phases_split_time_and_attribute_counts_by_start() {
    // forward from 0, backward from 250; kernels [0,100) and [200,300) on all SMs. The second
    // kernel starts in forward but its last 50 ns run in backward.
    let r = report(&[phase(0, "forward"), k(0, 100, 4, 7), k(200, 300, 4, 7), phase(250, "backward")]);
    check_scope(
        "run",
        &r.run,
        Expect {
            wall_ns: 300,
            busy_ns: 200,
            sm_activity: 200.0 / 300.0,
            occupancy: 200.0 / 300.0,
            kernels: 2,
            mean_gap_ns: Some(100.0),
        },
    );
    check_scope(
        "forward",
        &r.phases["forward"],
        Expect { wall_ns: 250, busy_ns: 150, sm_activity: 0.6, occupancy: 0.6, kernels: 2, mean_gap_ns: Some(100.0) },
    );
    let b = &r.phases["backward"];
    assert_eq!((b.wall_ns, b.busy_ns, b.kernels, b.kernel_time_ns), (50, Some(50), 0, 0));
    assert_eq!(b.busy_fraction, Some(1.0));
    assert_eq!(r.phases["forward"].kernel_time_ns, 200);
    // Phase wall times add up to the run's.
    assert_eq!(r.phases.values().map(|m| m.wall_ns).sum::<u64>(), r.run.wall_ns);
}

#[test]
fn time_before_the_first_phase_marker_is_unphased() {
    // Repeated phases accumulate: forward [50,100) and [200,300).
    let r = report(&[
        k(0, 100, 4, 7),
        phase(50, "forward"),
        phase(100, "optimizer"),
        k(150, 160, 4, 7),
        phase(200, "forward"),
        k(200, 300, 2, 7),
    ]);
    let walls: Vec<(&str, u64, Option<u64>)> =
        r.phases.iter().map(|(n, m)| (n.as_str(), m.wall_ns, m.busy_ns)).collect();
    assert_eq!(walls, vec![("forward", 150, Some(150)), ("optimizer", 100, Some(10)), ("unphased", 50, Some(50))]);
    assert!(close(r.phases["forward"].sm_activity.unwrap(), (50.0 + 100.0 * 0.5) / 150.0));
}

#[test]
fn top_kernels_and_time_shares() {
    let records = [
        name(1, "ampere_sgemm_128x64_nn"),
        name(2, "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>"),
        name(3, "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float>>"),
        kernel(0, 300, 4, 7, Some(1)),
        kernel(300, 350, 4, 7, Some(2)),
        kernel(350, 400, 4, 7, Some(2)),
        kernel(400, 450, 4, 7, Some(3)),
        kernel(450, 500, 4, 7, None),
    ];
    let r = report(&records);
    let top: Vec<(&str, u64, u64)> = r.run.top_kernels.iter().map(|t| (t.name.as_str(), t.count, t.total_ns)).collect();
    assert_eq!(
        top,
        vec![
            ("ampere_sgemm_128x64_nn", 1, 300),
            ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>", 2, 100),
            ("<unnamed>", 1, 50),
            ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float>>", 1, 50),
        ]
    );
    let s = r.run.time_share.expect("time share");
    for (got, want) in [(s.gemm_conv, 0.6), (s.elementwise, 0.2), (s.reduction, 0.1), (s.other, 0.1)] {
        assert!(close(got, want), "{s:?}");
    }
    let limited =
        report_with(&header(Some(4), Some((8, 0))), UtilOptions { top: 1, ..UtilOptions::default() }, &records);
    assert_eq!(limited.run.top_kernels.len(), 1);
}

#[test]
fn kernel_classes_by_name() {
    use KernelClass::*;
    let cases = [
        ("ampere_sgemm_128x64_nn", GemmConv),
        ("sm90_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize128x128x64", GemmConv),
        ("nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_NTN", GemmConv),
        ("void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_64x64_16x6_nn_align4>", GemmConv),
        ("void cudnn::cnn::conv2d_grouped_direct_kernel<float>", GemmConv),
        ("void implicit_convolve_sgemm<float, float, 128, 5, 5, 3, 3, 3, 1, false>", GemmConv),
        ("void cudnn::winograd_nonfused::winogradForwardData4x4<float, float>", GemmConv),
        ("void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, int, 512, true, 1>", Reduction),
        ("void at::native::batch_norm_collect_statistics_kernel<InvStd, float>", Reduction),
        ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float>", Reduction),
        ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float>>", Reduction),
        ("triton_red_fused_sum_0", Reduction),
        ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>", Elementwise),
        ("void at::native::unrolled_elementwise_kernel<at::native::copy_kernel>", Elementwise),
        ("triton_poi_fused_relu_0", Elementwise),
        ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<Adam>", Elementwise),
        ("void convert_fp32_to_fp16_kernel", Other),
        ("my_custom_kernel", Other),
    ];
    for (n, want) in cases {
        assert_eq!(classify(n), want, "{n}");
    }
}

#[test]
fn launches_only_traces_give_counts_and_rates() {
    let records = [phase(0, "forward"), launch(0), launch(1000), phase(1500, "backward"), launch(2000)];
    let r = report(&records);
    assert_eq!(r.timing, Timing::LaunchesOnly);
    assert!(r.notes.iter().any(|n| n.contains("MEMTRACE_CUPTI=1")), "{:?}", r.notes);
    assert_eq!((r.run.launches, r.run.wall_ns, r.run.busy_ns, r.run.mean_gap_ns), (3, 2000, None, None));
    assert!(r.run.sm_activity.is_none() && r.run.occupancy.is_none() && r.run.busy_fraction.is_none());
    assert!(close(r.run.launch_rate_per_s.unwrap(), 3.0 / 2e-6));
    let f = &r.phases["forward"];
    assert_eq!((f.launches, f.wall_ns), (2, 1500));
    assert!(close(f.launch_rate_per_s.unwrap(), 2.0 / 1.5e-6));
    assert_eq!(r.phases["backward"].launches, 1);
}

#[test]
fn launch_rate_uses_host_launches_when_present() {
    let r = report(&[launch(0), launch(10), k(0, 100, 4, 7), k(100, 200, 4, 7)]);
    assert_eq!(r.run.launches, 2);
    assert!(close(r.run.launch_rate_per_s.unwrap(), 2.0 / 200e-9));
    // Without launch records the CUPTI executions count.
    let r = report(&[k(0, 100, 4, 7), k(100, 200, 4, 7), k(200, 400, 4, 7)]);
    assert!(close(r.run.launch_rate_per_s.unwrap(), 3.0 / 400e-9));
}

#[test]
fn missing_device_facts_are_reported_and_fallbacks_used() {
    let records = [k(0, 100, 2, 7)];
    let bare = Header::new("test", "0", Level::Device);
    let r = report_with(&bare, UtilOptions::default(), &records);
    assert_eq!((r.sm_count, r.compute_capability), (None, None));
    assert!(r.run.sm_activity.is_none() && r.run.occupancy.is_none());
    assert_eq!(r.run.busy_fraction, Some(1.0));
    assert!(r.notes.iter().any(|n| n.contains("--sm-count")), "{:?}", r.notes);
    assert!(r.notes.iter().any(|n| n.contains("compute capability")), "{:?}", r.notes);

    let opts = UtilOptions { sm_count: Some(8), compute_capability: Some((9, 0)), top: 10 };
    let r = report_with(&bare, opts, &records);
    assert_eq!((r.sm_count, r.sm_count_source), (Some(8), Some(Source::Fallback)));
    assert_eq!(r.compute_capability_source, Some(Source::Fallback));
    assert!(close(r.run.sm_activity.unwrap(), 0.25));
    assert!(close(r.run.occupancy.unwrap(), 1.0));

    // The header wins over the fallback.
    let r = report_with(&header(Some(4), Some((8, 0))), opts, &records);
    assert_eq!((r.sm_count, r.sm_count_source), (Some(4), Some(Source::Header)));

    // A compute capability outside the table leaves occupancy out, with a reason.
    let r = report_with(&header(Some(4), Some((6, 1))), UtilOptions::default(), &records);
    assert!(r.run.occupancy.is_none() && r.run.sm_activity.is_some());
    assert!(r.notes.iter().any(|n| n.contains("6.1 is not in the occupancy table")), "{:?}", r.notes);
}

#[test]
fn grid_limited_occupancy_and_unlaunchable_kernels() {
    // 2 blocks on 4 SMs that could each hold 8: the grid fills 2 / 32 of the resident slots.
    let mut too_big = k(100, 200, 4, 7);
    if let Event::KernelExec(e) = &mut too_big.event {
        e.registers_per_thread = 300;
    }
    let r = report(&[k(0, 100, 2, 7), too_big]);
    assert!(close(r.run.occupancy_grid_limited.unwrap(), (100.0 * 2.0 / 32.0) / 200.0));
    assert!(close(r.run.occupancy.unwrap(), 0.5));
    assert_eq!(r.run.occupancy_unknown_kernels, 1);
}

#[test]
fn one_device_is_analysed() {
    let r = report(&[k(0, 100, 4, 7), k(100, 200, 4, 7), on_device(k(0, 1000, 4, 7), 1)]);
    assert_eq!(r.device, Some(0));
    assert_eq!(r.other_devices.into_iter().collect::<Vec<_>>(), vec![(1, 1)]);
    assert_eq!(r.run.wall_ns, 200);
}

#[test]
fn empty_trace_has_no_timing() {
    let r = report(&[phase(0, "forward")]);
    assert_eq!(r.timing, Timing::None);
    assert_eq!(r.run.wall_ns, 0);
    assert!(r.run.busy_fraction.is_none() && r.run.launch_rate_per_s.is_none());
}

#[test]
fn corrupt_records_do_not_panic_and_unknown_occupancy_is_absent() {
    // Huge grids and durations saturate instead of overflowing; a 2048-thread block cannot
    // launch, so the scope has no occupancy rather than 0%.
    let mut huge = k(0, u64::MAX / 2, 1, 7);
    if let Event::KernelExec(e) = &mut huge.event {
        e.grid = [u32::MAX; 3];
        e.block = [2048, 1, 1];
    }
    let mut huge2 = huge.clone();
    if let Event::KernelExec(e) = &mut huge2.event {
        e.end_ns = u64::MAX;
    }
    let r = report(&[huge, huge2]);
    assert_eq!(r.run.kernel_time_ns, u64::MAX);
    assert_eq!(r.run.occupancy, None);
    assert_eq!(r.run.occupancy_unknown_kernels, 2);
    assert_eq!(r.run.sm_activity, Some(1.0));
}
