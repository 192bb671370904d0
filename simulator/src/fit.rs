//! The one accounting of memory outside the caching allocator, and the one fit check built on it.
//!
//! A device's capacity always means its *total* memory, as `nvidia-smi` shows it. Inside, the
//! memory a process holds outside PyTorch's caching allocator (the CUDA context, cuBLAS/cuBLASLt
//! and cuDNN handles and kernel images; NCCL will join them) is subtracted to give the
//! allocator's budget, and a trace is replayed at that budget. Every command that gives a verdict
//! (`memsim replay`, `memsim colocate`, `memest estimate`, and the trainer's `max-batch` through
//! `memsim replay`) comes through [`outside`] and [`FitReplay`], so they cannot disagree.

use serde::{Deserialize, Serialize};
use trace::{metadata, Header, Record};

use crate::profile::{OutsideAllocator, Profile};
use crate::replay::{Classifier, FirstOom, ReplayOptions, ReplayReport, ReplaySetupError, Replayer, Step};
use crate::units::Unbounded;

// The margin is its own concept; every fit command takes it from here too.
pub use crate::margin::{margin, Margin};

const MIB: f64 = 1024.0 * 1024.0;

/// The CUDA libraries a job loads, which decide the library terms of [`Outside`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Libraries {
    /// Any GEMM runs: cuBLAS (and cuBLASLt) are loaded.
    pub gemm: bool,
    /// Any convolution runs: cuDNN is loaded.
    pub conv: bool,
    /// Where this came from: `"trace"` (the trace header's `uses_gemm`/`uses_conv`), a caller's
    /// fallback such as `"features"`, or `"unknown"` (only the context is counted).
    pub source: &'static str,
    /// Ranks of the job (the trace header's `world_size`): above 1, the process holds an NCCL
    /// communicator whose buffers live outside the allocator.
    pub ranks: u32,
}

impl Libraries {
    /// Nothing known: only the context is counted.
    pub const UNKNOWN: Libraries = Libraries { gemm: false, conv: false, source: "unknown", ranks: 1 };

    /// Libraries of a single-process job.
    pub fn single(gemm: bool, conv: bool, source: &'static str) -> Libraries {
        Libraries { gemm, conv, source, ranks: 1 }
    }

    /// From the trace header's `uses_gemm`/`uses_conv` metadata (written by the symbolic tracer);
    /// `None` when the trace does not say.
    pub fn from_header(h: &Header) -> Option<Libraries> {
        match (h.meta_flag(&metadata::USES_GEMM), h.meta_flag(&metadata::USES_CONV)) {
            (None, None) => None,
            (g, c) => Some(Libraries {
                gemm: g.unwrap_or(false),
                conv: c.unwrap_or(false),
                source: "trace",
                ranks: Libraries::ranks_of(h),
            }),
        }
    }

    /// The header's `world_size` (1 when absent or unreadable).
    pub fn ranks_of(h: &Header) -> u32 {
        h.meta_count(&metadata::WORLD_SIZE).and_then(|n| u32::try_from(n).ok()).unwrap_or(1)
    }

    /// The header's answer, key by key, else `fallback`'s (with the header's ranks): a header
    /// that says `uses_conv` but not `uses_gemm` (an older tracer, an edited or unreadable value)
    /// says nothing about cuBLAS, so that library comes from the evidence, not from "false".
    pub fn of(h: &Header, fallback: Libraries) -> Libraries {
        let ranks = Libraries::ranks_of(h);
        match (h.meta_flag(&metadata::USES_GEMM), h.meta_flag(&metadata::USES_CONV)) {
            (Some(gemm), Some(conv)) => Libraries { gemm, conv, source: "trace", ranks },
            (None, None) => Libraries { ranks, ..fallback },
            (g, c) => Libraries {
                gemm: g.unwrap_or(fallback.gemm),
                conv: c.unwrap_or(fallback.conv),
                source: partly_from_trace(fallback.source),
                ranks,
            },
        }
    }

    /// NCCL peers of one rank: a ring (and tree) connects each rank to at most two others.
    pub fn nccl_peers(&self) -> u32 {
        (self.ranks.saturating_sub(1)).min(2)
    }
}

