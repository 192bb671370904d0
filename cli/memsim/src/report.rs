//! `memsim report FILE --html OUT [--profile NAME]... [--estimate EST.json]`: one self-contained
//! HTML page explaining a trace's memory (simulator::report).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use estimators::estimate_file::{self, EstimateFile};
use estimators::estimate_text::{EstimateText, EstimateView};
use simulator::profile::{known_profiles, Profile};
use simulator::replay::ReplayOptions;
use simulator::report::html::{self, EstimatePage, EstimatorRow, Extras, ProfileVerdict};
use simulator::report::{self};
use simulator::units::{self, mib_or_null};

use crate::replay::{load, point_without_effect, replay_file, Replayed};

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 20) as f64
}

/// Arguments of `memsim report`.
#[derive(clap::Args)]
#[command(after_help = "Exit status: 0 the page was written, 2 bad input or error.\n\
The page holds memory over the run by category with the allocated and reserved lines, what is \
alive at the allocated peak (categories, the largest allocations and their source lines where the \
trace has stacks), the segment map at the peak, and a verdict per GPU profile; with --estimate, \
the estimators side by side and the estimate's verdict as the headline. No script, no network.")]
pub struct Args {
    /// Allocator-level trace: .mtrace, .jsonl, or a snapshot .pickle; `-` reads a trace from standard input.
    file: PathBuf,
    /// Where to write the page.
    #[arg(long, value_name = "OUT.html")]
    html: Option<PathBuf>,
    /// Print what the page shows as JSON, with or without --html (for programs: `memtrace.Estimate.timeline()`
    /// and `.breakdown` read it): peaks, categories at the peak, the largest live allocations,
    /// the sampled curve and the markers.
    #[arg(long)]
    json: bool,
    /// GPU profile to give a verdict for (repeatable). Default: every known profile.
    #[arg(long = "profile", value_name = "NAME")]
    profiles: Vec<String>,
    /// `memest estimate --json` or `python -m memtrace_trainer estimate --json` of the same job:
    /// its estimators side by side and its verdict as the page's headline, worded from its numbers
    /// as `memest render` words them. Read and checked as `memest render` reads it: a file render
    /// refuses is refused here (exit 2, the field named, no page written).
    #[arg(long, value_name = "EST.json")]
    estimate: Option<PathBuf>,
    /// Allocator configuration in PYTORCH_CUDA_ALLOC_CONF syntax; overrides what the trace recorded.
    #[arg(long, value_name = "STR")]
    alloc_conf: Option<String>,
    /// PyTorch version whose allocator rules apply to the pictures (2.4, 2.5, 2.9 or later).
    /// Default: the first --profile's, else that of the profile the trace was emulated for, else the newest.
    /// Each profile's verdict uses its own.
    #[arg(long, value_name = "VER")]
    torch: Option<String>,
    /// What the page is about (default: the trace's file name).
    #[arg(long, value_name = "TEXT")]
    title: Option<String>,
    /// Verdicts on the point estimate instead of the safe number.
    #[arg(long)]
    point: bool,
    /// The device's total memory every profile's verdict is judged at (e.g. 40GiB), as `memsim
    /// replay --capacity`; default: each profile's own. `estimate --report --capacity` passes
    /// its capacity here, so the page's table and headline judge the same device.
    #[arg(long, value_parser = simulator::units::parse_capacity, value_name = "SIZE", allow_negative_numbers = true)]
    capacity: Option<u64>,
    #[arg(long, help = crate::input::STRICT_HELP)]
    strict: bool,
}

/// The estimate through the one parser of the format, with every check `memest render` makes.
fn read_estimate(path: &Path) -> Result<EstimateFile> {
    let text = trace::read_small_string(path, 256 << 20).with_context(|| format!("--estimate {}", path.display()))?;
    estimate_file::parse(&text).map_err(|e| anyhow::anyhow!("--estimate {}: {e}", path.display()))
}

/// The estimate as the page shows it: worded from its numbers as `memest render` words them
/// (never its `text`, which a copied or edited file can make say anything).
fn estimate_page(view: &EstimateView) -> EstimatePage {
    let words = EstimateText::of(view);
    let v = &view.verdict;
    let estimators = view
        .estimates
        .iter()
        .filter_map(|(name, a)| {
            let a = a.as_ref()?;
            Some(EstimatorRow {
                name: name.clone(),
                device_mib: a.device_mib?,
                level: a.level.clone(),
                ignores: a.ignores.clone(),
            })
        })
        .collect();
    EstimatePage {
        headline: words.headline,
        fits: v.fits,
        need_mib: v.need_mib,
        details: words.details,
        capacity_mib: v.capacity_mib,
        headline_estimator: view.headline.clone(),
        estimators,
        unavailable: view.unavailable.iter().map(|(k, w)| (k.clone(), w.clone())).collect(),
    }
}

