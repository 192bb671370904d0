//! Event timestamps. The hot path takes a raw stamp: the TSC where it is invariant (one `rdtsc`,
//! no vDSO call), CLOCK_MONOTONIC nanoseconds elsewhere. The writer maps stamps to
//! CLOCK_MONOTONIC with [`Calibration`]: a piecewise-linear map through (TSC, CLOCK_MONOTONIC)
//! pairs that it samples itself, so the map is exact at every sample and monotonic, and events
//! of one thread keep their order. CLOCK_MONOTONIC_COARSE is not an option: its 1–4 ms ticks
//! would give most events of a step the same time.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};

static TSC: AtomicBool = AtomicBool::new(false);

/// CLOCK_MONOTONIC in ns (vDSO, no syscall, no allocation).
#[inline]
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // Safety: ts is a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[cfg(target_arch = "x86_64")]
fn invariant_tsc() -> bool {
    use core::arch::x86_64::__cpuid;
    let max_ext = __cpuid(0x8000_0000).eax;
    // Leaf 0x8000_0007, EDX bit 8: the TSC runs at a constant rate in every P-, C- and T-state
    // and is synchronised across cores (Linux: constant_tsc + nonstop_tsc). Leaf 0x8000_0001,
    // EDX bit 27: `rdtscp`, which [`stamp`] takes.
    max_ext >= 0x8000_0007 && __cpuid(0x8000_0007).edx & (1 << 8) != 0 && __cpuid(0x8000_0001).edx & (1 << 27) != 0
}

#[cfg(not(target_arch = "x86_64"))]
fn invariant_tsc() -> bool {
    false
}

/// Decide the stamp source, once, at load. `MEMTRACE_TSC=0`-style overrides are not needed:
/// without an invariant TSC the shim uses CLOCK_MONOTONIC.
pub fn init() {
    TSC.store(invariant_tsc(), Ordering::Relaxed);
}

/// Whether stamps are TSC ticks (else CLOCK_MONOTONIC ns).
pub fn is_tsc() -> bool {
    TSC.load(Ordering::Relaxed)
}

/// A raw timestamp for the hot path. `rdtsc` may execute before earlier loads complete: a free
/// on one thread of a pointer another thread's allocation handed over was stamped up to 16 ns
/// before that allocation, the writer's merge put it first, and the replay read a free of an
/// unknown block and a peak twice the real one. `rdtscp` waits for every earlier instruction
/// of the thread and its loads, so an event stamps after what caused it (8 to 10 ns more a
/// call than `rdtsc`, docs/benchmarks.md; CLOCK_MONOTONIC's vDSO read orders its TSC read alike).
#[inline(always)]
pub fn stamp() -> u64 {
    #[cfg(target_arch = "x86_64")]
    if TSC.load(Ordering::Relaxed) {
        return stamp_tsc();
    }
    now_ns()
}

/// A (TSC, CLOCK_MONOTONIC) pair taken back to back.
fn sample() -> (u64, u64) {
    // The pair is taken twice and the tighter one kept, so a preemption between the two reads
    // does not skew a sample.
    let take = || {
        let t0 = stamp_tsc();
        let ns = now_ns();
        let t1 = stamp_tsc();
        (t0 / 2 + t1 / 2, ns, t1.wrapping_sub(t0))
    };
    let (a, b) = (take(), take());
    let best = if a.2 <= b.2 { a } else { b };
    (best.0, best.1)
}

/// The TSC as [`stamp`] reads it (the calibration's pairs take the same instruction).
#[inline(always)]
fn stamp_tsc() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        let mut aux = 0u32;
        // Safety: rdtscp's only precondition, CPU support, is checked before the TSC is used
        // ([`invariant_tsc`]); `aux` is a valid out-pointer.
        unsafe { core::arch::x86_64::__rdtscp(&mut aux) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        now_ns()
    }
}

/// Samples kept: at least a second of history at the sampling interval.
const HISTORY: usize = 1024;
/// Sample at most this often.
const INTERVAL_NS: u64 = 1_000_000;

/// One piece of the map: `ns = ns0 + ((stamp - tsc0) * mult) >> 32` for stamps in
/// `[tsc0, tsc1)`; `mult` is ns per tick in 32.32 fixed point.
#[derive(Debug, Clone, Copy)]
struct Segment {
    tsc0: u64,
    tsc1: u64,
    ns0: u64,
    mult: u64,
}

impl Segment {
    fn between(a: (u64, u64), b: (u64, u64)) -> Segment {
        let mult = (u128::from(b.1 - a.1) << 32) / u128::from((b.0 - a.0).max(1));
        Segment { tsc0: a.0, tsc1: b.0, ns0: a.1, mult: mult.min(u128::from(u64::MAX)) as u64 }
    }

    fn apply(&self, stamp: u64) -> u64 {
        if stamp >= self.tsc0 {
            self.ns0.saturating_add(self.scaled(stamp - self.tsc0))
        } else {
            self.ns0.saturating_sub(self.scaled(self.tsc0 - stamp))
        }
    }

