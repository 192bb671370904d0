//! The fit check: the in-memory shortcut (the budget replay only when the unlimited one exceeds
//! the budget) gives what the lockstep replay gives, at every budget, with and without
//! capacity-sensitive allocator settings; margins and verdicts keep their invariants.

use simulator::fit::{fit_records, Capacity, CapacitySource, FitReplay, Margin, Verdict};
use simulator::replay::ReplayOptions;
use trace::{Header, Level, Record};

use crate::records::{alloc, fraction, free};

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
/// 9 GiB (6 GiB beside 3 GiB cached) needs a 90 GiB device: the need says so, and so the verdict
/// on 40 GiB (the need was 6 GiB, FITS, beside a replay at the budget that failed). On 60 GiB
/// the limit frees the cache and the 6 GiB fit: the replay there survives and needs 60 GiB. At
/// 0.5 the 3 GiB cached beside the 6 GiB stay reserved under the limit, so 18 GiB.
#[test]
fn a_programs_memory_fraction_sets_the_device_it_needs() {
    const GIB: u64 = 1 << 30;
    let mut h = Header::new("test", "0", Level::Allocator);
    h.synthetic_addresses = true;
    let outside = simulator::fit::Outside::fixed(0);
    let cap = Capacity { bytes: 40 * GIB, source: CapacitySource::Flag };
    // Without a device (no budget) the fraction limits nothing: 9 GiB stay reserved, and the
    // need is what they ask of a device; on 40 GiB, where the replay at the budget fails, the
    // need is that too (the whole run, not the part before the limit stopped it).
    for (f, unlimited, at_40) in [(0.1, 90 * GIB, 90 * GIB), (0.5, 18 * GIB, 18 * GIB), (1.0, 9 * GIB, 9 * GIB)] {
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
    let recs = vec![fraction(0.1), alloc(1, 3 * GIB, None), free(1), alloc(2, 6 * GIB, None)];
    let opts = ReplayOptions { device_total: Some(60 * GIB), ..ReplayOptions::default() };
    let out = fit_records(&h, &recs, &opts, Some(60 * GIB)).unwrap();
    assert!(!out.first_oom.oom && out.peaks_at_budget);
    assert_eq!(out.device_peak(&outside), 60 * GIB);
}

/// The need under a fraction is what the whole run reserves over it, and the verdict on it agrees
/// with the replay at the budget, in both paths (the lockstep replay `memsim replay` streams, the
/// in-memory one `memest` and `memsim colocate` take). The replay without a budget took the
/// device's total for the fraction's base and stopped at it: its peak was the 2 MiB before the
/// failure (0 B at a fraction of 0), and 10000 MiB FITS stood beside the failed replay at 40 GiB.
#[test]
fn a_fraction_too_small_for_the_run_needs_what_it_reserves_over_the_fraction() {
    use simulator::fit::{FitOutcome, Outside};
    let mut h = Header::new("test", "0", Level::Allocator);
    h.synthetic_addresses = true;
    // A 2 MiB small segment and a 20 MiB large one; the 512 KiB reuses the small one's cache.
    let run =
        |f: f64| vec![fraction(f), alloc(1, MIB, None), alloc(2, 2 * MIB, None), free(1), alloc(3, MIB / 2, None)];
    const RESERVED: u64 = 22 * MIB;
    let need_of = |f: f64| if f > 0.0 { (RESERVED as f64 / f).ceil() as u64 } else { u64::MAX };
    let a100 = 42_505_273_344;
    for (f, capacity, outside) in [(0.0004, a100, 400 * MIB), (0.0006, 30_000 * MIB, 0), (0.0, 40 << 30, 0)] {
        let outside = Outside::fixed(outside);
        let cap = Capacity { bytes: capacity, source: CapacitySource::Flag };
        let opts = ReplayOptions { device_total: Some(capacity), ..ReplayOptions::default() };
        let recs = run(f);
        let budget = Some(outside.budget(capacity));
        let mut lock = FitReplay::new(&h, &opts, budget).unwrap();
        recs.iter().for_each(|r| lock.observe(r));
        let paths: [(&str, FitOutcome); 2] =
            [("lockstep", lock.finish()), ("in memory", fit_records(&h, &recs, &opts, budget).unwrap())];
        for (path, out) in paths {
            let case = format!("{path}: fraction {f} on {capacity} B");
            assert!(out.first_oom.oom, "{case}: the replay at the budget fails");
            assert_eq!(out.report.peaks.peak_reserved_bytes, RESERVED, "{case}: every request placed");
            assert_eq!(out.report.fraction_need_bytes, need_of(f), "{case}");
            assert_eq!(out.device_peak(&outside), need_of(f), "{case}");
            assert!(!Verdict::new("point", out.device_peak(&outside), cap).fits, "{case}");
        }
    }
    // A fraction lowered after 100 MiB were reserved and freed: PyTorch checks it only when it
    // reserves, so 10 MiB served from the cache ask nothing of it (the need counted the 100 MiB
    // cached over 0.01, 10000 MiB, and said DOES NOT FIT beside a replay at the budget that
    // survived); 200 MiB, which the cache cannot serve, reserve under it.
    let lowered = |f: f64, mib: u64| vec![alloc(1, 100 * MIB, None), free(1), fraction(f), alloc(2, mib * MIB, None)];
    // At any fraction and capacity, the verdict is the replay at the budget's, in both paths,
    // with native and expandable segments (whose check counts the whole allocation size).
    for conf in [None, Some("expandable_segments:True")] {
        for f in [0.0004, 0.0006, 0.001, 0.01, 0.3, 0.5, 1.0] {
            for capacity in [30 * MIB, 50 * MIB, 100 * MIB, 3500 * MIB, 4000 * MIB, 30_000 * MIB, 40 << 30, 80 << 30] {
                let cap = Capacity { bytes: capacity, source: CapacitySource::Flag };
                let outside = Outside::fixed(0);
                let alloc_conf = conf.map(str::to_string);
                let opts = ReplayOptions { device_total: Some(capacity), alloc_conf, ..ReplayOptions::default() };
                // 30 MiB in an expandable segment map 40 MiB (20 MiB pages); the check counts 30.
                let pages = vec![fraction(f), alloc(1, 30 * MIB, None)];
                let runs =
                    [("run", run(f)), ("cached", lowered(f, 10)), ("uncached", lowered(f, 200)), ("pages", pages)];
                for (name, recs) in runs {
                    let mut lock = FitReplay::new(&h, &opts, Some(capacity)).unwrap();
                    recs.iter().for_each(|r| lock.observe(r));
                    let paths = [
                        ("lockstep", lock.finish()),
                        ("in memory", fit_records(&h, &recs, &opts, Some(capacity)).unwrap()),
                    ];
                    for (path, out) in paths {
                        let fits = Verdict::new("point", out.device_peak(&outside), cap).fits;
                        assert_eq!(
                            fits,
                            !out.first_oom.oom,
                            "{conf:?} {name} {path}: fraction {f} on {} MiB: need {}",
                            capacity / MIB,
                            out.device_peak(&outside)
                        );
                    }
                }
            }
        }
    }
    // The cached request needs only what the run reserved, with no fraction term; the
    // uncached one the 300 MiB it reserved over the fraction, as a fraction set first would.
    let opts = ReplayOptions { device_total: Some(1000 * MIB), ..ReplayOptions::default() };
    let out = fit_records(&h, &lowered(0.01, 10), &opts, Some(1000 * MIB)).unwrap();
    assert_eq!((out.first_oom.oom, out.report.fraction_need_bytes), (false, 0));
    assert_eq!(out.device_peak(&Outside::fixed(0)), 100 * MIB);
    let out = fit_records(&h, &lowered(0.01, 200), &opts, None).unwrap();
    assert_eq!(out.report.fraction_need_bytes, 30_000 * MIB);
}

/// Two jobs, each capping its allocator at half the device and reserving 22 MiB, need 44 MiB
/// together: each may reserve 30 of 60 MiB. Without timestamps the sum of peaks added the
/// device totals their fractions ask for (44 MiB each, 88 MiB: DOES NOT FIT on 60 MiB), where
/// the aligned replay of the same jobs needed 44 MiB. A fraction is a floor under the sum, not a
/// term of it: a job capped at 0.0006 asks for 36667 MiB, once, not twice. Safe numbers alike.
#[test]
fn colocated_jobs_memory_fractions_are_a_floor_not_a_sum() {
    use simulator::colocate::{colocate, sum_of_peaks, Align, Job, Mode};
    use simulator::fit::Outside;
    let run = |f: f64, timed: bool| {
        let mut recs =
            vec![fraction(f), alloc(1, MIB, None), alloc(2, 2 * MIB, None), free(1), alloc(3, MIB / 2, None)];
        if !timed {
            recs.iter_mut().for_each(|r| r.ts_ns = None);
        }
        recs
    };
    let mut h = Header::new("test", "0", Level::Allocator);
    h.synthetic_addresses = true;
    let job = |name: &str, f: f64, timed: bool, margin: f64| Job {
        name: name.into(),
        header: h.clone(),
        records: run(f, timed),
        outside: Outside::fixed(0),
        margin: Margin { fraction: margin, ..Margin::none(String::new(), "", true) },
    };
    let cap = Some(Capacity { bytes: 60 * MIB, source: CapacitySource::Flag });
    let opts = ReplayOptions::default();
    for (timed, mode) in [(false, Mode::SumOfPeaks), (true, Mode::Timestamps)] {
        let jobs = [job("a", 0.5, timed, 0.0), job("b", 0.5, timed, 0.0)];
        let r = colocate(&jobs, &opts, cap, Align::Auto, true).unwrap();
        assert_eq!(r.mode, mode);
        assert_eq!((r.combined_need_bytes, r.fits), (44 * MIB, true), "{mode:?}: {:?}", r.verdict);
        for j in &r.jobs {
            assert_eq!(
                (j.fraction_need_bytes, j.held_bytes(true), j.device_peak_bytes),
                (44 * MIB, 22 * MIB, 44 * MIB)
            );
            assert!(j.fraction_sets_peak());
        }
        // A fraction too small for the run: the largest asks for the device, once.
        let jobs = [job("a", 0.0006, timed, 0.0), job("b", 0.0006, timed, 0.0)];
        let r = colocate(&jobs, &opts, cap, Align::Auto, true).unwrap();
        let need = (22.0 * MIB as f64 / 0.0006).ceil() as u64;
        assert_eq!((r.combined_need_bytes, r.fits), (need, false), "{mode:?}");
        assert_eq!(r.smallest_fitting_capacity, need, "{mode:?}");
    }
    // Safe numbers: the margins on what the jobs hold, summed, or on the largest fraction's total.
    let jobs = [job("a", 0.5, false, 0.5), job("b", 0.5, false, 0.5)];
    let r = colocate(&jobs, &opts, cap, Align::Auto, false).unwrap();
    assert_eq!(r.jobs[0].held_bytes(false), 33 * MIB);
    assert_eq!(r.jobs[0].fraction_bytes(false), 66 * MIB);
    assert_eq!(r.jobs[0].device_safe_bytes, 66 * MIB);
    assert_eq!((r.combined_need_bytes, sum_of_peaks(&r.jobs, false), r.fits), (66 * MIB, 66 * MIB, false));
    let jobs = [job("a", 1.0, false, 0.5), job("b", 1.0, false, 0.5), job("c", 0.5, false, 0.5)];
    let r = colocate(&jobs, &opts, None, Align::Auto, false).unwrap();
    assert_eq!((r.combined_need_bytes, sum_of_peaks(&r.jobs, true)), (99 * MIB, 66 * MIB));
}
