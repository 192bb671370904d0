//! `memsim stats FILE... [--json]`.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use simulator::stats::{CuptiMemoryStats, TraceStats};
use simulator::units::{mib, mib_and_bytes};
use simulator::utilization::{ScopeMetrics, Source, Timing, UtilOptions, UtilizationBuilder, UtilizationReport};

use crate::batch::{self, outln, Output};

/// Arguments of `memsim stats`.
#[derive(clap::Args)]
#[command(after_help = "Several files are summarised at once, one per core, and reported in the order given \
(with --json, a JSON array; a file that fails is an element {\"file\", \"error\"} and makes the exit \
status 2).")]
pub struct Args {
    /// Traces to summarise (.mtrace, .jsonl or snapshot .pickle; `-`: a trace on standard input). Several
    /// are read in parallel.
    #[arg(required = true, value_name = "FILE")]
    files: Vec<PathBuf>,
    /// Print a JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// SM count for SM activity when the trace header has none.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..), allow_negative_numbers = true)]
    sm_count: Option<u32>,
    /// GPU profile (profiles/NAME.toml or a path) supplying SM count and compute capability
    /// when the trace header has none; `--sm-count` wins over it.
    #[arg(long, value_name = "NAME")]
    profile: Option<String>,
    /// Kernel names listed under top kernels, per run and per phase [default: 10].
    #[arg(long, value_name = "N")]
    top: Option<usize>,
    #[arg(long, help = crate::input::STRICT_HELP)]
    strict: bool,
}

/// What `peak_live_device_bytes` counts, printed beside it.
const PEAK_COUNTS: &str = "bytes of device allocations this trace records, alive at once, on all its devices \
     together; blocks allocated before the trace began are not known, so on a converted snapshot it can differ \
     from replay's peak allocated, which also counts the rebuilt start state (and is per device)";

fn util_options(a: &Args) -> Result<UtilOptions> {
    let mut o = UtilOptions { sm_count: a.sm_count, compute_capability: None, top: a.top.unwrap_or(10) };
    if let Some(name) = &a.profile {
        let (p, _) = simulator::profile::Profile::load(name).with_context(|| format!("--profile {name}"))?;
        o.sm_count = o.sm_count.or(Some(p.gpu.sm_count));
        let [major, minor] = p.gpu.compute_capability;
        o.compute_capability = Some((major, minor));
    }
    Ok(o)
}

pub fn run(a: Args) -> Result<u8> {
    let opts = util_options(&a)?;
    batch::run(&a.files, a.json, |file| stats_one(&a, file, opts))
}

/// `--sm-count` and `--profile` only stand in for device facts the SM activity needs and the
/// header lacks: said when a file needs neither; `--top` is said when there is no kernel.
fn device_flags_without_effect(a: &Args, s: &TraceStats, util: &UtilizationReport) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(n) = a.top.filter(|_| s.kernel_launches == 0 && s.kernel_exec_records == 0) {
        out.push(format!("--top {n} has no effect: the trace records no kernel launch to list"));
    }
    let flags: Vec<String> =
        [a.sm_count.map(|n| format!("--sm-count {n}")), a.profile.as_ref().map(|p| format!("--profile {p}"))]
            .into_iter()
            .flatten()
            .collect();
    if flags.is_empty() {
        return out;
    }
    if s.kernel_launches == 0 && s.kernel_exec_records == 0 {
        out.push(format!(
            "{} {} no effect: the trace records no kernel launch, so there is no SM activity to compute",
            flags.join(" and "),
            if flags.len() == 1 { "has" } else { "have" }
        ));
        return out;
    }
    if let (Some(n), Some(Source::Header)) = (a.sm_count, util.sm_count_source) {
        let recorded = util.sm_count.map_or_else(|| "its".to_string(), |m| m.to_string());
        out.push(format!("--sm-count {n} has no effect: the trace header records the GPU's {recorded} SMs"));
    }
    let fallback = |src: Option<Source>| src == Some(Source::Fallback);
    let profile_sm = a.sm_count.is_none() && fallback(util.sm_count_source);
    if let (Some(p), false) = (&a.profile, profile_sm || fallback(util.compute_capability_source)) {
        let sm = if a.sm_count.is_some() {
            "--sm-count wins over its SM count"
        } else {
            "the trace header records the SM count"
        };
        out.push(format!("--profile {p} has no effect: {sm}, and the header records the compute capability"));
    }
    out
}

