//! `memsim replay FILE [--alloc-conf STR] [--capacity 40GiB] [--profile NAME] [--torch VER] [--json]`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use simulator::alloc::TorchVersion;
use simulator::profile::Profile;
use simulator::replay::{ReplayOptions, ReplayReport, Replayer};
use simulator::units::{mib, parse_size};

/// Arguments of `memsim replay`.
#[derive(clap::Args)]
pub struct Args {
    /// Allocator-level trace: .mtrace, .jsonl (e.g. from `memtrace_trainer symtrace`), or a
    /// snapshot .pickle.
    file: PathBuf,
    /// Allocator configuration in PYTORCH_CUDA_ALLOC_CONF syntax; overrides what the trace recorded.
    #[arg(long, value_name = "STR")]
    alloc_conf: Option<String>,
    /// Device memory the allocator may use (e.g. 40GiB). Default: the profile's total memory minus
    /// its context; unlimited without a profile.
    #[arg(long, value_parser = parse_size, value_name = "SIZE")]
    capacity: Option<u64>,
    /// GPU profile: a name in profiles/ (e.g. a100-40gb) or a path to a .toml file.
    #[arg(long, value_name = "NAME")]
    profile: Option<String>,
    /// PyTorch version whose allocator rules apply (2.4, 2.5, 2.9 or later). Default: the
    /// profile's, else the newest.
    #[arg(long, value_name = "VER")]
    torch: Option<String>,
    /// Print a JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// Resolve version and capacity from flags and profile.
pub fn options(
    alloc_conf: Option<String>,
    capacity: Option<u64>,
    profile: Option<&str>,
    torch: Option<&str>,
) -> Result<(ReplayOptions, Option<Profile>)> {
    let profile = match profile {
        Some(p) => Some(Profile::load(p)?.0),
        None => None,
    };
    let version: TorchVersion = match (torch, &profile) {
        (Some(t), _) => t.parse().with_context(|| "--torch")?,
        (None, Some(p)) => p.software.allocator.parse().with_context(|| "profile software.allocator")?,
        (None, None) => TorchVersion::default(),
    };
    let capacity = capacity.or_else(|| {
        profile.as_ref().map(|p| p.gpu.total_memory.saturating_sub(p.outside_allocator_bytes(false, false)))
    });
    Ok((ReplayOptions { alloc_conf, version, capacity }, profile))
}

/// Replay a file.
pub fn replay_file(file: &std::path::Path, opts: ReplayOptions) -> Result<ReplayReport> {
    let read = crate::input::for_each_record(
        file,
        |h| Replayer::new(h, opts).with_context(|| format!("{}: cannot replay", file.display())),
        |rp, r| {
            rp.observe(r);
            Ok(())
        },
    )?;
    Ok(read.state.finish())
}

pub fn run(a: Args) -> Result<ExitCode> {
    let (opts, _) = options(a.alloc_conf, a.capacity, a.profile.as_deref(), a.torch.as_deref())?;
    let version = opts.version;
    let r = replay_file(&a.file, opts)?;
    if a.json {
        let mut v = serde_json::to_value(&r)?;
        v["file"] = a.file.display().to_string().into();
        v["torch_allocator_version"] = version.to_string().into();
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{}: replayed {} requests of {} records (allocator rules {version})",
        a.file.display(),
        r.requests,
        r.events
    );
    if let Some(c) = &r.alloc_conf {
        println!("  alloc conf          {c}");
    }
    println!("  peak reserved       {} ({} B)", mib(r.peak_reserved_bytes), r.peak_reserved_bytes);
    println!("  peak allocated      {} ({} B)", mib(r.peak_allocated_bytes), r.peak_allocated_bytes);
    println!("  peak active         {}", mib(r.peak_active_bytes));
    println!("  peak requested      {}", mib(r.peak_requested_bytes));
    for d in &r.devices {
        println!(
            "  device {}: at peak reserved: {} segments, {} reserved but not allocated, largest free block {}",
            d.device,
            d.at_peak.segments,
            mib(d.at_peak.reserved_minus_allocated),
            mib(d.at_peak.largest_free_block)
        );
        if !d.categories_at_peak.is_empty() {
            println!("  device {}: allocated at its peak, by category:", d.device);
            for (k, v) in &d.categories_at_peak {
                if *v > 0 {
                    println!("    {k:<16} {}", mib(*v));
                }
            }
        }
    }
    match (r.capacity, r.oom_at_event) {
        (Some(c), Some(i)) => println!(
            "  OOM at capacity {}: first failure at record {i}: {}",
            mib(c),
            r.oom_detail.as_deref().unwrap_or("")
        ),
        (Some(c), None) => println!("  fits in capacity {}", mib(c)),
        (None, _) => println!("  capacity unlimited (give --capacity or --profile to check OOM)"),
    }
    for (m, n) in &r.skipped_by_caller {
        println!("  left out: {n} requests made by {m} (outside the caching allocator)");
    }
    if r.skipped_failed_calls > 0 {
        println!("  left out: {} failed calls recorded in the trace", r.skipped_failed_calls);
    }
    if r.rejected > 0 {
        println!("  WARNING: {} requests rejected by the model, e.g.:", r.rejected);
        for e in &r.rejected_examples {
            println!("    {e}");
        }
    }
    Ok(ExitCode::SUCCESS)
}