/// A warning when the estimate is of another job than the trace the page explains (the
/// estimate's `model`/`batch_size`, and its `inputs`' `seq_len`/`input_shape`, against the
/// trace header's).
fn other_job(
    estimate: &serde_json::Value,
    path: &std::path::Path,
    header: &trace::Header,
    file: &std::path::Path,
) -> Option<String> {
    let said = |k: &str| {
        estimate.get(k).filter(|v| !v.is_null()).map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_string))
    };
    // The input size as the header spells it: `input_shape` `3,64,64` (a list or the CLI's text).
    let size = |k: &str| {
        estimate.get("inputs").and_then(|i| i.get(k)).filter(|v| !v.is_null()).map(|v| match v {
            serde_json::Value::Array(a) => a.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(","),
            serde_json::Value::String(t) => t.replace(' ', ""),
            other => other.to_string(),
        })
    };
    let meta = |k: &trace::metadata::Key| header.meta(k).map(str::to_string);
    let pairs = [
        ("model", said("model"), meta(&trace::metadata::MODEL)),
        ("batch_size", said("batch_size"), meta(&trace::metadata::BATCH_SIZE)),
        ("seq_len", size("seq_len"), meta(&trace::metadata::SEQ_LEN)),
        ("input_shape", size("input_shape"), meta(&trace::metadata::INPUT_SHAPE)),
    ];
    let differ: Vec<String> = pairs
        .into_iter()
        .filter_map(|(k, e, t)| match (e, t) {
            (Some(e), Some(t)) if e != t => Some(format!("{k} {e} against {t}")),
            _ => None,
        })
        .collect();
    (!differ.is_empty()).then(|| {
        format!(
            "--estimate {} is of another job than {} ({}): the page puts two jobs side by side",
            path.display(),
            file.display(),
            differ.join(", ")
        )
    })
}

/// Where the estimate's headline and the page's table, for the same profile, rest on different
/// things: another capacity, the point against the safe number (where a margin tells them
/// apart), or a reserved peak that is not this replay's (another trace, or other allocator
/// settings). Each made the page contradict itself silently.
fn headline_against_table(
    estimate: &EstimateView,
    path: &std::path::Path,
    verdicts: &[ProfileVerdict],
    point: bool,
) -> Vec<String> {
    let Some(row) = verdicts.iter().find(|v| v.profile == estimate.profile_name) else { return Vec::new() };
    let est = path.display();
    let v = &estimate.verdict;
    let mut w = Vec::new();
    // MiB to a tenth, as both print them.
    let differ = |a: f64, b: f64| (a - b).abs() >= 0.05;
    let capacity = Some(v.capacity_mib).filter(|c| differ(*c, row.capacity_mib));
    if let Some(c) = capacity {
        w.push(format!(
            "--estimate {est} was judged on a device of {c:.1} MiB and the table's {} row on one of {:.1} MiB: the \
             headline and the table judge different devices (give the estimate's --capacity here too)",
            row.profile, row.capacity_mib
        ));
    }
    let safe = v.basis.ends_with("safe_mib");
    // Without a margin the safe number is the point: the two cannot disagree.
    let margin = matches!((v.need_mib, v.point_mib), (Some(n), Some(p)) if differ(n, p));
    if safe == point && margin {
        let (headline, table) =
            if safe { ("the safe number", "the point (--point)") } else { ("the point", "the safe number") };
        w.push(format!(
            "--estimate {est} judges {headline} and the table {table}: the headline and the table can disagree"
        ));
    }
    // The reserved peak leaves out the outside terms (which memest may choose libraries for
    // where the trace does not say); at another capacity it differs anyway (said above).
    let symbolic = estimate.estimates.get("symbolic").and_then(Option::as_ref);
    let reserved = symbolic.and_then(|s| s.reserved_mib).filter(|r| row.reserved_mib.is_none_or(|m| differ(*r, m)));
    if let (Some(r), None) = (reserved, capacity) {
        let mine = row.reserved_mib.map_or_else(|| simulator::units::UNBOUNDED.to_string(), |m| format!("{m:.1} MiB"));
        w.push(format!(
            "--estimate {est} has a reserved peak of {r:.1} MiB on {} where this replay has {mine}: the \
             headline is of another trace, or of other allocator settings (--alloc-conf, --torch)",
            row.profile
        ));
    }
    w
}