/// One file's summary, rendered.
fn stats_one(a: &Args, file: &Path, opts: UtilOptions) -> Result<Output> {
    let read = crate::input::for_each_record(
        file,
        |h| Ok((TraceStats::new(h), UtilizationBuilder::new(h, opts), UnknownFrees::new(h))),
        |(s, u, frees), r| {
            let before = s.unknown_frees;
            s.observe(r);
            u.observe(r);
            frees.observe(r, s.unknown_frees > before);
            Ok(())
        },
    )?;
    let mut warnings = read.warnings(file, a.strict)?;
    let header = read.header;
    let (s, u, frees) = read.state;
    let s = s.finish(read.summary.as_ref());
    let util = u.finish();
    warnings.extend(frees.warning(file));
    warnings.extend(device_flags_without_effect(a, &s, &util));
    let mut out = Output::new(warnings.clone());
    if a.json {
        let mut v = serde_json::to_value(&s)?;
        v["utilization"] = serde_json::to_value(&util)?;
        v["file"] = file.display().to_string().into();
        v["level"] = serde_json::to_value(header.level)?;
        v["producer"] = header.producer.name.clone().into();
        v["peak_live_device_counts"] = PEAK_COUNTS.into();
        v["warnings"] = serde_json::to_value(&warnings)?;
        out.json = Some(v);
        return Ok(out);
    }
    outln!(
        out,
        "{}: {} trace by {} {}",
        crate::input::shown(file),
        level(&header),
        header.producer.name,
        header.producer.version
    );
    outln!(out, "  events            {}", s.events);
    for (k, n) in &s.kinds {
        outln!(out, "    {k:<16} {n}");
    }
    outln!(out, "  calls");
    for (k, n) in &s.calls {
        let failed = s.failed_calls.get(k).map(|f| format!(" ({f} failed)")).unwrap_or_default();
        outln!(out, "    {k:<32} {n}{failed}");
    }
    outln!(out, "  device allocs     {} (frees {})", s.allocs, s.frees);
    outln!(out, "  host allocs       {} (frees {})", s.host_allocs, s.host_frees);
    // Several GPUs' bytes in one number read as one device holding them all: said. (The devices
    // the trace lists, not all of them used: a snapshot lists every visible one.)
    let summed = if header.devices.len() > 1 { ", summed over the trace's devices" } else { "" };
    outln!(out, "  peak live device  {}", mib_and_bytes(s.peak_live_device_bytes, summed));
    outln!(out, "    (counts {PEAK_COUNTS})");
    if s.start_state_allocated_bytes > 0 {
        outln!(
            out,
            "  allocated before  {} in blocks alive when the trace began (start state): not in the peak above; \
             replay's peak allocated counts them",
            mib(s.start_state_allocated_bytes)
        );
    }
    outln!(out, "  kernel launches   {} ({} graph launches)", s.kernel_launches, s.graph_launches);
    match s.kernel_busy_ns {
        Some(busy) => {
            outln!(out, "  kernel busy time  {:.3} ms over {} CUPTI records", busy as f64 / 1e6, s.kernel_exec_records)
        }
        None if s.kernel_launches > 0 => {
            outln!(out, "  kernel timing     none: record with MEMTRACE_CUPTI=1 for execution times")
        }
        None => {}
    }
    if let Some(c) = &s.cupti_memory {
        print_cupti_memory(&mut out, c);
    }
    print_utilization(&mut out, &util);
    if s.lost_events > 0 {
        outln!(out, "  LOST EVENTS       {} (the producer's queue was full)", s.lost_events);
    }
    if s.unknown_frees > 0 {
        outln!(out, "  unknown frees     {} ({})", s.unknown_frees, frees.explained());
    }
    if s.allocs_over_live > 0 {
        outln!(
            out,
            "  allocs over live  {} (allocations at an address whose block the trace never freed: the earlier \
             blocks stay counted live, as replay keeps them)",
            s.allocs_over_live
        );
    }
    if s.unknown_events_skipped > 0 {
        outln!(out, "  skipped           {} events of kinds this memsim does not know", s.unknown_events_skipped);
    }
    if s.truncated {
        outln!(out, "  TRUNCATED: the trace ends mid-event (process killed?); everything before was read");
    } else if let Some(limit) = s.byte_limit {
        outln!(
            out,
            "  INCOMPLETE: recording stopped at the byte limit (MEMTRACE_MAX_BYTES={limit}); what the run did after \
             was not recorded"
        );
    } else if !s.complete && header.producer.name == "libmemtrace" {
        outln!(out, "  incomplete: no process_exit event (the process did not exit through the shim's handlers)");
    }
    Ok(out)
}

