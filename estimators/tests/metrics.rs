//! Metrics against hand-computed cases, edge cases included.

use estimators::metrics::{accuracy_f1, bin_of, compute, percentiles, quantile, PefKind, Run};

const MIB: f64 = 1024.0 * 1024.0;
const GPU: f64 = 10_000.0 * MIB;

fn run(truth: f64, est: f64) -> Run {
    Run { truth: Some(truth * MIB), real_oom: false, estimate: Ok(est * MIB), capped_rerun_ok: None, seconds: None }
}

fn oom_run(est: f64) -> Run {
    Run { truth: None, real_oom: true, estimate: Ok(est * MIB), capped_rerun_ok: None, seconds: None }
}

fn close(a: Option<f64>, b: f64) -> bool {
    a.is_some_and(|a| (a - b).abs() < 1e-9)
}

#[test]
fn quantiles_interpolate_like_numpy() {
    let check = |v: &[f64], q: f64, want: Option<f64>| assert_eq!(quantile(v, q), want, "{v:?} q={q}");
    check(&[], 0.5, None);
    check(&[3.0], 0.99, Some(3.0));
    check(&[1.0, 2.0, 3.0, 4.0], 0.5, Some(2.5));
    check(&[0.0, 10.0], 0.8, Some(8.0));
    check(&[0.0, 10.0, 20.0], 1.0, Some(20.0));
    let p = percentiles(&[4.0, 1.0, 3.0, 2.0, 5.0]).unwrap();
    assert_eq!((p.p50, p.max), (3.0, 5.0));
    assert!((p.p80 - 4.2).abs() < 1e-12);
}

#[test]
fn mre_signed_under_and_mib_percentiles() {
    // Relative errors 0.5 (under), 0.1 (over), 0.0: median 0.1; signed median 0.0.
    let m = compute(&[run(1000.0, 500.0), run(1000.0, 1100.0), run(2000.0, 2000.0)], GPU);
    assert!(close(m.mre, 0.1), "{:?}", m.mre);
    assert!(close(m.median_signed, 0.0));
    assert!(close(m.under_fraction, 1.0 / 3.0));
    let a = m.abs_mib.unwrap();
    assert_eq!((a.p50, a.max), (100.0, 500.0));
    assert_eq!(m.estimated, 3);
}

#[test]
fn pef_and_mcp_follow_xmem() {
    // Proxy: a run fails when its estimate is below truth. 1 failure in 2 runs.
    let m = compute(&[run(1000.0, 1200.0), run(1000.0, 800.0)], GPU);
    assert_eq!(m.pef_kind, PefKind::Proxy);
    assert!(close(m.pef, 50.0));
    // MCP (GB per run): (GPU − 1200 MiB) saved by the correct run, a whole GPU lost by the wrong one.
    let want = ((GPU - 1200.0 * MIB) - GPU) / 2.0 / 1e9;
    assert!(close(m.mcp_gb, want), "{:?} vs {want}", m.mcp_gb);
    // Simulated reruns override the proxy: an underestimate whose capped rerun survives is fine.
    let mut r = run(1000.0, 800.0);
    r.capped_rerun_ok = Some(true);
    let m = compute(&[r], GPU);
    assert_eq!((m.pef, m.pef_kind), (Some(0.0), PefKind::Simulated));
    // An estimate above the GPU predicts OOM: wrong verdict for a run that fit.
    let m = compute(&[run(1000.0, 20_000.0)], GPU);
    assert!(close(m.pef, 100.0));
}

#[test]
fn all_oom_runs() {
    // Real OOMs are right only when OOM is predicted; they carry no relative error.
    let m = compute(&[oom_run(20_000.0), oom_run(5_000.0)], GPU);
    assert!(close(m.pef, 50.0));
    assert_eq!(m.mre, None);
    assert_eq!(m.abs_rel, None);
    assert!(m.bins.is_empty());
    // Case (b) saves a whole GPU (xMem's definition); the failure costs one.
    assert!(close(m.mcp_gb, 0.0));
}

#[test]
fn no_runs_and_unestimated_runs() {
    let m = compute(&[], GPU);
    assert_eq!((m.runs, m.estimated, m.mre, m.pef, m.mcp_gb), (0, 0, None, None, None));
    let failed = Run {
        truth: Some(MIB),
        real_oom: false,
        estimate: Err("no trace".into()),
        capped_rerun_ok: None,
        seconds: None,
    };
    let m = compute(&[failed.clone(), failed, run(1000.0, 1000.0)], GPU);
    assert_eq!(m.not_estimated.get("no trace"), Some(&2));
    assert_eq!((m.runs, m.estimated), (3, 1));
    assert!(close(m.pef, 0.0));
}

#[test]
fn zero_truth_is_counted_not_divided() {
    let m = compute(&[run(0.0, 10.0), run(100.0, 110.0)], GPU);
    assert_eq!(m.zero_truth, 1);
    assert!(close(m.mre, 0.1));
}

#[test]
fn bins_are_right_closed() {
    let check = |mib: f64, w: f64, want: i64| assert_eq!(bin_of(mib, w), want, "{mib} in width {w}");
    check(1000.0, 1000.0, 0);
    check(1000.5, 1000.0, 1);
    check(2000.0, 1000.0, 1);
    check(0.0, 1000.0, 0);
    check(8192.0, 8192.0, 0);
    check(8193.0, 8192.0, 1);
}

#[test]
fn accuracy_and_macro_f1() {
    // Classes: truth [0,0,1,1], pred [0,1,1,1]. Acc 0.75. F1(0) = 2/(2+0+1) = 2/3; F1(1) = 4/(4+1+0) = 0.8.
    let (acc, f1) = accuracy_f1(&[(0, 0), (0, 1), (1, 1), (1, 1)]).unwrap();
    assert!((acc - 0.75).abs() < 1e-12);
    assert!((f1 - (2.0 / 3.0 + 0.8) / 2.0).abs() < 1e-12);
    assert_eq!(accuracy_f1(&[]), None);
    let m = compute(&[run(500.0, 900.0), run(1500.0, 2100.0)], GPU);
    let b1 = m.bins.iter().find(|b| b.width_gib == 1.0).unwrap();
    // 1 GiB bins: 500→0, 900→0 (right), 1500→1, 2100→2 (wrong).
    assert!((b1.accuracy - 0.5).abs() < 1e-12);
}

#[test]
fn latency_percentiles() {
    let mut runs: Vec<Run> = (1..=100).map(|i| run(100.0, 100.0 + i as f64)).collect();
    for (i, r) in runs.iter_mut().enumerate() {
        r.seconds = Some((i + 1) as f64);
    }
    let m = compute(&runs, GPU);
    assert!(close(m.latency_p50_s, 50.5));
    assert!(close(m.latency_p99_s, 99.01));
}

/// A measured peak of 0 MiB is a failed measurement: it was left out of MRE but judged accurate
/// in PEF and MCP ("estimate >= 0").
#[test]
fn zero_truth_is_left_out_of_pef_and_mcp() {
    let m = compute(&[run(0.0, 10.0), run(100.0, 90.0)], GPU);
    assert_eq!((m.estimated, m.zero_truth), (2, 1));
    assert_eq!(m.pef, Some(100.0), "the one judged run is under its truth");
    assert!(close(m.mcp_gb, -GPU / 1e9), "{:?}", m.mcp_gb);
    // Only 0-MiB truths: nothing judged.
    let m = compute(&[run(0.0, 10.0)], GPU);
    assert_eq!((m.pef, m.mcp_gb), (None, None));
}
