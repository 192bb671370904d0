//! `memsim stats FILE [--json]`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use simulator::stats::TraceStats;
use simulator::units::mib;

/// Arguments of `memsim stats`.
#[derive(clap::Args)]
pub struct Args {
    /// Trace to summarise (.mtrace, .jsonl or snapshot .pickle).
    file: PathBuf,
    /// Print a JSON object instead of text.
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args) -> Result<ExitCode> {
    let read = crate::input::for_each_record(
        &a.file,
        |h| Ok(TraceStats::new(h)),
        |s, r| {
            s.observe(r);
            Ok(())
        },
    )?;
    let header = read.header;
    let s = read.state.finish(read.truncated, read.unknown_skipped);
    if a.json {
        let mut v = serde_json::to_value(&s)?;
        v["file"] = a.file.display().to_string().into();
        v["level"] = serde_json::to_value(header.level)?;
        v["producer"] = header.producer.name.clone().into();
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!("{}: {} trace by {} {}", a.file.display(), level(&header), header.producer.name, header.producer.version);
    println!("  events            {}", s.events);
    for (k, n) in &s.kinds {
        println!("    {k:<16} {n}");
    }
    println!("  calls");
    for (k, n) in &s.calls {
        let failed = s.failed_calls.get(k).map(|f| format!(" ({f} failed)")).unwrap_or_default();
        println!("    {k:<32} {n}{failed}");
    }
    println!("  device allocs     {} (frees {})", s.allocs, s.frees);
    println!("  host allocs       {} (frees {})", s.host_allocs, s.host_frees);
    println!("  peak live device  {} ({} B)", mib(s.peak_live_device_bytes), s.peak_live_device_bytes);
    println!("  kernel launches   {} ({} graph launches)", s.kernel_launches, s.graph_launches);
    match s.kernel_busy_ns {
        Some(busy) => {
            println!("  kernel busy time  {:.3} ms over {} CUPTI records", busy as f64 / 1e6, s.kernel_exec_records)
        }
        None if s.kernel_launches > 0 => {
            println!("  kernel timing     none: record with MEMTRACE_CUPTI=1 for execution times")
        }
        None => {}
    }
    if s.lost_events > 0 {
        println!("  LOST EVENTS       {} (the producer's queue was full)", s.lost_events);
    }
    if s.unknown_frees > 0 {
        println!("  unknown frees     {} (frees of addresses allocated before the trace began)", s.unknown_frees);
    }
    if s.unknown_events_skipped > 0 {
        println!("  skipped           {} events of kinds this memsim does not know", s.unknown_events_skipped);
    }
    if s.truncated {
        println!("  TRUNCATED: the trace ends mid-event (process killed?); everything before was read");
    } else if !s.complete && header.producer.name == "libmemtrace" {
        println!("  incomplete: no process_exit event (the process did not exit through the shim's handlers)");
    }
    Ok(ExitCode::SUCCESS)
}

fn level(h: &trace::Header) -> &'static str {
    match (h.level, h.caching_disabled) {
        (trace::Level::Device, true) => "device-level (caching off: allocator level in effect)",
        (trace::Level::Device, false) => "device-level",
        (trace::Level::Allocator, _) => "allocator-level",
    }
}
