//! Collects kernel records, launches and phase markers from a trace, then computes the
//! [`UtilizationReport`]. Records may arrive in any order (CUPTI flushes its buffers late), so
//! everything is kept until [`UtilizationBuilder::finish`].

use std::collections::BTreeMap;

use hashbrown::HashMap;
use trace::marker::{self, MarkerKind, Phase};
use trace::{DeviceInfo, Event, Header, NameId, Record};

use super::classify::{classify, KernelClass};
use super::occupancy::{occupancy, BlockResources, SmLimits};
use super::report::{ScopeMetrics, Source, TimeShare, Timing, TopKernel, UtilizationReport};

/// Label of the time before the first phase marker.
pub const UNPHASED: &str = "unphased";

/// Facts used when the trace header lacks them (`--sm-count`, a GPU profile).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UtilOptions {
    /// SM count to use when the header has none.
    pub sm_count: Option<u32>,
    /// Compute capability to use when the header has none.
    pub compute_capability: Option<(u32, u32)>,
    /// How many kernel names `top_kernels` lists.
    pub top: usize,
}

impl Default for UtilOptions {
    fn default() -> Self {
        UtilOptions { sm_count: None, compute_capability: None, top: 10 }
    }
}

#[derive(Debug, Clone, Copy)]
struct Kernel {
    start: u64,
    end: u64,
    name: Option<NameId>,
    blocks: u64,
    threads: u64,
    registers: u16,
    shared_mem: u64,
    device: u32,
}

/// Accumulates a trace's kernel activity; sans-IO.
#[derive(Debug, Clone)]
pub struct UtilizationBuilder {
    devices: Vec<DeviceInfo>,
    opts: UtilOptions,
    names: HashMap<NameId, String>,
    kernels: Vec<Kernel>,
    launches: Vec<(Option<u64>, u32)>,
    markers: Vec<(u64, Phase)>,
    markers_without_time: u64,
}

impl UtilizationBuilder {
    /// A builder for a trace with this header.
    pub fn new(header: &Header, opts: UtilOptions) -> Self {
        UtilizationBuilder {
            devices: header.devices.clone(),
            opts,
            names: HashMap::new(),
            kernels: Vec::new(),
            launches: Vec::new(),
            markers: Vec::new(),
            markers_without_time: 0,
        }
    }

    /// Account one record.
    pub fn observe(&mut self, rec: &Record) {
        let device = rec.device.unwrap_or(0);
        match &rec.event {
            Event::KernelExec(k) => self.kernels.push(Kernel {
                start: k.start_ns,
                end: k.end_ns,
                name: k.name,
                blocks: dims(k.grid),
                threads: dims(k.block),
                registers: k.registers_per_thread,
                shared_mem: u64::from(k.static_shared_mem) + u64::from(k.dynamic_shared_mem),
                device,
            }),
            Event::KernelLaunch(l) if l.result == 0 => self.launches.push((rec.ts_ns, device)),
            Event::Name(n) => {
                self.names.insert(n.id, n.text.clone());
            }
            Event::Marker(m) => {
                if let MarkerKind::Phase(p) = marker::parse(&m.text) {
                    match rec.ts_ns {
                        Some(ts) => self.markers.push((ts, p)),
                        None => self.markers_without_time += 1,
                    }
                }
            }
            _ => {}
        }
    }