/// The source of libraries the header gave one of, the other from `fallback` (a `&'static str`
/// keeps [`Libraries`] `Copy` for memsim's callers).
fn partly_from_trace(fallback: &'static str) -> &'static str {
    match fallback {
        "features" => "trace and features",
        "features and family" => "trace, features and family",
        "trace workspaces" => "trace and its workspaces",
        "trace workspaces and family" => "trace, its workspaces and family",
        "family" => "trace and family",
        _ => "trace in part",
    }
}

/// Memory one process holds outside the caching allocator, by term, bytes.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Outside {
    /// CUDA context and runtime.
    pub context_bytes: u64,
    /// cuBLAS/cuBLASLt handles and kernel images (when any GEMM runs).
    pub cublas_bytes: u64,
    /// cuDNN handle and kernel images (when any convolution runs).
    pub cudnn_bytes: u64,
    /// NCCL's communicator and its per-peer buffers (when the job has more than one rank).
    pub nccl_bytes: u64,
    /// The sum.
    pub total_bytes: u64,
    /// The libraries the terms were chosen for.
    pub libraries: Libraries,
    /// Profile constants used here that the profile marks unmeasured (`[provenance]`).
    pub unmeasured: Vec<String>,
    /// Where the terms came from: the profile's path, `"--context"`, or `"none"`.
    pub source: String,
}

impl Outside {
    /// Nothing outside the allocator (no profile): the verdict is at the allocator level.
    pub fn none() -> Outside {
        Outside {
            context_bytes: 0,
            cublas_bytes: 0,
            cudnn_bytes: 0,
            nccl_bytes: 0,
            total_bytes: 0,
            libraries: Libraries::UNKNOWN,
            unmeasured: Vec::new(),
            source: "none".into(),
        }
    }

    /// A fixed amount given by the user (`--context`), all of it counted as context.
    pub fn fixed(bytes: u64) -> Outside {
        Outside { context_bytes: bytes, total_bytes: bytes, source: "--context".into(), ..Outside::none() }
    }

    /// What the allocator may use on a device of `capacity` total bytes.
    pub fn budget(&self, capacity: u64) -> u64 {
        capacity.saturating_sub(self.total_bytes)
    }

    /// One warning line per unmeasured constant used, for the binaries to print.
    pub fn warnings(&self) -> Vec<String> {
        self.unmeasured
            .iter()
            .map(|k| {
                format!("{}: {k} is marked unmeasured ([provenance]); the estimate rests on a placeholder", self.source)
            })
            .collect()
    }
}

fn bytes(mib: f64) -> u64 {
    (mib * MIB).round() as u64
}

/// The `[outside_allocator]` terms a job loading `libs` pays, as (profile key, MiB, how many
/// times): the one rule of which terms apply, which [`outside`] turns into bytes and calibration
/// fits ([`outside_mib`]).
fn terms(o: &OutsideAllocator, libs: Libraries) -> [(&'static str, f64, u64); 5] {
    let sharded = libs.ranks > 1;
    [
        ("context_mib", o.context_mib, 1),
        ("cublas_mib", o.cublas_mib, u64::from(libs.gemm)),
        ("cudnn_mib", o.cudnn_mib, u64::from(libs.conv)),
        ("nccl_communicator_mib", o.nccl_communicator_mib, u64::from(sharded)),
        ("nccl_per_peer_mib", o.nccl_per_peer_mib, if sharded { u64::from(libs.nccl_peers()) } else { 0 }),
    ]
}

/// The memory outside the allocator for a job loading `libs` under the terms `o`, MiB: what
/// calibration fits the terms to.
pub fn outside_mib(o: &OutsideAllocator, libs: Libraries) -> f64 {
    terms(o, libs).iter().map(|&(_, mib, times)| mib * times as f64).sum()
}

/// The memory outside the allocator for a job loading `libs`, from `profile` (the one function
/// that applies the profile's `[outside_allocator]` terms).
pub fn outside(profile: &Profile, source: &str, libs: Libraries) -> Outside {
    let mut unmeasured = Vec::new();
    let [context_bytes, cublas_bytes, cudnn_bytes, communicator, per_peer] = terms(&profile.outside_allocator, libs)
        .map(|(key, mib, times)| {
            if times == 0 {
                return 0;
            }
            let full = format!("outside_allocator.{key}");
            if profile.is_unmeasured(&full) {
                unmeasured.push(full);
            }
            times * bytes(mib)
        });
    let nccl_bytes = communicator + per_peer;
    Outside {
        context_bytes,
        cublas_bytes,
        cudnn_bytes,
        nccl_bytes,
        total_bytes: context_bytes + cublas_bytes + cudnn_bytes + nccl_bytes,
        libraries: libs,
        unmeasured,
        source: source.to_string(),
    }
}

/// A warning when a trace holds device memory outside the allocator while the profile's library
/// terms apply too: a library's own allocations (NCCL's buffers, cuBLAS's handles) may then be
/// counted twice. Only symbolic traces carry the metadata that turns the terms on, and they
/// record no library's allocations, so this should not happen; said, and erring high, if it does.
pub fn held_beside_terms(report: &ReplayReport, outside: &Outside) -> Option<String> {
    let terms = outside.cublas_bytes + outside.cudnn_bytes + outside.nccl_bytes;
    (report.recorded_outside_bytes > 0 && terms > 0).then(|| {
        format!(
            "the trace holds {} B outside the allocator and the profile's library terms ({} B of cuBLAS, cuDNN \
             and NCCL) are counted too: a library's own allocations may be counted twice (the need errs high)",
            report.recorded_outside_bytes, terms
        )
    })
}

/// Where a device capacity came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CapacitySource {
    /// `--capacity`.
    Flag,
    /// The profile's `gpu.total_memory`.
    Profile,
}