/// Why a profile's verdict needs another amount than the page's reserved peak (a replay without
/// a capacity, under the page's allocator rules) plus the outside terms, where it does: `replay`'s
/// text says the same beside its verdict.
fn verdict_note(r: &Replayed, page_peak: u64) -> Option<String> {
    let fit = &r.fit;
    let oom = &fit.first_oom;
    let budget = fit.budget.map_or_else(String::new, |b| format!(" (allocator budget {})", units::mib(b)));
    if fit.need_is_oom_floor() {
        let recorded = fit.report.recorded_oom.map_or(0, |o| o.need_bytes);
        if let (Some(i), Some(d), false) =
            (oom.oom_at_event, &oom.oom_detail, recorded > oom.oom_need_bytes.unwrap_or(0))
        {
            // The report is the unlimited replay's when it failed too: no capacity places it.
            let where_ = if fit.report.first_oom.oom {
                " whatever the capacity".to_string()
            } else {
                format!(" at this capacity{budget}")
            };
            return Some(format!(
                "an allocation fails at record {i}{where_} ({d}): the need counts the bytes reserved then plus its \
                 size, {}, which the peak above never shows (the request was never placed)",
                units::mib(fit.reserved_need())
            ));
        }
        return Some(format!(
            "the run ran out of memory: the need counts the failed request on top of what was allocated then, {}, \
             which the peak above never shows",
            units::mib(fit.reserved_need())
        ));
    }
    let need = fit.reserved_need();
    if need == page_peak {
        return None;
    }
    if fit.peaks_at_budget {
        return Some(format!(
            "replayed at this capacity{budget}: when the budget fills the allocator frees its cached blocks and \
             retries, as PyTorch's does, so the job reserves at most {}, not the {} the peak above (a replay \
             without a capacity) reserves",
            units::mib(need),
            units::mib(page_peak)
        ));
    }
    Some(format!(
        "under this profile's allocator rules (PyTorch {}) the job reserves at most {}, not the {} of the peak above",
        r.version,
        units::mib(need),
        units::mib(page_peak)
    ))
}

fn to_json(rep: &report::Report, version: &str, verdicts: &[ProfileVerdict], warnings: &[String]) -> serde_json::Value {
    let names: Vec<&str> = trace::Category::ALL.iter().map(|c| c.as_str()).collect();
    serde_json::json!({
        "device": rep.device,
        "records": rep.records,
        "allocator": version,
        "peak_allocated_bytes": rep.peak_allocated,
        "peak_reserved_bytes": rep.peak_reserved,
        "peak_at": rep.peak_at,
        "reserved_at_peak_bytes": rep.reserved_at_peak,
        "has_categories": rep.has_categories,
        "categories_at_peak": rep
            .categories_at_peak
            .iter()
            .map(|(k, v)| (k.clone(), serde_json::Value::from(*v)))
            .collect::<serde_json::Map<_, _>>(),
        "live_count": rep.live_count,
        "top": rep.top,
        "segments_at_peak": rep.segments.len(),
        "categories": names,
        "samples": rep.samples,
        "marks": rep.marks,
        "verdicts": verdicts,
        "warnings": warnings,
    })
}