    /// Compute the report.
    pub fn finish(mut self) -> UtilizationReport {
        let mut notes = Vec::new();
        let mut invalid = 0;
        self.kernels.retain(|k| {
            let ok = k.end >= k.start;
            invalid += u64::from(!ok);
            ok
        });
        let timing = if !self.kernels.is_empty() {
            Timing::Cupti
        } else if !self.launches.is_empty() {
            Timing::LaunchesOnly
        } else {
            Timing::None
        };
        let per_device: BTreeMap<u32, u64> = match timing {
            Timing::Cupti => count_by(self.kernels.iter().map(|k| k.device)),
            _ => count_by(self.launches.iter().map(|l| l.1)),
        };
        // Most records, lowest index on ties: one process usually drives one GPU.
        let device = per_device.iter().max_by_key(|(d, n)| (**n, std::cmp::Reverse(**d))).map(|(d, _)| *d);
        let other_devices: BTreeMap<u32, u64> =
            per_device.iter().filter(|(d, _)| Some(**d) != device).map(|(d, n)| (*d, *n)).collect();
        let info = device.and_then(|d| self.devices.iter().find(|i| i.index == d));
        let (sm_count, sm_count_source) = pick(info.and_then(|i| i.sm_count), self.opts.sm_count);
        let (cc, cc_source) = pick(info.and_then(|i| i.compute_capability), self.opts.compute_capability);
        let limits = cc.and_then(SmLimits::for_cc);

        match timing {
            Timing::Cupti => {
                if sm_count.is_none() {
                    notes.push(
                        "sm_activity needs the SM count: the header has none; pass --sm-count N or --profile NAME"
                            .to_string(),
                    );
                }
                match (cc, limits) {
                    (None, _) => notes.push(
                        "occupancy needs the compute capability: the header has none; pass --profile NAME".to_string(),
                    ),
                    (Some((a, b)), None) => notes.push(format!(
                        "occupancy: compute capability {a}.{b} is not in the occupancy table (7.0, 7.5, 8.0, 8.6, \
                         8.9, 9.0, 10.0, 12.0)"
                    )),
                    _ => {}
                }
            }
            Timing::LaunchesOnly => notes.push(
                "kernel timing needs CUPTI records: record with MEMTRACE_CUPTI=1 for busy fraction, SM activity, \
                 occupancy and gaps"
                    .to_string(),
            ),
            Timing::None => {}
        }

        self.markers.sort_unstable();
        let mut kernels: Vec<Kernel> = self.kernels.iter().filter(|k| Some(k.device) == device).copied().collect();
        kernels.sort_unstable_by_key(|k| (k.start, k.end));
        let launches: Vec<Option<u64>> = self.launches.iter().filter(|l| Some(l.1) == device).map(|l| l.0).collect();

        let window = match timing {
            Timing::Cupti => kernels.iter().map(|k| k.start).min().zip(kernels.iter().map(|k| k.end).max()),
            _ => launches.iter().flatten().min().copied().zip(launches.iter().flatten().max().copied()),
        };
        let phases = Phases { markers: &self.markers };
        let mut acc: BTreeMap<Option<Phase>, Acc> = BTreeMap::new();
        if let Some((s, e)) = window {
            for (label, wall) in phases.walls(s, e) {
                acc.entry(label).or_default().wall_ns += wall;
            }
        }
        let mut run = Acc::default();
        if let Some((s, e)) = window {
            run.wall_ns = e - s;
        }

        let per_kernel: Vec<Derived> =
            kernels.iter().map(|k| derive(k, sm_count, limits, self.names.get(&k.name.unwrap_or(u32::MAX)))).collect();
        if timing == Timing::Cupti {
            sweep(&kernels, &per_kernel, &phases, &mut acc, &mut run);
        }
        let mut latest_end: Option<u64> = None;
        for (k, d) in kernels.iter().zip(&per_kernel) {
            let label = phases.at(k.start);
            let gap = latest_end.map(|e| k.start.saturating_sub(e));
            latest_end = Some(latest_end.map_or(k.end, |e| e.max(k.end)));
            for a in [acc.entry(label).or_default(), &mut run] {
                a.add_kernel(k, d, gap);
            }
        }
        for ts in &launches {
            run.launches += 1;
            if let Some(ts) = ts {
                acc.entry(phases.at(*ts)).or_default().launches += 1;
            }
        }

        let has_launch_records = !launches.is_empty();
        let ctx = Ctx {
            timing,
            has_sm: sm_count.is_some(),
            has_occ: limits.is_some(),
            has_launch_records,
            top: self.opts.top,
        };
        UtilizationReport {
            timing,
            notes,
            device,
            sm_count,
            sm_count_source,
            compute_capability: cc,
            compute_capability_source: cc_source,
            other_devices,
            invalid_kernel_records: invalid,
            markers_without_time: self.markers_without_time,
            run: run.metrics(&ctx),
            phases: acc
                .into_iter()
                .map(|(label, a)| (label.map_or(UNPHASED, Phase::as_str).to_string(), a.metrics(&ctx)))
                .collect(),
        }
    }
}

/// Product of grid or block dimensions; saturating, since a corrupt record must not panic.
fn dims(d: [u32; 3]) -> u64 {
    d.iter().fold(1u64, |acc, &x| acc.saturating_mul(u64::from(x)))
}

fn count_by(it: impl Iterator<Item = u32>) -> BTreeMap<u32, u64> {
    let mut m = BTreeMap::new();
    for d in it {
        *m.entry(d).or_default() += 1;
    }
    m
}

fn pick<T>(header: Option<T>, fallback: Option<T>) -> (Option<T>, Option<Source>) {
    match (header, fallback) {
        (Some(v), _) => (Some(v), Some(Source::Header)),
        (None, Some(v)) => (Some(v), Some(Source::Fallback)),
        (None, None) => (None, None),
    }
}