impl CapacitySource {
    /// Where the capacity came from, in the words every verdict line uses (the Python side's
    /// `capacity_source_text` says the same).
    pub fn describe(self) -> &'static str {
        match self {
            CapacitySource::Flag => "--capacity",
            CapacitySource::Profile => "the profile's total memory",
        }
    }
}

/// A device capacity: total memory, bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Capacity {
    /// Total device memory, bytes.
    pub bytes: u64,
    /// Where it came from.
    pub source: CapacitySource,
}

/// `--capacity` if given, else the profile's total memory, else none. A profile whose total
/// memory is unmeasured adds a warning, and so does a capacity above the profile's GPU's total
/// (a typo of a unit, or another GPU than the profile describes).
pub fn capacity(flag: Option<u64>, profile: Option<&Profile>) -> (Option<Capacity>, Vec<String>) {
    match (flag, profile) {
        (Some(bytes), Some(p)) if bytes > p.gpu.total_memory => {
            let warn = format!(
                "--capacity {} is more than the profile's GPU ({}) has in all ({}): the verdict is for a device \
                 the profile does not describe (give the --profile of that GPU)",
                crate::units::mib(bytes),
                p.gpu.name,
                crate::units::mib(p.gpu.total_memory)
            );
            (Some(Capacity { bytes, source: CapacitySource::Flag }), vec![warn])
        }
        (Some(bytes), _) => (Some(Capacity { bytes, source: CapacitySource::Flag }), Vec::new()),
        (None, Some(p)) => {
            let warn = if p.is_unmeasured("gpu.total_memory") {
                vec![format!(
                    "the profile's ({}) gpu.total_memory is marked unmeasured ([provenance]); the capacity is nominal",
                    p.gpu.name
                )]
            } else {
                Vec::new()
            };
            (Some(Capacity { bytes: p.gpu.total_memory, source: CapacitySource::Profile }), warn)
        }
        (None, None) => (None, Vec::new()),
    }
}

/// A fit verdict: `fits` is exactly `need_bytes <= capacity_bytes`, so the verdict can never
/// contradict the numbers printed beside it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Verdict {
    /// Which number the verdict rests on (e.g. `symbolic.device`).
    pub basis: String,
    /// Device memory the job needs, bytes (reserved peak + outside the allocator); `null` in
    /// JSON when no device holds it (`need_unbounded` says why).
    #[serde(serialize_with = "crate::units::bytes_or_null")]
    pub need_bytes: u64,
    /// Why no device holds the need, when none does (`need_bytes` is then saturated, and `fits`
    /// false): `memory_fraction` or `overflow` (memest's `verdict.need_unbounded`).
    pub need_unbounded: Option<Unbounded>,
    /// The device's total memory, bytes.
    pub capacity_bytes: u64,
    /// Where the capacity came from.
    pub capacity_source: CapacitySource,
    /// `need_bytes <= capacity_bytes`.
    pub fits: bool,
}