    /// `ticks` in ns (saturating).
    #[inline(always)]
    fn scaled(&self, ticks: u64) -> u64 {
        let d = (u128::from(ticks) * u128::from(self.mult)) >> 32;
        d.min(u128::from(u64::MAX)) as u64
    }
}

/// The writer's stamp → CLOCK_MONOTONIC map.
pub struct Calibration {
    tsc: bool,
    points: VecDeque<(u64, u64)>,
    /// The segment the last stamp fell in: stamps arrive nearly sorted, so this is almost
    /// always the one, without a search.
    last: Option<Segment>,
}

impl Calibration {
    /// Start with the anchor taken at load (`origin`): the map's first point.
    pub fn new(anchor: (u64, u64)) -> Calibration {
        let mut points = VecDeque::with_capacity(HISTORY);
        points.push_back(anchor);
        Calibration { tsc: is_tsc(), points, last: None }
    }

    /// Take a new pair if the last one is older than the interval. Call before converting
    /// stamps taken before this call.
    pub fn refresh(&mut self) {
        if !self.tsc {
            return;
        }
        let last = *self.points.back().expect("never empty");
        let now = now_ns();
        if now.saturating_sub(last.1) < INTERVAL_NS && self.points.len() > 1 {
            return;
        }
        let (t, ns) = sample();
        if t <= last.0 || ns < last.1 {
            return;
        }
        if self.points.len() == HISTORY {
            // Keep the anchor: the oldest segment extrapolates for stamps before it.
            self.points.remove(1);
        }
        self.points.push_back((t, ns));
        // The open-ended last segment now ends here.
        self.last = None;
    }

    /// CLOCK_MONOTONIC ns for a stamp. Inlined into the writer's per-event path: almost every
    /// stamp falls in the segment of the one before, which takes a compare and a multiply.
    #[inline(always)]
    pub fn to_ns(&mut self, stamp: u64) -> u64 {
        if let Some(s) = &self.last {
            if stamp >= s.tsc0 && stamp < s.tsc1 {
                return s.ns0.saturating_add(s.scaled(stamp - s.tsc0));
            }
        }
        self.search_to_ns(stamp)
    }

    #[inline(never)]
    fn search_to_ns(&mut self, stamp: u64) -> u64 {
        if !self.tsc {
            return stamp;
        }
        let n = self.points.len();
        if n == 1 {
            return self.points[0].1;
        }
        // The last point at or below the stamp; outside the points, the first or last segment
        // extrapolates.
        let i = self.points.partition_point(|p| p.0 <= stamp).clamp(1, n - 1);
        let mut seg = Segment::between(self.points[i - 1], self.points[i]);
        if i == n - 1 {
            seg.tsc1 = u64::MAX;
        }
        self.last = Some(seg);
        seg.apply(stamp)
    }
}

/// A (stamp, CLOCK_MONOTONIC) anchor for [`Calibration::new`].
pub fn anchor() -> (u64, u64) {
    if is_tsc() {
        sample()
    } else {
        let ns = now_ns();
        (ns, ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cal(points: &[(u64, u64)]) -> Calibration {
        Calibration { tsc: true, points: points.iter().copied().collect(), last: None }
    }

    #[test]
    fn piecewise_linear_and_exact_at_samples() {
        let mut c = cal(&[(1000, 0), (3000, 1000), (5000, 3000)]);
        let mut check = |stamp, ns| assert_eq!(c.to_ns(stamp), ns, "stamp {stamp}");
        check(1000, 0);
        check(2000, 500);
        check(3000, 1000);
        check(4000, 2000);
        check(5000, 3000);
        check(7000, 5000);
        check(0, 0);
    }

    proptest::proptest! {
        #[test]
        fn monotonic(mut stamps in proptest::collection::vec(0u64..1_000_000, 2..50)) {
            let mut c = cal(&[(1000, 10), (200_000, 90_000), (400_000, 300_000), (900_000, 500_000)]);
            stamps.sort();
            let ns: Vec<u64> = stamps.iter().map(|s| c.to_ns(*s)).collect();
            proptest::prop_assert!(ns.windows(2).all(|w| w[0] <= w[1]), "{:?} -> {:?}", stamps, ns);
        }
    }

    #[test]
    fn real_clock_tracks_monotonic_within_two_microseconds() {
        init();
        let mut c = Calibration::new(anchor());
        std::thread::sleep(std::time::Duration::from_millis(3));
        c.refresh();
        // The best of a few tries, so that a preemption between the two reads cannot fail it.
        let diff = (0..5)
            .map(|_| {
                let (s, ns) = (stamp(), now_ns());
                c.to_ns(s).abs_diff(ns)
            })
            .min()
            .unwrap();
        assert!(diff < 2_000, "stamps are {diff} ns off CLOCK_MONOTONIC");
    }
}