pub fn run(a: Args) -> Result<u8> {
    if a.html.is_none() && !a.json {
        bail!("give --html OUT.html (the page) or --json (its numbers)");
    }
    if let Some(out) = &a.html {
        let ext = out.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase);
        if !matches!(ext.as_deref(), Some("html" | "htm")) {
            bail!("--html {}: expected a file name ending in .html or .htm (the page is HTML)", out.display());
        }
        crate::input::distinct_output(&a.file, out)?;
        // Said before the replay, not after its warnings (a second on a large trace).
        if out.is_dir() {
            bail!("--html {}: a folder; expected a file name ending in .html or .htm", out.display());
        }
        let folder = out.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(std::path::Path::new("."));
        if !folder.is_dir() {
            bail!("--html {}: the folder {} does not exist", out.display(), folder.display());
        }
    }
    // Only the page shows it: without --html it is said to have no effect, not read.
    let estimate = a.estimate.as_deref().filter(|_| a.html.is_some()).map(read_estimate).transpose()?;
    let profiles = if a.profiles.is_empty() { known_profiles() } else { a.profiles.clone() };
    // The input is read for the page and again for each profile's verdict: a stream only once.
    let spool = crate::input::spooled(&a.file)?;
    let open = spool.as_ref().map_or(a.file.as_path(), |t| t.path());
    let mut records = Vec::new();
    let read = crate::input::for_each_record(
        open,
        |_| Ok(()),
        |_, r| {
            records.push(r.clone());
            Ok(())
        },
    )
    .map_err(|e| crate::input::renamed(e, open, &a.file))?;
    let mut warnings = read.warnings(&a.file, a.strict)?;
    if let (Some(e), Some(path)) = (&estimate, &a.estimate) {
        warnings.extend(other_job(&e.json, path, &read.header, &a.file));
    }
    if a.html.is_none() {
        for (flag, given) in [("--title", a.title.is_some()), ("--estimate", a.estimate.is_some())] {
            if given {
                warnings.push(format!("{flag} has no effect without --html: it only shapes the page"));
            }
        }
    }
    // The pictures follow --torch, else the first profile given, else the profile the trace was
    // emulated for (as `replay --profile` of it would), else the newest rules.
    let traced = read.header.meta(&trace::metadata::PROFILE).filter(|p| known_profiles().iter().any(|k| k == p));
    let (_, version) = load(a.profiles.first().map(String::as_str).or(traced), a.torch.as_deref())?;
    let opts = ReplayOptions { alloc_conf: a.alloc_conf.clone(), version, ..ReplayOptions::default() };
    let rep = report::collect(&read.header, &records, &opts)
        .with_context(|| format!("{}: cannot replay", a.file.display()))?;
    drop(records);
    let mut verdicts = Vec::new();
    let mut margins = Vec::new();
    for name in &profiles {
        let (profile, pversion) = load(Some(name), a.torch.as_deref())?;
        let popts = ReplayOptions { version: pversion, ..opts.clone() };
        let r = replay_file(open, &popts, true, profile.as_ref(), a.capacity, a.strict, a.point)
            .map_err(|e| crate::input::renamed(e, open, &a.file))?;
        let Some(v) = &r.verdict else { continue };
        let gpu = profile.as_ref().map_or_else(String::new, |(p, _): &(Profile, PathBuf)| p.gpu.name.clone());
        for w in &r.warnings {
            let w = crate::input::renamed_text(w, open, &a.file).unwrap_or_else(|| w.clone());
            if !warnings.contains(&w) {
                warnings.push(w);
            }
        }
        verdicts.push(ProfileVerdict {
            profile: profile.as_ref().map_or_else(|| name.clone(), |(_, path)| Profile::name_of(path)),
            gpu,
            need_mib: mib_or_null(v.need_bytes),
            point_mib: mib_or_null(r.point()),
            reserved_mib: mib_or_null(r.fit.reserved_need()),
            need_unbounded: v.need_unbounded,
            capacity_mib: mib(v.capacity_bytes),
            fits: v.fits,
            basis: v.basis.clone(),
            note: verdict_note(&r, rep.peak_reserved),
        });
        margins.push(r.margin);
    }
    if a.point {
        warnings.extend(point_without_effect(!verdicts.is_empty(), &margins.iter().collect::<Vec<_>>()));
    }
    if let (Some(e), Some(path)) = (&estimate, &a.estimate) {
        warnings.extend(headline_against_table(&e.view, path, &verdicts, a.point));
    }
    crate::input::warn(&warnings);
    // The page carries what the estimate's terminal said: its own warnings first, then those of
    // this replay it did not already say.
    if let Some(e) = &estimate {
        let mut merged: Vec<String> = Vec::new();
        for w in e.view.warnings.iter().cloned() {
            if !merged.contains(&w) {
                merged.push(w);
            }
        }
        let own = format!("{}: ", crate::input::shown(&a.file));
        for w in warnings {
            if !merged.contains(&w) && !said_of_trace(&merged, w.strip_prefix(&own)) {
                merged.push(w);
            }
        }
        warnings = merged;
    }
    let title = a.title.clone().unwrap_or_else(|| {
        a.file.file_name().map_or_else(|| a.file.display().to_string(), |n| n.to_string_lossy().into_owned())
    });
    let estimate = estimate.as_ref().map(|e| estimate_page(&e.view));
    let extras = Extras { title, allocator: version.to_string(), estimate, verdicts, warnings };
    if let Some(out) = &a.html {
        let page = html::render(&rep, &extras);
        trace::write_bytes_atomic(out, page.as_bytes()).with_context(|| format!("writing {}", out.display()))?;
        if !a.json {
            println!(
                "wrote {}: peak reserved {:.1} MiB, peak allocated {:.1} MiB, {} segments at the peak, {} profile verdict(s)",
                out.display(),
                mib(rep.peak_reserved),
                mib(rep.peak_allocated),
                rep.segments.len(),
                extras.verdicts.len()
            );
        }
    }
    if a.json {
        println!("{}", serde_json::to_string(&to_json(&rep, &extras.allocator, &extras.verdicts, &extras.warnings))?);
    }
    Ok(0u8)
}

/// Whether the estimate already holds `what` (a warning of this replay, less its "<trace>: "):
/// the estimate may name the trace otherwise (the trainer writes "the symbolic trace: " for a
/// path of its own temporary folder), so the same finding would be listed twice under two names.
fn said_of_trace(estimate: &[String], what: Option<&str>) -> bool {
    what.is_some_and(|x| estimate.iter().any(|e| e == x || e.strip_suffix(x).is_some_and(|head| head.ends_with(": "))))
}
