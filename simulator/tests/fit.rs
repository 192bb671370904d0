//! The fit check: the in-memory shortcut (the budget replay only when the unlimited one exceeds
//! the budget) gives what the lockstep replay gives, at every budget, with and without
//! capacity-sensitive allocator settings; margins and verdicts keep their invariants.

use simulator::fit::{fit_records, Capacity, CapacitySource, FitReplay, Margin, Verdict};
use simulator::replay::ReplayOptions;
use trace::{Header, Level, Record};

use crate::records::{alloc, free};

const MIB: u64 = 1 << 20;

/// Tensors of mixed sizes, freed out of order, so caching and the retry path both matter.
fn records() -> Vec<Record> {
    let sizes = [30, 12, 3, 45, 7, 60, 25, 1, 90, 14];
    let mut v = Vec::new();
    for (i, s) in sizes.iter().enumerate() {
        v.push(alloc(i as u64 + 1, s * MIB + 4096 * i as u64, None));
        if i % 3 == 2 {
            v.push(free(i as u64 - 1));
        }
    }
    for i in [1u64, 3, 4, 5, 7, 8, 9, 10] {
        v.push(free(i));
    }
    v
}

#[test]
fn the_shortcut_equals_the_lockstep_replay_at_every_budget() {
    let mut h = Header::new("test", "0", Level::Allocator);
    h.synthetic_addresses = true;
    let recs = records();
    for conf in [None, Some("garbage_collection_threshold:0.6")] {
        let opts = ReplayOptions { alloc_conf: conf.map(str::to_string), ..ReplayOptions::default() };
        for budget in (0..=400).step_by(10).map(|m| m * MIB) {
            let short = fit_records(&h, &recs, &opts, Some(budget)).unwrap();
            let mut lock = FitReplay::new(&h, &opts, Some(budget)).unwrap();
            recs.iter().for_each(|r| lock.observe(r));
            let lock = lock.finish();
            let key = |f: &simulator::fit::FitOutcome| {
                (
                    f.first_oom.oom,
                    f.first_oom.oom_at_event,
                    f.budget,
                    f.report.peaks.peak_reserved_bytes,
                    f.report.peaks.peak_allocated_bytes,
                )
            };
            assert_eq!(key(&short), key(&lock), "{conf:?} at budget {} MiB", budget / MIB);
        }
    }
}

#[test]
fn safe_numbers_never_undercut_the_point_and_verdicts_follow_their_numbers() {
    let cap = Capacity { bytes: 1000, source: CapacitySource::Flag };
    for (fraction, scale) in [(0.0, "point"), (0.1, "point"), (0.5, "reserved"), (2.0, "reserved")] {
        let m = Margin { fraction, scale: scale.into(), ..Margin::none(String::new(), "", true) };
        for (point, reserved) in [(0u64, 0u64), (900, 100), (1000, 999), (1, 1)] {
            let safe = m.safe(point, reserved);
            assert!(safe >= point, "{fraction} {scale}: {safe} < {point}");
            let v = Verdict::new("safe", safe, cap);
            assert_eq!(v.fits, safe <= 1000);
        }
    }
}

/// A user's marker on device 0.
fn marker(text: &str) -> Record {
    Record { ts_ns: None, tid: None, device: Some(0), event: trace::Event::Marker(trace::Marker { text: text.into() }) }
}

/// An allocator-level header of synthetic addresses.
fn synthetic_header() -> Header {
    let mut h = Header::new("test", "0", Level::Allocator);
    h.synthetic_addresses = true;
    h
}

#[test]
fn iteration_peaks_split_the_run_at_iter_markers() {
    use simulator::replay::Replayer;
    let h = synthetic_header();
    // A 40 MiB block lives across iteration 0 into 1 (setup memory counts in both windows);
    // iteration 0 peaks with 60 MiB more, iteration 1 with 10 MiB more, iteration 2 holds nothing new.
    let recs = vec![
        alloc(1, 40 * MIB, None),
        marker("iter:0"),
        alloc(2, 60 * MIB, None),
        free(2),
        marker("iter:1"),
        alloc(3, 10 * MIB, None),
        free(3),
        marker("user text"),
        marker("iter:2"),
    ];
    let mut rp = Replayer::new(&h, ReplayOptions::default()).unwrap();
    recs.iter().for_each(|r| rp.observe(r));
    let rep = rp.finish();
    let got: Vec<(u64, u64)> = rep.iterations.iter().map(|i| (i.iter, i.peak_allocated_bytes / MIB)).collect();
    assert_eq!(got, vec![(0, 100), (1, 50), (2, 40)]);
    let (first, steady) = rep.step_peaks().unwrap();
    assert_eq!((first.peak_allocated_bytes / MIB, steady.unwrap().peak_allocated_bytes / MIB), (100, 50));
    assert!(first.peak_reserved_bytes >= first.peak_allocated_bytes);
    assert_eq!(steady.unwrap().iter, 2);
}