/// The verdict in a word: `FITS` or `DOES NOT FIT`, the one wording of every command and view.
pub fn verdict_word(fits: bool) -> &'static str {
    if fits {
        "FITS"
    } else {
        "DOES NOT FIT"
    }
}

impl Verdict {
    /// The verdict for `need` on `cap` (a saturated need is said to be an overflow; a need
    /// under a memory fraction says so with [`Verdict::under_fraction`]).
    pub fn new(basis: impl Into<String>, need: u64, cap: Capacity) -> Verdict {
        Verdict {
            basis: basis.into(),
            need_bytes: need,
            need_unbounded: Unbounded::of(need, 0),
            capacity_bytes: cap.bytes,
            capacity_source: cap.source,
            fits: need <= cap.bytes,
        }
    }

    /// This verdict, for a job whose memory fraction asks for a device of `fraction_need`
    /// bytes ([`crate::replay::ReplayReport::fraction_need_bytes`]): why a saturated need is one.
    pub fn under_fraction(mut self, fraction_need: u64) -> Verdict {
        self.need_unbounded = Unbounded::of(self.need_bytes, fraction_need);
        self
    }
}

/// A replay that answers the fit question in one pass: an unlimited replay gives what the job
/// needs; when a budget is set, a second replay at that budget runs alongside, because a real
/// allocator that hits the ceiling frees its cache and retries, and a job that survives reaches
/// the capped replay's peak, not the unlimited one.
///
/// The unlimited replay knows no device: a memory fraction the program sets limits nothing there
/// (it is of the device's total, which only the replay at the budget has), so every request is
/// placed, and the need is at least what the run's reservations take the reserved bytes to over
/// the fraction in force at each (`fraction_need_bytes`; PyTorch checks the fraction only when it
/// reserves, so a request served from the cache asks nothing of it): the device total whose share
/// holds the run as replayed without a limit. On a device of at least that total the fraction
/// never refuses a reservation, so the replay at the budget fails only where the need passes the
/// capacity, and the verdict says so; where it survives, the fraction allowed every reservation
/// it made, so its own fraction need is within the capacity too.
pub struct FitReplay {
    unlimited: Replayer,
    capped: Option<Replayer>,
}

/// What [`FitReplay`] found.
#[derive(Debug, Clone)]
pub struct FitOutcome {
    /// The replay that describes the run: the capped one when it survived, else the unlimited
    /// one (what the job would have needed).
    pub report: ReplayReport,
    /// Whether an allocation failed, and the first failure: in the capped replay, or in the
    /// replay the report is of (without a budget, a request past [`crate::alloc::MAX_SEGMENT`],
    /// which no device holds). Its `oom_need_bytes` is the capped replay's, or the unlimited
    /// one's when even that failed.
    pub first_oom: FirstOom,
    /// The allocator budget, bytes, when one was set.
    pub budget: Option<u64>,
    /// Whether `report` (its peaks and `memory_stats`) is of the replay at the budget; false
    /// without a budget, and when the replay at the budget failed (the report is then the
    /// replay without one: what the run needs, and `oom` is the replay at the budget's).
    pub peaks_at_budget: bool,
}

impl FitReplay {
    /// Prepare a replay of a trace with this header; `budget` is the allocator's share of the
    /// device ([`Outside::budget`]), `None` for no fit check. `opts.capacity` is ignored, and
    /// `opts.device_total` (the base of a memory fraction) is the replay at the budget's only.
    pub fn new(header: &Header, opts: &ReplayOptions, budget: Option<u64>) -> Result<FitReplay, ReplaySetupError> {
        // Without a device a fraction limits nothing: the need counts every request.
        let unlimited = Replayer::new(header, ReplayOptions { capacity: None, device_total: None, ..opts.clone() })?;
        let capped = match budget {
            Some(b) => Some(Replayer::new(header, ReplayOptions { capacity: Some(b), ..opts.clone() })?),
            None => None,
        };
        Ok(FitReplay { unlimited, capped })
    }

    /// Feed one record.
    pub fn observe(&mut self, r: &Record) {
        self.unlimited.observe(r);
        if let Some(c) = &mut self.capped {
            c.observe(r);
        }
    }