/// Phase segments: a phase starts at its marker and lasts until the next phase marker.
struct Phases<'a> {
    markers: &'a [(u64, Phase)],
}

impl Phases<'_> {
    /// The phase in force at `t` (`None` before the first marker).
    fn at(&self, t: u64) -> Option<Phase> {
        let i = self.markers.partition_point(|m| m.0 <= t);
        i.checked_sub(1).map(|i| self.markers[i].1)
    }

    /// Wall time of each phase inside the window `[s, e]`.
    fn walls(&self, s: u64, e: u64) -> Vec<(Option<Phase>, u64)> {
        let mut out = Vec::new();
        let mut cur = s;
        let mut label = self.at(s);
        for &(t, p) in self.markers.iter().filter(|m| m.0 > s && m.0 < e) {
            out.push((label, t - cur));
            cur = t;
            label = Some(p);
        }
        out.push((label, e - cur));
        out
    }

    /// Marker times strictly inside `(s, e)`: interval boundaries for the sweep.
    fn boundaries(&self, s: u64, e: u64) -> impl Iterator<Item = u64> + '_ {
        self.markers.iter().map(|m| m.0).filter(move |&t| t > s && t < e)
    }
}

/// Per-kernel facts derived once.
struct Derived {
    name: String,
    class: KernelClass,
    /// `min(1, blocks / SMs)`.
    sm_share: Option<f64>,
    /// Theoretical occupancy, when computable.
    occ: Option<f64>,
    /// Occupancy scaled by the share of SMs the grid fills.
    occ_grid: Option<f64>,
}

fn derive(k: &Kernel, sm_count: Option<u32>, limits: Option<&SmLimits>, name: Option<&String>) -> Derived {
    let name = name.cloned().unwrap_or_else(|| "<unnamed>".to_string());
    let class = classify(&name);
    let sm_share = sm_count.filter(|&n| n > 0).map(|n| (k.blocks as f64 / f64::from(n)).min(1.0));
    let occ = limits.and_then(|l| {
        let res = BlockResources {
            threads: u32::try_from(k.threads).ok()?,
            registers_per_thread: u32::from(k.registers),
            shared_mem: u32::try_from(k.shared_mem).ok()?,
        };
        occupancy(l, res).ok()
    });
    let occ_grid = occ.zip(sm_count.filter(|&n| n > 0)).map(|(o, n)| {
        let resident = f64::from(n) * f64::from(o.active_blocks_per_sm);
        o.fraction() * (k.blocks as f64 / resident).min(1.0)
    });
    Derived { name, class, sm_share, occ: occ.map(|o| o.fraction()), occ_grid }
}

/// Running sums for one scope.
#[derive(Debug, Default)]
struct Acc {
    wall_ns: u64,
    busy_ns: u64,
    sm_ns: f64,
    occ_ns: f64,
    occ_grid_ns: f64,
    kernels: u64,
    kernel_time_ns: u64,
    launches: u64,
    gap_sum: u128,
    gaps: u64,
    occ_unknown: u64,
    occ_known: u64,
    by_name: HashMap<String, (KernelClass, u64, u64)>,
    by_class: BTreeMap<KernelClass, u64>,
}

impl Acc {
    fn add_kernel(&mut self, k: &Kernel, d: &Derived, gap: Option<u64>) {
        let dur = k.end - k.start;
        self.kernels += 1;
        self.kernel_time_ns = self.kernel_time_ns.saturating_add(dur);
        if let Some(g) = gap {
            self.gap_sum += u128::from(g);
            self.gaps += 1;
        }
        if d.occ.is_none() {
            self.occ_unknown += 1;
        } else {
            self.occ_known += 1;
        }
        let e = self.by_name.entry(d.name.clone()).or_insert((d.class, 0, 0));
        e.1 += 1;
        e.2 = e.2.saturating_add(dur);
        let c = self.by_class.entry(d.class).or_default();
        *c = c.saturating_add(dur);
    }

