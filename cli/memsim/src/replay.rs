//! `memsim replay FILE... [--capacity 40GiB] [--profile NAME] [--alloc-conf STR] [--torch VER] [--strict] [--json]`.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use simulator::alloc::TorchVersion;
use simulator::family::Family;
use simulator::fit::{self, Capacity, FitOutcome, FitReplay, Libraries, Margin, Outside, Verdict};
use simulator::profile::Profile;
use simulator::replay::{ReplayOptions, Steps};
use simulator::units::{bytes_json, mib, mib_and_bytes, parse_capacity, Unbounded};
use trace::metadata;

use crate::batch::{self, outln, Output};

/// Arguments of `memsim replay`.
#[derive(clap::Args)]
#[command(after_help = "Exit status: 0 fits (or no capacity to check), 1 does not fit the capacity, 2 bad input.\n\
Several files are replayed at once, one per core, and reported in the order given (with --json, \
a JSON array; a file that fails is an element {\"file\", \"error\"} and makes the status 2).\n\
Peaks are the caching allocator's (max_memory_reserved/allocated): they count what the trace \
requests, not the CUDA context or libraries; the device peak adds the profile's memory outside the \
allocator.")]
pub struct Args {
    /// Allocator-level traces: .mtrace, .jsonl (e.g. from `memtrace_trainer symtrace`), or
    /// snapshot .pickle files; `-` reads a trace from standard input. Several are replayed in parallel.
    #[arg(required = true, value_name = "FILE")]
    files: Vec<PathBuf>,
    /// Allocator configuration in PYTORCH_CUDA_ALLOC_CONF syntax; overrides what the trace recorded.
    #[arg(long, value_name = "STR")]
    alloc_conf: Option<String>,
    /// The GPU's total memory (e.g. 40GiB, 40960MiB), as nvidia-smi shows it. The profile's memory
    /// outside the allocator (context, cuBLAS, cuDNN) is subtracted inside. Default: the profile's
    /// total memory; no fit check without a profile or a capacity.
    #[arg(long, value_parser = parse_capacity, value_name = "SIZE", allow_negative_numbers = true)]
    capacity: Option<u64>,
    /// GPU profile: a name in profiles/ (e.g. a100-40gb) or a path to a .toml file.
    #[arg(long, value_name = "NAME")]
    profile: Option<String>,
    #[command(flatten)]
    judge: JudgeFlags,
}

/// The flags of the subcommands that judge a fit (`replay`, `colocate`).
#[derive(clap::Args)]
pub struct JudgeFlags {
    /// PyTorch version whose allocator rules apply (2.4, 2.5, 2.9 or later). Default: the
    /// profile's, else the newest.
    #[arg(long, value_name = "VER")]
    pub torch: Option<String>,
    #[arg(long, help = crate::input::STRICT_HELP)]
    pub strict: bool,
    /// Judge the fit on point estimates (peak reserved plus memory outside the allocator)
    /// instead of safe numbers (a safe number is the point plus the profile's calibrated margin
    /// for a symbolic trace's family; traces of real runs get none).
    #[arg(long)]
    pub point: bool,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// The profile (with its path) and the allocator version from flags.
pub fn load(profile: Option<&str>, torch: Option<&str>) -> Result<(Option<(Profile, PathBuf)>, TorchVersion)> {
    let profile = match profile {
        Some(p) => Some(Profile::load(p).with_context(|| format!("--profile {p}"))?),
        None => None,
    };
    let version: TorchVersion = match (torch, &profile) {
        (Some(t), _) => t.parse().with_context(|| format!("--torch {t}"))?,
        (None, Some((p, path))) => {
            p.software.allocator.parse().with_context(|| format!("{}: software.allocator", path.display()))?
        }
        (None, None) => TorchVersion::default(),
    };
    Ok((profile, version))
}

/// The memory outside the allocator for a trace with this header: the profile's terms for the
/// libraries the trace says it loads (the context alone, with a warning, when it does not say).
pub fn outside_for(
    profile: Option<&(Profile, PathBuf)>,
    header: &trace::Header,
    warnings: &mut Vec<String>,
) -> Outside {
    let Some((p, path)) = profile else { return Outside::none() };
    warnings.extend(fit::profile_mismatch(header, p, path));
    let libs = if Libraries::from_header(header).is_none() {
        warnings.push(
            "the trace does not say which CUDA libraries the job loads (no uses_gemm/uses_conv metadata); \
             counting the profile's context only, not cuBLAS or cuDNN"
                .into(),
        );
        Libraries::UNKNOWN
    } else {
        // One key of the two: memsim has no other evidence (memest has features and the trace's
        // workspaces), so the other library is not counted, and that is said.
        for (key, lib) in [(&metadata::USES_GEMM, "cuBLAS"), (&metadata::USES_CONV, "cuDNN")] {
            if header.meta_flag(key).is_none() {
                warnings.push(format!(
                    "the trace does not say whether the job uses {lib} (no readable {} metadata, though it has \
                     the other library's): {lib}'s memory is not counted (memest estimate judges it from the \
                     trace's workspaces and the job's features)",
                    key.name
                ));
            }
        }
        Libraries::of(header, Libraries::UNKNOWN)
    };
    let o = fit::outside(p, &path.display().to_string(), libs);
    warnings.extend(o.warnings());
    o
}

/// What one replay with a fit check gives.
pub struct Replayed {
    pub fit: FitOutcome,
    pub outside: Outside,
    pub margin: Margin,
    pub capacity: Option<Capacity>,
    pub verdict: Option<Verdict>,
    pub warnings: Vec<String>,
    /// The allocator rules replayed (a snapshot's guessed release where none was given).
    pub version: TorchVersion,
}

impl Replayed {
    /// The device peak: reserved plus outside the allocator.
    pub fn point(&self) -> u64 {
        self.fit.device_peak(&self.outside)
    }

