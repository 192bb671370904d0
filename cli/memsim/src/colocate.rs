//! `memsim colocate A B [C...] [--profile NAME] [--capacity 80GiB] [--context 500MiB] [--align auto|timestamps|sum] [--json]`.

use std::path::PathBuf;

use anyhow::Result;
use simulator::colocate::{colocate, sum_of_peaks, Align, Job, Mode, Start};
use simulator::fit::{self, Outside};
use simulator::replay::ReplayOptions;
use simulator::units::{mib, parse_capacity, parse_size};

/// How to combine the jobs (`--align`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AlignArg {
    /// Timestamps when every trace has wall-clock time, else the sum of peaks.
    Auto,
    /// Replay the jobs together on one wall-clock axis (every trace needs timestamps).
    Timestamps,
    /// The sum of each job's device peak (peaks assumed to coincide); `worst` is an alias.
    #[value(alias = "worst")]
    Sum,
}

/// Arguments of `memsim colocate`.
#[derive(clap::Args)]
#[command(after_help = "Exit status: 0 the set fits (or no capacity to check), 1 it does not fit, 2 bad input.\n\
Jobs are separate processes, each with its own caching allocator. Without wall-clock time on every \
trace, nothing says when each job peaks, so the combined need is the sum of what each job holds at its \
peak, each replayed alone at the capacity (where its allocator frees its own cache when the device is \
full), and at least the device total a job's own memory fraction asks for.")]
pub struct Args {
    /// Allocator-level traces of the jobs (two or more to share; one gives its own fit); `-` reads one from
    /// standard input.
    #[arg(required = true, num_args = 1..)]
    traces: Vec<PathBuf>,
    /// GPU profile: capacity and per-process memory outside the allocator come from it unless given.
    #[arg(long, value_name = "NAME")]
    profile: Option<String>,
    /// The GPU's total memory, e.g. 80GiB or 81920MiB. Default: the profile's total memory.
    #[arg(long, value_parser = parse_capacity, value_name = "SIZE", allow_negative_numbers = true)]
    capacity: Option<u64>,
    /// Memory each process holds outside the allocator, e.g. 500MiB. Default: from the profile,
    /// the context plus cuBLAS/cuDNN for the libraries each trace says its job loads.
    #[arg(long, value_parser = parse_size, value_name = "SIZE", allow_negative_numbers = true)]
    context: Option<u64>,
    /// How to combine the jobs.
    #[arg(long, value_enum, default_value = "auto")]
    align: AlignArg,
    #[command(flatten)]
    judge: crate::replay::JudgeFlags,
}