/// The frees [`TraceStats`] finds no live block for (a free of address 0, a no-op, is none), told
/// apart: a block alive when the trace began (a converted snapshot's start state, which the trace
/// does not allocate); in an allocator-level trace, one of the allocator's own frees of an address
/// no block of the trace holds (freed twice, or never allocated), which `memsim replay` rejects
/// as a damaged trace's; any other (a device-level trace's: the shim may have begun after the
/// allocation, and replay reads such a trace only with the cache off, or never).
#[derive(Default)]
struct UnknownFrees {
    /// An allocator-level trace: every allocator free is in it, and replay reads it.
    allocator_level: bool,
    /// Which frees replay applies: its own rule, so that what this calls damaged is what it rejects.
    requests: simulator::replay::Requests,
    /// Records read.
    records: u64,
    /// The start state's allocated blocks not freed yet, by device and address.
    start: std::collections::HashSet<(u32, u64)>,
    /// Frees of start-state blocks.
    of_start: u64,
    /// The allocator's frees of addresses no block holds, in an allocator-level trace.
    damaged: u64,
    /// The first of those: record number, device and address.
    first: Option<(u64, u32, u64)>,
    /// Any other: frees of addresses allocated before the trace began (or by calls it missed).
    before: u64,
}

impl UnknownFrees {
    fn new(h: &trace::Header) -> UnknownFrees {
        UnknownFrees {
            allocator_level: h.level == trace::Level::Allocator,
            requests: simulator::replay::Requests::new(h),
            ..UnknownFrees::default()
        }
    }

    /// Note record `r`; `unknown`: [`TraceStats`] found no live block for it (a free).
    fn observe(&mut self, r: &trace::Record, unknown: bool) {
        let device = r.device.unwrap_or(0);
        match &r.event {
            trace::Event::SegmentState(st) if st.at == trace::StateAt::Start => {
                let held = st.blocks.iter().filter(|b| b.state != trace::BlockState::Inactive);
                self.start.extend(held.map(|b| (device, b.addr)));
            }
            trace::Event::Name(n) => self.requests.name(n.id, n.text.clone()),
            trace::Event::Free(f) if unknown => {
                if f.mem.is_device() && self.start.remove(&(device, f.addr)) {
                    self.of_start += 1;
                } else if self.allocator_level && self.requests.applies(f.origin, f.mem, f.caller, f.result) {
                    // Its model refuses it: no live block starts there.
                    self.damaged += 1;
                    self.first.get_or_insert((self.records, device, f.addr));
                } else {
                    self.before += 1;
                }
            }
            _ => {}
        }
        self.records += 1;
    }

    /// What the unknown frees were, for the text line.
    fn explained(&self) -> String {
        const START: &str = "blocks allocated before the trace began, its start state";
        const DAMAGED: &str = "freed twice or never allocated: a damaged trace; see the warning";
        const BEFORE: &str = "addresses allocated before the trace began";
        match (self.of_start, self.damaged, self.before) {
            (_, 0, 0) => format!("frees of {START}"),
            (0, _, 0) => DAMAGED.into(),
            (0, 0, _) => format!("frees of {BEFORE}"),
            (start, damaged, before) => [(start, "of ", START), (damaged, "", DAMAGED), (before, "of ", BEFORE)]
                .iter()
                .filter(|(n, _, _)| *n > 0)
                .map(|(n, of, what)| format!("{n} {of}{what}"))
                .collect::<Vec<_>>()
                .join("; "),
        }
    }

    /// The warning of the allocator's frees no block holds, naming `file` and the first.
    fn warning(&self, file: &Path) -> Option<String> {
        let (record, device, addr) = self.first?;
        let frees = if self.damaged == 1 { "free of an address" } else { "frees of addresses" };
        Some(format!(
            "{}: {} {frees} no allocation in the trace holds (freed twice, or never allocated: a damaged \
             trace), e.g. record {record} (device {device}): free of unknown address {addr:#x}; live bytes leave \
             them out, and replay rejects them (left out of its replay, and counted in its warning)",
            file.display(),
            self.damaged
        ))
    }
}

