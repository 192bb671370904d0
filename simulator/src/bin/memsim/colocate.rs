//! `memsim colocate A B [C...] [--profile NAME] [--capacity 80GiB] [--context 500MiB] [--align start|worst] [--json]`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Result};
use simulator::colocate::{colocate, Align, Job};
use simulator::units::{mib, parse_size};

/// Arguments of `memsim colocate`.
#[derive(clap::Args)]
pub struct Args {
    /// Allocator-level traces of the jobs (two or more to share; one gives its own fit).
    #[arg(required = true, num_args = 1..)]
    traces: Vec<PathBuf>,
    /// GPU profile: capacity and per-process context come from it unless given.
    #[arg(long, value_name = "NAME")]
    profile: Option<String>,
    /// GPU memory, e.g. 80GiB. Default: the profile's total memory.
    #[arg(long, value_parser = parse_size, value_name = "SIZE")]
    capacity: Option<u64>,
    /// Memory each process holds outside the allocator, e.g. 500MiB. Default: from the profile,
    /// the context plus cuBLAS/cuDNN for the libraries each trace says its job loads.
    #[arg(long, value_parser = parse_size, value_name = "SIZE")]
    context: Option<u64>,
    /// `start`: one time axis from the traces' starts; `worst`: the peaks coincide.
    #[arg(long, value_enum, default_value = "start")]
    align: Align,
    /// PyTorch allocator rules (2.4, 2.5, 2.9+). Default: the profile's, else the newest.
    #[arg(long, value_name = "VER")]
    torch: Option<String>,
    /// Print a JSON object instead of text.
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args) -> Result<ExitCode> {
    let (mut opts, profile) = crate::replay::options(None, None, a.profile.as_deref(), a.torch.as_deref())?;
    opts.capacity = None;
    let capacity = a.capacity.or(profile.as_ref().map(|p| p.gpu.total_memory));
    // Memory outside the allocator, per process: --context, else the profile's context plus its
    // cuBLAS/cuDNN terms for the libraries the trace says the job loads (symbolic traces record
    // `uses_gemm`/`uses_conv`; without them only the context is counted, and we say so).
    let context_of = |h: &trace::Header| -> u64 {
        match (a.context, &profile) {
            (Some(c), _) => c,
            (None, Some(p)) => {
                let flag = |k: &str| h.meta(k) == Some("true");
                if h.meta("uses_gemm").is_none() {
                    eprintln!(
                        "note: the trace does not say which CUDA libraries the job loads; counting the \
                         profile's context only (give --context to set it)"
                    );
                }
                p.outside_allocator_bytes(flag("uses_gemm"), flag("uses_conv"))
            }
            (None, None) => 0,
        }
    };
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
        let context = context_of(&read.header);
        jobs.push(Job { name: t.display().to_string(), header: read.header, records: read.state, context });
    }
    if jobs.is_empty() {
        bail!("give at least one trace");
    }
    let r = colocate(&jobs, &opts, capacity, a.align)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(if r.fits { ExitCode::SUCCESS } else { ExitCode::from(1) });
    }
    for j in &r.jobs {
        let oom = match (j.oom, j.oom_at_event) {
            (true, Some(i)) => format!("  OOM at its record {i}"),
            (true, None) => "  does not fit".to_string(),
            _ => String::new(),
        };
        println!(
            "  {:<40} peak reserved {:>12} + context {:>10}{oom}",
            j.name,
            mib(j.peak_reserved_bytes),
            mib(j.context_bytes)
        );
    }
    let when = r
        .combined_peak_at_us
        .map(|t| {
            if r.timestamps {
                format!(" at {:.6} s after the common start", t / 1e6)
            } else {
                format!(" at step {t} of the merged event order (no wall-clock timestamps in the traces)")
            }
        })
        .unwrap_or_else(|| " (peaks assumed to coincide)".to_string());
    println!("combined peak        {}{when}", mib(r.combined_peak_bytes));
    println!("smallest capacity    {}", mib(r.smallest_fitting_capacity));
    match r.capacity {
        Some(c) if r.fits => println!("verdict              FITS in {}", mib(c)),
        Some(c) => println!("verdict              DOES NOT FIT in {}", mib(c)),
        None => println!("verdict              no capacity given (use --capacity or --profile)"),
    }
    // Exit status 1 means "does not fit", so scripts can branch on it.
    Ok(if r.fits { ExitCode::SUCCESS } else { ExitCode::from(1) })
}