pub fn run(a: Args) -> Result<u8> {
    crate::input::stdin_once(&a.traces)?;
    let (profile, version) = crate::replay::load(a.profile.as_deref(), a.judge.torch.as_deref())?;
    let opts = ReplayOptions { alloc_conf: None, version, ..ReplayOptions::default() };
    let (capacity, mut warnings) = simulator::fit::capacity(a.capacity, profile.as_ref().map(|(p, _)| p));
    let mut jobs = Vec::new();
    for t in &a.traces {
        let read = crate::input::for_each_record(
            t,
            |_| Ok(Vec::new()),
            |v, r| {
                v.push(r.clone());
                Ok(())
            },
        )?;
        warnings.extend(read.warnings(t, a.judge.strict)?);
        let mut job_warnings: Vec<String> = simulator::fit::autotuning(&read.header).into_iter().collect();
        let outside = match a.context {
            Some(c) => Outside::fixed(c),
            None => crate::replay::outside_for(profile.as_ref(), &read.header, &mut job_warnings),
        };
        let margin = crate::replay::margin_for(profile.as_ref(), &read.header, &mut job_warnings);
        warnings.extend(job_warnings.into_iter().map(|w| format!("{}: {w}", crate::input::shown(t))));
        jobs.push(Job { name: t.display().to_string(), header: read.header, records: read.state, outside, margin });
    }
    if profile.is_none() && a.context.is_none() {
        warnings
            .push("no --profile or --context: nothing is counted outside the allocator (context, libraries)".into());
    }
    warnings.sort();
    warnings.dedup();
    warnings.extend(same_file_twice(&a.traces));
    let align = match a.align {
        AlignArg::Auto => Align::Auto,
        AlignArg::Timestamps => Align::Timestamps,
        AlignArg::Sum => Align::SumOfPeaks,
    };
    if jobs.len() == 1 && align != Align::Auto {
        warnings.push("--align has no effect on one job: it is judged as its replay".into());
    }
    let r = colocate(&jobs, &opts, capacity, align, a.judge.point)?;
    for j in &r.jobs {
        for w in &j.replay_warnings {
            warnings.push(format!("{}: {w}", j.name));
        }
    }
    if a.judge.point {
        let margins: Vec<&simulator::fit::Margin> = jobs.iter().map(|j| &j.margin).collect();
        warnings.extend(crate::replay::point_without_effect(r.verdict.is_some(), &margins));
    }
    crate::input::warn(&warnings);
    let code = if r.fits { 0u8 } else { 1u8 };
    if a.judge.json {
        let mut v = serde_json::to_value(&r)?;
        v["warnings"] = serde_json::to_value(&warnings)?;
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(code);
    }
    for j in &r.jobs {
        let judged = if a.judge.point { j.device_peak_bytes } else { j.device_safe_bytes };
        // At a capacity below its unlimited peak the job frees its own cache: what it needs
        // there is what the verdict alone rests on, said when it is not the number beside it.
        let there = match j.need_alone_bytes {
            Some(n) if n != judged => format!(" (needs {} at this capacity)", mib(n)),
            _ => String::new(),
        };
        let alone = match j.fits_alone {
            Some(true) => format!("  fits alone{there}"),
            Some(false) => format!("  DOES NOT FIT ALONE{there}"),
            None => String::new(),
        };
        let shared = match (j.oom_in_shared_run, j.oom_at_event) {
            (Some(true), Some(i)) => format!("; OOM in the shared run at its record {i}"),
            (Some(true), None) => "; OOM in the shared run".into(),
            _ => String::new(),
        };
        // As replay says it: a safe number without a margin is the point, and must not read as
        // one with a margin's cover.
        let bare = if j.margin.fraction > 0.0 { "" } else { " (no safety margin)" };
        // A memory fraction's device total is no sum of the parts the job holds: said so.
        let parts = format!(
            "reserved {} + outside the allocator {}",
            mib(j.peak_reserved_bytes),
            mib(j.outside_allocator.total_bytes.saturating_add(j.held_outside_bytes))
        );
        let peak = if j.fraction_sets_peak() {
            format!("the device total its memory fraction asks for; it holds {parts}")
        } else {
            parts
        };
        println!(
            "  {:<40} safe {:>12}{bare}, device peak {:>12} ({peak}){alone}{shared}",
            j.name,
            mib(j.device_safe_bytes),
            mib(j.device_peak_bytes),
        );
    }
    let how = r.verdict.as_ref().map_or(mode_name(r.mode), |v| v.basis.as_str());
    println!("combination          {how}: {}", r.mode_reason);
    let when = match (fraction_floor(&r, a.judge.point), r.combined_peak_at_us, r.start) {
        (Some(floor), _, _) => floor,
        (None, Some(t), Some(Start::PeaksAligned)) => {
            format!(" at {:.6} s after the first start (each job's own peak at one instant)", t / 1e6)
        }
        (None, Some(t), _) => format!(" at {:.6} s after the common start (the jobs started together)", t / 1e6),
        (None, None, _) => String::new(),
    };
    println!("combined need        {}{when}", mib(r.combined_need_bytes));
    // Beside each job's own peak, a shared need below their sum reads as a mistake unless said.
    let sum = sum_of_peaks(&r.jobs, a.judge.point);
    // Only a run at a capacity retries; unlimited, a gap has other terms (a memory fraction, a
    // recorded OOM's floor, memory held outside at other moments).
    if r.mode == Mode::Timestamps && r.capacity.is_some() && r.combined_need_bytes < sum {
        println!(
            "                     (below the sum of their peaks, {}: when the device is full each allocator frees its \
             own cached blocks and retries, as PyTorch's does)",
            mib(sum)
        );
    } else if r.mode == Mode::SumOfPeaks && r.jobs.len() > 1 && r.capacity.is_some() && r.combined_need_bytes < sum {
        println!(
            "                     (what each job holds at its peak replayed alone at this capacity, summed: below the \
             sum of their unlimited peaks, {}, since when the device is full each allocator frees its own cached \
             blocks and retries, as PyTorch's does)",
            mib(sum)
        );
    }
    // Below its unlimited peak an allocator frees its own cache and retries, so what a set
    // needs depends on the capacity it is given: the smallest that fits can be below the need
    // at a larger one.
    let adapts = if r.smallest_fitting_capacity < r.combined_need_bytes {
        " (below the need above: at a smaller capacity the allocators free their caches and retry)"
    } else {
        ""
    };
    println!("smallest capacity    {}{adapts}", mib(r.smallest_fitting_capacity));
    match &r.verdict {
        Some(v) => {
            let src = v.capacity_source.describe();
            let (need, cap) = simulator::units::need_and_capacity(v.need_bytes, v.capacity_bytes, 2);
            println!("verdict              needs {need} of {cap} ({src}): {}", fit::verdict_word(v.fits));
        }
        None => println!("verdict              none (give --capacity or --profile)"),
    }
    Ok(code)
}

/// When a job's memory fraction, not what the jobs hold together, sets the combined need: whose,
/// and (summing peaks) what they hold. The aligned replay has no margins: its fraction is the point.
fn fraction_floor(r: &simulator::colocate::ColocateReport, point: bool) -> Option<String> {
    let point = point || r.mode == Mode::Timestamps;
    let held = simulator::colocate::saturating_sum(r.jobs.iter().map(|j| j.held_bytes(point)));
    let j = r.jobs.iter().find(|j| j.fraction_bytes(point) == r.combined_need_bytes)?;
    match r.mode {
        Mode::SumOfPeaks if r.jobs.len() > 1 && r.combined_need_bytes > held => Some(format!(
            " (the device total {}'s memory fraction asks for, more than the {} the jobs hold together)",
            j.name,
            mib(held)
        )),
        Mode::Timestamps => Some(format!(" (the device total {}'s memory fraction asks for)", j.name)),
        Mode::SumOfPeaks => None,
    }
}

fn mode_name(m: Mode) -> &'static str {
    match m {
        Mode::Timestamps => "aligned replay",
        Mode::SumOfPeaks => "sum of device peaks",
    }
}

/// A warning per file given more than once (by path or link): two copies of one job may be
/// meant, or a slip of the shell.
fn same_file_twice(traces: &[std::path::PathBuf]) -> Vec<String> {
    let mut w = Vec::new();
    for (i, t) in traces.iter().enumerate() {
        if let Some(first) = traces[..i].iter().find(|e| trace::same_file(e, t)) {
            w.push(format!(
                "{} is given twice (also as {}): judged as two copies of the same job on one GPU; drop one if that \
                 is not meant",
                t.display(),
                first.display()
            ));
        }
    }
    w
}