    /// The classifier for [`FitReplay::observe_steps`] (both replays read the same header, so
    /// they sort records alike).
    pub fn classifier(&self) -> Option<Classifier> {
        self.unlimited.classifier()
    }

    /// Feed a run of records as their [`Step`]s (see [`Replayer::observe_step`]), as feeding
    /// each to both replays in turn would. The two replays share nothing, so each takes the whole
    /// run in turn: one loop per replay with its state at hand, not a call per step.
    pub fn observe_steps(&mut self, steps: &[Step]) {
        for s in steps {
            self.unlimited.observe_step(s);
        }
        if let Some(c) = &mut self.capped {
            for s in steps {
                c.observe_step(s);
            }
        }
    }

    /// The outcome.
    pub fn finish(self) -> FitOutcome {
        let unlimited = self.unlimited.finish();
        match self.capped {
            None => FitOutcome::of(unlimited, None),
            Some(c) => {
                let capped = c.finish();
                let budget = capped.capacity;
                if capped.first_oom.oom {
                    FitOutcome {
                        first_oom: capped.first_oom.with_floors_of(&unlimited.first_oom),
                        report: unlimited,
                        budget,
                        peaks_at_budget: false,
                    }
                } else {
                    FitOutcome::of(capped, budget)
                }
            }
        }
    }
}

impl FitOutcome {
    /// A replay that did not run out of memory at its budget (or had none): its own report,
    /// whose failure, if any, no capacity would have avoided.
    fn of(report: ReplayReport, budget: Option<u64>) -> FitOutcome {
        let first_oom = report.first_oom.clone();
        FitOutcome { report, first_oom, budget, peaks_at_budget: budget.is_some() }
    }

    /// Reserved bytes the job needs: the replay's peak, or more when an allocation failed (in the
    /// replay, or in the run itself, as recorded), since the peak never counts the request that
    /// could not be placed.
    pub fn reserved_need(&self) -> u64 {
        let recorded = self.report.recorded_oom.map_or(0, |o| o.need_bytes);
        self.report.peaks.peak_reserved_bytes.max(self.first_oom.oom_need_bytes.unwrap_or(0)).max(recorded)
    }

    /// Whether [`FitOutcome::reserved_need`] is a failed allocation's floor (the replay's, or
    /// one the run recorded), above the peak.
    pub fn need_is_oom_floor(&self) -> bool {
        self.reserved_need() > self.report.peaks.peak_reserved_bytes
    }

    /// Device memory needed: the reserved need plus what lives outside the allocator (the
    /// profile's terms, and what the trace itself held there).
    /// At least the device total the program's own memory fraction asks for.
    pub fn device_peak(&self, outside: &Outside) -> u64 {
        self.reserved_need().saturating_add(self.beside(outside)).max(self.report.fraction_need_bytes)
    }

    /// Memory outside the allocator: the profile's terms plus what the trace itself held there
    /// ([`FitOutcome::held_beside`]).
    pub fn beside(&self, outside: &Outside) -> u64 {
        outside.total_bytes.saturating_add(self.held_beside())
    }

    /// What the trace itself held outside the allocator on top of the reserved need: what it
    /// adds at the device's busiest moment (the most of reserved + held at once, less the
    /// reserved peak); when the need is a failed allocation's floor, the most it held at any one
    /// time (the failure's moment is not the peak's; errs high).
    pub fn held_beside(&self) -> u64 {
        let r = &self.report;
        if self.need_is_oom_floor() {
            r.recorded_outside_bytes
        } else {
            r.outside_beside_peak_bytes
        }
    }

    /// The device peak plus the safety margin.
    pub fn device_safe(&self, outside: &Outside, margin: &Margin) -> u64 {
        margin.safe(self.device_peak(outside), self.reserved_need())
    }
}