/// A job that keeps memory across steps (a tensor appended to a list each step) has no steady
/// state: the trace's last step was taken for what a long run holds, in silence. A leak of the
/// same 2 MiB a step beside 200 MiB held (under 1% a step) was silent too; growth by uneven
/// amounts under 1% a step (a steady job's jitter) is not said.
#[test]
fn a_peak_growing_at_every_step_is_said() {
    use simulator::replay::Replayer;
    let h = synthetic_header();
    let run = |kept: [u64; 4]| {
        // Each step: a 100 MiB transient, and `kept[i]` MiB held from then on.
        let mut recs = vec![alloc(1, 200 * MIB, None)];
        for (i, kept) in (0..4u64).zip(kept) {
            recs.push(marker(&format!("iter:{i}")));
            recs.push(alloc(10 + i, 100 * MIB, None));
            recs.push(free(10 + i));
            if kept > 0 {
                recs.push(alloc(100 + i, kept * MIB, None));
            }
        }
        let mut rp = Replayer::new(&h, ReplayOptions::default()).unwrap();
        recs.iter().for_each(|r| rp.observe(r));
        rp.finish().warnings()
    };
    for (kept, said) in [([20; 4], "20.00"), ([2; 4], "2.00")] {
        let leak = run(kept);
        let words = format!("grows at every step after the first, by about {said} MiB a step (steps 2 to 4)");
        assert!(leak.iter().any(|w| w.contains(&words)), "{kept:?}: {leak:?}");
    }
    for kept in [[0; 4], [2, 1, 2, 1]] {
        let steady = run(kept);
        assert!(!steady.iter().any(|w| w.contains("grows")), "{kept:?} MiB a step: {steady:?}");
    }
}

/// The one rule of which outside-allocator terms a job pays: the bytes `outside` reports and the
/// MiB calibration fits (`outside_mib`) are the same terms, for every mix of libraries and ranks.
#[test]
fn outside_bytes_and_calibration_mib_take_the_same_terms() {
    use simulator::fit::{outside, outside_mib, Libraries};
    let (profile, _) = simulator::profile::Profile::load("a100-40gb").unwrap();
    for gemm in [false, true] {
        for conv in [false, true] {
            for ranks in [1, 2, 8] {
                let libs = Libraries { gemm, conv, source: "test", ranks };
                let bytes = outside(&profile, "test", libs).total_bytes as f64;
                let mib = outside_mib(&profile.outside_allocator, libs);
                assert!((bytes / (1024.0 * 1024.0) - mib).abs() < 1e-5, "{libs:?}: {bytes} B vs {mib} MiB");
            }
        }
    }
}

/// A program that caps its allocator (`set_per_process_memory_fraction(0.1)`) and reserves
/// 6 GiB under it needs a 60 GiB device: the need says so, and so the verdict on 40 GiB (the
/// need was 6 GiB, FITS, beside a replay at the budget that failed). At 0.5 the 3 GiB cached
/// beside the 6 GiB stay reserved under the limit, so 18 GiB (a 12 GiB device would free them).
#[test]
fn a_programs_memory_fraction_sets_the_device_it_needs() {
    use trace::{Control, ControlOp, Event};
    const GIB: u64 = 1 << 30;
    let mut h = Header::new("test", "0", Level::Allocator);
    h.synthetic_addresses = true;
    let fraction = |f: f64| Record {
        ts_ns: Some(0),
        tid: None,
        device: Some(0),
        event: Event::Control(Control { op: ControlOp::SetMemoryFraction { fraction: f } }),
    };
    let outside = simulator::fit::Outside::fixed(0);
    let cap = Capacity { bytes: 40 * GIB, source: CapacitySource::Flag };
    // Without a device (no budget) the fraction limits nothing: 9 GiB stay reserved, and the
    // need is what they ask of a device; on 40 GiB the limit frees the cache first.
    for (f, unlimited, at_40) in [(0.1, 90 * GIB, 60 * GIB), (0.5, 18 * GIB, 18 * GIB), (1.0, 9 * GIB, 9 * GIB)] {
        let recs = vec![fraction(f), alloc(1, 3 * GIB, None), free(1), alloc(2, 6 * GIB, None)];
        for (budget, need) in [(None, unlimited), (Some(cap.bytes), at_40)] {
            let opts = ReplayOptions { device_total: budget, ..ReplayOptions::default() };
            let out = fit_records(&h, &recs, &opts, budget).unwrap();
            assert!(!out.report.first_oom.oom || budget.is_some(), "fraction {f}: no device, no limit");
            assert_eq!(out.device_peak(&outside), need, "fraction {f}, budget {budget:?}");
            assert_eq!(Verdict::new("point", out.device_peak(&outside), cap).fits, need <= cap.bytes);
            if budget.is_some() {
                assert_eq!(out.first_oom.oom, need > cap.bytes, "fraction {f}: the replay at the budget");
            }
        }
    }
}