    /// The point plus the safety margin.
    pub fn safe(&self) -> u64 {
        self.fit.device_safe(&self.outside, &self.margin)
    }

    /// The need with perfect packing: the allocated need (the allocated peak, or a failed
    /// allocation's bytes allocated then plus its size) in place of the reserved, with the same
    /// outside terms (and margin, unless `point`); saturated (`null`) where the need is. A batch
    /// search stops probing larger batches once this passes the capacity: when the allocated need
    /// grows with the batch, theirs are at least this one's, so however the allocator packs them
    /// they cannot fit.
    pub fn need_floor(&self, point: bool) -> u64 {
        let f = &self.fit;
        let allocated = f.first_oom.allocated_need(f.report.peaks.peak_allocated_bytes, f.report.recorded_oom);
        let at_least = allocated.saturating_add(self.fit.beside(&self.outside));
        if point {
            at_least
        } else {
            self.margin.safe(at_least, allocated)
        }
    }
}

/// The safety margin for a trace (none without a profile), warning when coverage is unmeasured.
pub fn margin_for(profile: Option<&(Profile, PathBuf)>, header: &trace::Header, warnings: &mut Vec<String>) -> Margin {
    let family = Family::of_header(header);
    let regime = family.map_or("unknown-family", Family::name).to_string();
    let Some((p, _)) = profile else { return Margin::none(regime, "no profile: no safety margin", false) };
    let m = fit::margin(p, header, family);
    if !m.coverage_measured {
        warnings.push(format!("safety margin: {}", m.note));
    }
    m
}

/// Replay a file at a capacity: the one path every verdict of `memsim` takes. A snapshot is
/// imported under `opts`' configuration; under its version where `version_given` (`--torch` or a
/// profile named it), else under the release it was most likely written with, as `memsim
/// validate` replays it.
pub fn replay_file(
    file: &Path,
    opts: &ReplayOptions,
    version_given: bool,
    profile: Option<&(Profile, PathBuf)>,
    capacity_flag: Option<u64>,
    strict: bool,
    point: bool,
) -> Result<Replayed> {
    let (capacity, mut warnings) = fit::capacity(capacity_flag, profile.map(|(p, _)| p));
    // The device's total is the base of a memory fraction the program sets.
    let opts = &ReplayOptions { device_total: capacity.map(|c| c.bytes), ..opts.clone() };
    let mut outside = None;
    let mut margin = None;
    let mut version = opts.version;
    let snapshot = crate::input::SnapshotAs {
        version: version_given.then_some(opts.version),
        alloc_conf: opts.alloc_conf.clone(),
    };
    let read = crate::input::for_each_mapped(
        file,
        &snapshot,
        |h, imported_as| {
            version = imported_as.unwrap_or(version);
            let opts = &ReplayOptions { version, ..opts.clone() };
            warnings.extend(fit::autotuning(h));
            margin = Some(margin_for(profile, h, &mut warnings));
            let o = outside_for(profile, h, &mut warnings);
            let budget = capacity.map(|c| o.budget(c.bytes));
            outside = Some(o);
            FitReplay::new(h, opts, budget).with_context(|| format!("{}: cannot replay", file.display()))
        },
        // Records are sorted into replay steps on the decoding thread.
        |rp| Steps(rp.classifier()),
        |rp, steps| {
            rp.observe_steps(steps);
            Ok(())
        },
    )?;
    warnings.extend(read.warnings(file, strict)?);
    let fit = read.state.finish();
    warnings.extend(fit.report.warnings());
    let outside = outside.unwrap_or_else(Outside::none);
    warnings.extend(fit::held_beside_terms(&fit.report, &outside));
    if capacity_flag.is_some() && profile.is_none() {
        warnings.push(
            "--capacity without --profile: nothing is subtracted for memory outside the allocator (context, \
             libraries), so the verdict is at the allocator level"
                .into(),
        );
    }
    let margin = margin.unwrap_or_else(|| Margin::none(String::new(), "", false));
    let mut r = Replayed { fit, outside, margin, capacity, verdict: None, warnings, version };
    // Without a profile there is no margin: the number judged is the point, and says so.
    r.verdict = capacity.map(|c| {
        match (point, profile) {
            (true, _) => Verdict::new("point", r.point(), c),
            (false, None) => Verdict::new("point: no profile, no safety margin", r.safe(), c),
            (false, Some(_)) => Verdict::new("safe", r.safe(), c),
        }
        .under_fraction(r.fit.report.fraction_need_bytes)
    });
    Ok(r)
}

pub fn run(a: Args) -> Result<u8> {
    let (profile, version) = load(a.profile.as_deref(), a.judge.torch.as_deref())?;
    let opts = ReplayOptions { alloc_conf: a.alloc_conf.clone(), version, ..ReplayOptions::default() };
    batch::run(&a.files, a.judge.json, |file| replay_one(&a, file, &opts, profile.as_ref()))
}

/// One file's replay, rendered.
fn replay_one(a: &Args, file: &Path, opts: &ReplayOptions, profile: Option<&(Profile, PathBuf)>) -> Result<Output> {
    let version_given = a.judge.torch.is_some() || profile.is_some();
    let mut r = replay_file(file, opts, version_given, profile, a.capacity, a.judge.strict, a.judge.point)?;
    let version = r.version;
    if a.judge.point {
        if let Some(why) = point_without_effect(r.verdict.is_some(), &[&r.margin]) {
            r.warnings.push(why);
        }
    }
    let mut out = Output::new(r.warnings.clone());
    out.code = match &r.verdict {
        Some(v) if !v.fits => 1u8,
        _ => 0u8,
    };
    let rep = &r.fit.report;
    if a.judge.json {
        let mut v = serde_json::to_value(rep)?;
        v["file"] = file.display().to_string().into();
        v["torch_allocator_version"] = version.to_string().into();
        // One meaning of capacity: the device's total memory. The allocator's share is separate.
        v["capacity"] = serde_json::to_value(r.capacity)?;
        v["allocator_budget_bytes"] = serde_json::to_value(r.fit.budget)?;
        v["oom"] = r.fit.first_oom.oom.into();
        // The need of the failed replay (the unlimited report beside it has none).
        v["oom_need_bytes"] = r.fit.first_oom.oom_need_bytes.map_or(serde_json::Value::Null, bytes_json);
        // Which replay the peaks and memory_stats are of (README.md, "Replay, summarise, convert": `peaks_of`).
        v["peaks_of"] = peaks_of(&r.fit).into();
        v["oom_at_event"] = serde_json::to_value(r.fit.first_oom.oom_at_event)?;
        v["oom_detail"] = serde_json::to_value(&r.fit.first_oom.oom_detail)?;
        v["outside_allocator"] = serde_json::to_value(&r.outside)?;
        // A saturated need (a memory fraction of 0) is no size: null, and why (memest's words).
        v["peak_device_bytes"] = bytes_json(r.point());
        v["peak_device_safe_bytes"] = bytes_json(r.safe());
        v["need_unbounded"] = serde_json::to_value(Unbounded::of(r.safe(), rep.fraction_need_bytes))?;
        v["need_floor_bytes"] = bytes_json(r.need_floor(a.judge.point));
        v["margin"] = serde_json::to_value(&r.margin)?;
        v["verdict"] = serde_json::to_value(&r.verdict)?;
        v["warnings"] = serde_json::to_value(&r.warnings)?;
        v["peaks_count"] = PEAKS_COUNT.into();
        out.json = Some(v);
        return Ok(out);
    }
    // The count is of requests replayed; those the model rejected are said beside it, not in it.
    let rejected = match rep.rejected {
        0 => String::new(),
        n => format!("{n} more rejected and left out; "),
    };
    outln!(
        out,
        "{}: replayed {} requests of {} records ({rejected}allocator rules {version})",
        crate::input::shown(file),
        rep.requests,
        rep.events
    );
    let line = crate::validate::alloc_conf_line(
        rep.alloc_conf.as_deref(),
        rep.alloc_conf_source,
        rep.alloc_conf_note.as_deref(),
    );
    outln!(out, "  alloc conf          {line}");
    let p = &rep.peaks;
    outln!(out, "  peak reserved       {}", mib_and_bytes(p.peak_reserved_bytes, ""));
    outln!(out, "  peak allocated      {}", mib_and_bytes(p.peak_allocated_bytes, ""));
    outln!(out, "  peak active         {}", mib(p.peak_active_bytes));
    outln!(out, "  peak requested      {}", mib(p.peak_requested_bytes));
    outln!(out, "  (peaks: {PEAKS_COUNT})");
    match (r.fit.budget, r.fit.first_oom.oom_at_event) {
        (Some(budget), _) if r.fit.peaks_at_budget => {
            // Replayed within the budget the peaks can differ from an unlimited replay's: at a
            // full device the allocator frees its cached blocks and retries, as PyTorch's does.
            outln!(
                out,
                "  (replayed within the allocator budget of {}: when it fills, the allocator frees its cache and \
                 retries, so these peaks can differ from a replay without --capacity)",
                mib(budget)
            )
        }
        (Some(budget), Some(i)) => outln!(
            out,
            "  (the replay at the allocator budget of {} fails at record {i}; these peaks and stats are of the replay \
             without a budget: what the run needs)",
            mib(budget)
        ),
        _ => {}
    }
    if let Some((first, steady)) = rep.step_peaks() {
        outln!(
            out,
            "  first iteration     {} reserved, {} allocated",
            mib(first.peak_reserved_bytes),
            mib(first.peak_allocated_bytes)
        );
        if let Some(s) = steady {
            outln!(
                out,
                "  {:<19} {} reserved, {} allocated",
                // Steps counted from 1, as `estimate` says them, whatever the markers' numbers.
                format!("steady (steps 2-{})", rep.iterations.len()),
                mib(s.peak_reserved_bytes),
                mib(s.peak_allocated_bytes)
            );
        }
    }
    if r.outside.source != "none" {
        let o = &r.outside;
        outln!(
            out,
            "  outside allocator   {} (context {}, cuBLAS {}, cuDNN {}, NCCL {}; libraries from {})",
            mib(o.total_bytes),
            mib(o.context_bytes),
            mib(o.cublas_bytes),
            mib(o.cudnn_bytes),
            mib(o.nccl_bytes),
            o.libraries.source
        );
    }
    if rep.recorded_outside_bytes > 0 {
        outln!(
            out,
            "  held outside        {} in the need, of {} at most (device memory the trace held outside the caching \
             allocator: other modules' own requests, VMM handles, managed memory)",
            mib(r.fit.held_beside()),
            mib(rep.recorded_outside_bytes)
        );
    }
    let by_fraction = rep.fraction_need_bytes > r.fit.reserved_need().saturating_add(r.fit.beside(&r.outside));
    if r.outside.source != "none" || rep.recorded_outside_bytes > 0 || r.fit.need_is_oom_floor() || by_fraction {
        if by_fraction {
            outln!(
                out,
                "  peak device         {} (the device total under which the program's own memory fraction lets its \
                 allocator reserve what it needs)",
                mib(r.point())
            );
        } else if r.fit.need_is_oom_floor() {
            // "more than any device holds" takes no "at least".
            let at_least = if r.point() == u64::MAX { "" } else { " at least" };
            outln!(
                out,
                "  peak device         {}{at_least} (an allocation failed: the bytes held then plus its size, \
                 + outside the allocator)",
                mib(r.point())
            );
        } else {
            outln!(out, "  peak device         {} (reserved + outside the allocator)", mib(r.point()));
        }
        outln!(out, "  safe device         {} ({})", mib(r.safe()), r.margin.note);
    }
    for d in &rep.devices {
        outln!(
            out,
            "  device {}: at peak reserved: {} segments, {} reserved but not allocated, largest free block {}",
            d.device,
            d.at_peak.segments,
            mib(d.at_peak.reserved_minus_allocated),
            mib(d.at_peak.largest_free_block)
        );
        if !d.categories_at_peak.is_empty() {
            outln!(out, "  device {}: allocated at its peak, by category:", d.device);
            for (k, v) in &d.categories_at_peak {
                if *v > 0 {
                    outln!(out, "    {k:<16} {}", mib(*v));
                }
            }
        }
    }
    for (m, n) in &rep.skipped_by_caller {
        outln!(out, "  left out: {n} requests made by {m} (outside the caching allocator)");
    }
    if rep.recorded_releases > 0 {
        outln!(
            out,
            "  replayed as empty_cache: {} releases of cached memory the run recorded (empty_cache, or its \
             allocator's retry at its GPU's capacity)",
            rep.recorded_releases
        );
    }
    if rep.failed_frees > 0 {
        outln!(
            out,
            "  left out: {} frees of allocations the model could not place (out of memory: they free nothing)",
            rep.failed_frees
        );
    }
    if rep.skipped_failed_calls > 0 {
        outln!(out, "  left out: {} failed calls recorded in the trace", rep.skipped_failed_calls);
    }
    match (&r.verdict, r.fit.budget) {
        (Some(v), Some(budget)) => {
            let src = v.capacity_source.describe();
            let (need, cap) = simulator::units::need_and_capacity(v.need_bytes, v.capacity_bytes, 2);
            outln!(
                out,
                "verdict: needs {need} ({}) on a {cap} device ({src}; allocator budget {}): {}",
                v.basis,
                mib(budget),
                fit::verdict_word(v.fits)
            );
            if let (Some(i), Some(d)) = (r.fit.first_oom.oom_at_event, &r.fit.first_oom.oom_detail) {
                outln!(out, "  replayed at the budget, it fails at record {i}: {d}");
            }
        }
        _ => {
            if let (Some(i), Some(d)) = (r.fit.first_oom.oom_at_event, &r.fit.first_oom.oom_detail) {
                outln!(out, "  the first allocation fails at record {i}, whatever the capacity: {d}");
            }
            outln!(out, "verdict: none (give --capacity or --profile to check a fit)")
        }
    }
    Ok(out)
}

/// Which replay a fit's peaks and `memory_stats` are of: `"budget"` (the replay at the
/// allocator budget, which did not fail), `"unlimited"` (the replay without a budget: none was
/// given, or the replay at the budget failed, which `oom` then says).
pub fn peaks_of(fit: &FitOutcome) -> &'static str {
    if fit.peaks_at_budget {
        "budget"
    } else {
        "unlimited"
    }
}

/// Why `--point` changes nothing, if it does not: no verdict to judge, or no margin to leave out.
pub fn point_without_effect(has_verdict: bool, margins: &[&Margin]) -> Option<String> {
    if !has_verdict {
        Some("--point has no effect: there is no capacity to judge a fit against (give --capacity or --profile)".into())
    } else if margins.iter().all(|m| m.fraction == 0.0) {
        Some(format!("--point has no effect: the safe number is the point here ({})", margins[0].note))
    } else {
        None
    }
}

/// What replay's peaks count, printed beside them.
pub const PEAKS_COUNT: &str = "the caching allocator's reserved/allocated bytes for the requests in this trace \
     (blocks allocated before the trace began are counted only when the trace rebuilds its start state); \
     the CUDA context and libraries are outside them";