/// Replay records already in memory (see [`FitReplay`]). The replay at the budget runs only when
/// the unlimited one exceeds it, or when the allocator's settings depend on the capacity (garbage
/// collection, a memory fraction, in the settings or set by the program): otherwise, below the
/// budget, the two are the same run.
pub fn fit_records<'a>(
    header: &Header,
    records: impl IntoIterator<Item = &'a Record> + Clone,
    opts: &ReplayOptions,
    budget: Option<u64>,
) -> Result<FitOutcome, ReplaySetupError> {
    let replay = |budget: Option<u64>| -> Result<FitOutcome, ReplaySetupError> {
        let mut f = FitReplay::new(header, opts, budget)?;
        records.clone().into_iter().for_each(|r| f.observe(r));
        Ok(f.finish())
    };
    let Some(b) = budget else { return replay(None) };
    if Replayer::new(header, opts.clone())?.capacity_sensitive() {
        return replay(Some(b));
    }
    let mut out = replay(None)?;
    // A fraction the program set is of the device's total, which the unlimited replay leaves out.
    let fraction_set = out.report.fraction_need_bytes > 0;
    if fraction_set || out.reserved_need().saturating_add(out.held_beside()) > b {
        return replay(Some(b));
    }
    out.budget = Some(b);
    out.report.capacity = Some(b);
    // Below the budget the two replays are one run.
    out.peaks_at_budget = true;
    Ok(out)
}

/// A warning when a real run's trace was recorded on another GPU architecture than the profile
/// judging it (or, where the trace gives no compute capability, another GPU name): the
/// workspaces and kernels its libraries chose are in the trace, and are that GPU's.
fn recorded_elsewhere(header: &Header, profile: &Profile) -> Option<String> {
    let d = header.devices.iter().find(|d| d.name.is_some() || d.compute_capability.is_some())?;
    let other = match d.compute_capability {
        Some((major, minor)) => [major, minor] != profile.gpu.compute_capability,
        None => d.name.as_deref() != Some(profile.gpu.name.as_str()),
    };
    other.then(|| {
        let name = d.name.as_deref().unwrap_or("another GPU");
        let cc = d.compute_capability.map_or(String::new(), |(a, b)| format!(", compute capability {a}.{b}"));
        format!(
            "the trace was recorded on {name}{cc}, not the profile's {}: the workspaces and kernels its libraries \
             chose there are in it, judged with this profile's capacity and memory outside the allocator",
            profile.gpu.name
        )
    })
}

/// A warning when the job autotunes its convolutions (`torch.backends.cudnn.benchmark`, said by
/// the trace header): PyTorch then sizes each new shape's search workspace to the largest block
/// it could take at that moment (`getMaxWorkspaceSize`: free device memory or the largest cached
/// block), which no trace or profile knows. Alone, the cached workspace is given back when the job
/// needs the memory; beside another job, the memory it took is not.
pub fn autotuning(header: &Header) -> Option<String> {
    (header.meta_flag(&metadata::CUDNN_BENCHMARK) == Some(true)).then(|| {
        "the job turns on torch.backends.cudnn.benchmark: cuDNN's autotuning sizes a workspace to the memory free \
         at each new convolution shape, which is not in these numbers; alone it frees that cache when it needs the \
         memory, but its reserved memory may grow past the need and take what a job sharing its GPU needs \
         (benchmark off, the workspaces are the estimate's)"
            .to_string()
    })
}

/// A warning when a symbolic trace was emulated for another GPU profile than the one judging it
/// (one that emulates differently, where the traced one can be read): its library workspaces and
/// attention backends are the other GPU's, so the numbers are that GPU's with this one's capacity
/// and outside terms. `None` for a plain meta trace (nothing
/// emulated) and for traces that name no profile (a real run's).
pub fn profile_mismatch(header: &Header, profile: &Profile, profile_path: &std::path::Path) -> Option<String> {
    let Some(traced) = header.meta(&metadata::PROFILE) else { return recorded_elsewhere(header, profile) };
    if header.meta_flag(&metadata::CUDA_EMULATION) == Some(false) {
        return None;
    }
    let judging = Profile::name_of(profile_path);
    // A renamed copy of the traced profile emulates the same: the attention backends follow the
    // compute capability, the library workspaces the `[workspace]` table, the rules the
    // allocator version. When the traced profile can be read, those decide, not the names.
    let emulates_alike = |p: &Profile| {
        p.gpu.compute_capability == profile.gpu.compute_capability
            && p.workspace == profile.workspace
            && p.software.allocator == profile.software.allocator
    };
    let same = traced == judging || Profile::load(traced).is_ok_and(|(p, _)| emulates_alike(&p));
    (!same).then(|| {
        format!(
            "the trace was emulated for the {traced} profile, not {judging}: its library workspaces and \
             attention backends are that GPU's; trace it again with --profile {judging} to judge it on this one"
        )
    })
}