fn level(h: &trace::Header) -> &'static str {
    match (h.level, h.caching_disabled) {
        (trace::Level::Device, true) => "device-level (caching off: allocator level in effect)",
        (trace::Level::Device, false) => "device-level",
        (trace::Level::Allocator, _) => "allocator-level",
    }
}

fn print_cupti_memory(out: &mut Output, c: &CuptiMemoryStats) {
    let kinds: Vec<String> = c.allocations_by_kind.iter().map(|(k, n)| format!("{k} {n}")).collect();
    outln!(out, "  CUPTI memory      {} allocations ({}), {} releases", c.allocations, kinds.join(", "), c.releases);
    outln!(
        out,
        "    device bytes    {} allocated, peak live {}",
        mib(c.device_bytes_allocated),
        mib_and_bytes(c.peak_live_device_bytes, "")
    );
    outln!(
        out,
        "    cross-check     {} of {} CUPTI device allocations match a traced allocation (address and size)",
        c.device_allocations_matched,
        c.device_allocations
    );
    if c.unknown_releases > 0 {
        outln!(
            out,
            "    unknown         {} releases of addresses CUPTI reported no allocation for",
            c.unknown_releases
        );
    }
}

fn print_utilization(out: &mut Output, u: &UtilizationReport) {
    if u.timing == Timing::None {
        return;
    }
    let device = u.device.map_or_else(|| "?".to_string(), |d| d.to_string());
    let sms = u.sm_count.map_or_else(|| "unknown".to_string(), |n| format!("{n}"));
    let cc = u.compute_capability.map_or_else(|| "unknown".to_string(), |(a, b)| format!("{a}.{b}"));
    outln!(out, "  utilization       device {device} ({sms} SMs, compute capability {cc})");
    for n in &u.notes {
        outln!(out, "    note: {n}");
    }
    if !u.other_devices.is_empty() {
        let others: Vec<String> = u.other_devices.iter().map(|(d, n)| format!("device {d}: {n}")).collect();
        outln!(out, "    left out (other devices): {}", others.join(", "));
    }
    if u.invalid_kernel_records > 0 {
        outln!(out, "    left out: {} kernel records ending before they start", u.invalid_kernel_records);
    }
    if u.markers_without_time > 0 {
        outln!(out, "    {} phase markers without timestamps were ignored", u.markers_without_time);
    }
    outln!(
        out,
        "    {:<10} {:>10} {:>6} {:>6} {:>6} {:>8} {:>10} {:>10} {:>12}",
        "scope",
        "wall ms",
        "busy",
        "SMact",
        "occ",
        "kernels",
        "launch/s",
        "gap us",
        "gemm/elt/red"
    );
    print_scope(out, "run", &u.run);
    for (name, m) in &u.phases {
        print_scope(out, name, m);
    }
    if !u.run.top_kernels.is_empty() {
        outln!(out, "    top kernels (run)");
        for k in &u.run.top_kernels {
            outln!(
                out,
                "      {:>5.1}% {:>9.3} ms {:>7}x {:<11} {}",
                k.share * 100.0,
                k.total_ns as f64 / 1e6,
                k.count,
                k.class.as_str(),
                k.name
            );
        }
    }
}

fn print_scope(out: &mut Output, name: &str, m: &ScopeMetrics) {
    let pct = |x: Option<f64>| x.map_or_else(|| "-".to_string(), |v| format!("{:.1}%", v * 100.0));
    let num = |x: Option<f64>, scale: f64| x.map_or_else(|| "-".to_string(), |v| format!("{:.1}", v / scale));
    let share = m.time_share.map_or_else(
        || "-".to_string(),
        |t| format!("{:.0}/{:.0}/{:.0}%", t.gemm_conv * 100.0, t.elementwise * 100.0, t.reduction * 100.0),
    );
    let count = if m.kernels > 0 { m.kernels } else { m.launches };
    outln!(
        out,
        "    {:<10} {:>10.3} {:>6} {:>6} {:>6} {:>8} {:>10} {:>10} {:>12}",
        name,
        m.wall_ns as f64 / 1e6,
        pct(m.busy_fraction),
        pct(m.sm_activity),
        pct(m.occupancy),
        count,
        num(m.launch_rate_per_s, 1.0),
        num(m.mean_gap_ns, 1e3),
        share
    );
}