    fn metrics(self, ctx: &Ctx) -> ScopeMetrics {
        let wall = self.wall_ns as f64;
        let cupti = ctx.timing == Timing::Cupti;
        let frac = |x: f64| (cupti && self.wall_ns > 0).then(|| x / wall);
        // A scope whose kernels all lack an occupancy would read 0%, which is a claim, not a gap.
        let occ_meaningful = ctx.has_occ && !(self.kernels > 0 && self.occ_known == 0);
        let rate_count = if ctx.has_launch_records { self.launches } else { self.kernels };
        let mut top: Vec<TopKernel> = self
            .by_name
            .into_iter()
            .map(|(name, (class, count, total))| TopKernel {
                name,
                class,
                count,
                total_ns: total,
                mean_ns: total as f64 / count as f64,
                share: if self.kernel_time_ns > 0 { total as f64 / self.kernel_time_ns as f64 } else { 0.0 },
            })
            .collect();
        top.sort_by(|a, b| b.total_ns.cmp(&a.total_ns).then_with(|| a.name.cmp(&b.name)));
        top.truncate(ctx.top);
        let share = |c| *self.by_class.get(&c).unwrap_or(&0) as f64 / self.kernel_time_ns as f64;
        ScopeMetrics {
            wall_ns: self.wall_ns,
            busy_ns: cupti.then_some(self.busy_ns),
            busy_fraction: frac(self.busy_ns as f64),
            sm_activity: frac(self.sm_ns).filter(|_| ctx.has_sm),
            occupancy: frac(self.occ_ns).filter(|_| occ_meaningful),
            occupancy_grid_limited: frac(self.occ_grid_ns).filter(|_| occ_meaningful && ctx.has_sm),
            kernels: self.kernels,
            kernel_time_ns: self.kernel_time_ns,
            launches: self.launches,
            launch_rate_per_s: (self.wall_ns > 0).then(|| rate_count as f64 / (wall / 1e9)),
            mean_gap_ns: (cupti && self.gaps > 0).then(|| self.gap_sum as f64 / self.gaps as f64),
            occupancy_unknown_kernels: if cupti && ctx.has_occ { self.occ_unknown } else { 0 },
            top_kernels: top,
            time_share: (self.kernel_time_ns > 0).then(|| TimeShare {
                gemm_conv: share(KernelClass::GemmConv),
                elementwise: share(KernelClass::Elementwise),
                reduction: share(KernelClass::Reduction),
                other: share(KernelClass::Other),
            }),
        }
    }
}

struct Ctx {
    timing: Timing,
    has_sm: bool,
    has_occ: bool,
    has_launch_records: bool,
    top: usize,
}

/// One sweep over kernel starts, ends and phase boundaries: between consecutive event times the
/// set of running kernels is constant, so busy time, SM activity and occupancy are exact sums of
/// `dt × min(1, Σ running)`.
fn sweep(
    kernels: &[Kernel],
    derived: &[Derived],
    phases: &Phases,
    acc: &mut BTreeMap<Option<Phase>, Acc>,
    run: &mut Acc,
) {
    // (time, order, kernel index): at equal times starts come first, so a zero-length kernel
    // never ends before it starts; boundaries (order 1) carry no kernel.
    const START: u8 = 0;
    const BOUNDARY: u8 = 1;
    const END: u8 = 2;
    let mut events: Vec<(u64, u8, usize)> = Vec::with_capacity(kernels.len() * 2);
    for (i, k) in kernels.iter().enumerate() {
        events.push((k.start, START, i));
        events.push((k.end, END, i));
    }
    if let (Some(s), Some(e)) = (kernels.first().map(|k| k.start), kernels.iter().map(|k| k.end).max()) {
        events.extend(phases.boundaries(s, e).map(|t| (t, BOUNDARY, 0)));
    }
    events.sort_unstable();
    let mut active = 0usize;
    let (mut sm, mut occ, mut occ_grid) = (0.0f64, 0.0f64, 0.0f64);
    let mut prev = events.first().map_or(0, |e| e.0);
    for &(t, order, idx) in &events {
        if t > prev && active > 0 {
            let dt = (t - prev) as f64;
            let a = acc.entry(phases.at(prev)).or_default();
            for a in [a, &mut *run] {
                a.busy_ns += t - prev;
                a.sm_ns += sm.min(1.0) * dt;
                a.occ_ns += occ.min(1.0) * dt;
                a.occ_grid_ns += occ_grid.min(1.0) * dt;
            }
        }
        prev = t;
        if order == BOUNDARY {
            continue;
        }
        let is_start = order == START;
        let d = &derived[idx];
        let sign = if is_start { 1.0 } else { -1.0 };
        if is_start {
            active += 1;
        } else {
            active -= 1;
        }
        sm += sign * d.sm_share.unwrap_or(0.0);
        occ += sign * d.occ.unwrap_or(0.0);
        occ_grid += sign * d.occ_grid.unwrap_or(0.0);
        if active == 0 {
            // Drop accumulated rounding so idle stretches start from exactly zero.
            (sm, occ, occ_grid) = (0.0, 0.0, 0.0);
        }
    }
}
