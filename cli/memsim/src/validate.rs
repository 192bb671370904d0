//! `memsim validate SNAPSHOT [--capacity SIZE] [--torch VER] [--alloc-conf STR] [--json]`.

use std::path::PathBuf;

use anyhow::{Context, Result};
use simulator::alloc::TorchVersion;
use simulator::snapshot::{read_snapshot, validate, Action, ValidateOptions, Verdict};
use simulator::units::{mib, parse_capacity};

/// Arguments of `memsim validate`.
#[derive(clap::Args)]
pub struct Args {
    /// A PyTorch memory snapshot (`torch.cuda.memory._dump_snapshot`), .pickle or .pkl. Works from
    /// the pickle itself: its final `segments` are needed to rebuild the starting state.
    snapshot: PathBuf,
    /// Device capacity: predict `segment_free`/`segment_unmap` bursts with the OOM chain instead of
    /// replaying each recorded burst as an `empty_cache`.
    #[arg(long, value_parser = parse_capacity, value_name = "SIZE", allow_negative_numbers = true)]
    capacity: Option<u64>,
    /// PyTorch version whose rules apply (default: guessed from the snapshot's settings).
    #[arg(long, value_name = "VER")]
    torch: Option<String>,
    /// Allocator configuration overriding the snapshot's recorded settings.
    #[arg(long, value_name = "STR")]
    alloc_conf: Option<String>,
    /// Print a JSON object instead of text.
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args) -> Result<u8> {
    crate::input::exists(&a.snapshot)?;
    // It checks the model against what a snapshot recorded; a trace records no placement.
    if matches!(crate::input::kind(&a.snapshot), Ok(crate::input::Kind::Trace)) {
        // Named as a trace: said as one only if it reads as one (a renamed snapshot, a
        // folder). A stream is not opened: that waits for a writer, and reads what it sends.
        if !crate::input::streamed(&a.snapshot) {
            trace::Reader::open(&a.snapshot).map_err(|e| {
                anyhow::Error::from(e).context(format!(
                    "{}: named as a trace, and cannot be read as one: validate reads a PyTorch memory snapshot \
                     (.pickle/.pkl)",
                    a.snapshot.display()
                ))
            })?;
        }
        anyhow::bail!(
            "{}: a trace, not a snapshot: validate compares the model's addresses with those a PyTorch memory \
             snapshot (.pickle/.pkl) recorded; replay a trace with `memsim replay`",
            a.snapshot.display()
        );
    }
    let version: Option<TorchVersion> = a.torch.as_deref().map(str::parse).transpose().context("--torch")?;
    let snap = read_snapshot(&a.snapshot)?;
    let opts = ValidateOptions { capacity: a.capacity, version, alloc_conf: a.alloc_conf };
    let mut r = validate(&snap, &opts).with_context(|| format!("{}: validation", a.snapshot.display()))?;
    if let Some(c) = r.capacity.filter(|c| *c < r.recorded_peak_reserved_bytes) {
        // The run held more than that at once, so it did not run on such a device: there is
        // no run of that capacity to validate against.
        anyhow::bail!(
            "--capacity {}: below the run's recorded peak reserved ({}{}), so the run did not run on a device of \
             this capacity; give the capacity of the GPU it ran on (or leave it out)",
            mib(c),
            mib(r.recorded_peak_reserved_bytes),
            if r.devices.len() > 1 { ", its largest device's" } else { "" }
        );
    }
    if r.nothing_compared && r.counts.segment_event_matches < r.counts.segment_events {
        // The model replays allocations: with none, it predicted no segment event but the
        // releases it replays as `empty_cache`, and no verdict on it can be drawn from the rest.
        anyhow::bail!(
            "{}: the snapshot records {} segment events but no allocation (no `alloc` entry), so the model had \
             nothing to replay and predicted {} of them (releases it replays as empty_cache): there is nothing \
             to validate it against (a snapshot of segment events alone, such as one written from a trace that \
             records no allocator-level request)",
            a.snapshot.display(),
            r.counts.segment_events,
            r.counts.segment_event_matches
        );
    }
    let more = capacity_warnings(&snap, &r);
    r.warnings.extend(more);
    crate::input::warn(&r.warnings);
    let code = if r.passed() { 0u8 } else { 1u8 };
    // From here, nothing compared means no allocation to place (events of other kinds may be
    // there): "exact", vacuously.
    let nothing = r.nothing_compared;
    let entries: usize = snap.device_traces.iter().map(Vec::len).sum();
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(code);
    }
    let pct = |m: u64, n: u64| if n == 0 { "-".to_string() } else { format!("{:.2}%", 100.0 * m as f64 / n as f64) };
    println!("{} (allocator rules {})", a.snapshot.display(), r.torch_version);
    let conf = alloc_conf_line(r.alloc_conf.as_deref(), r.alloc_conf_source, None);
    println!("  alloc conf        {}", crate::exit::printable(&conf));
    println!(
        "  block addresses   {}/{} match ({})",
        r.counts.alloc_addr_matches,
        r.counts.allocs,
        pct(r.counts.alloc_addr_matches, r.counts.allocs)
    );
    println!(
        "  segment events    {}/{} match ({}), {} predicted that were not recorded",
        r.counts.segment_event_matches,
        r.counts.segment_events,
        pct(r.counts.segment_event_matches, r.counts.segment_events),
        r.counts.extra_predicted_segment_events
    );
    println!(
        "  peak reserved     recorded {}, predicted {}{}",
        mib(r.recorded_peak_reserved_bytes),
        mib(r.predicted_peak_reserved_bytes),
        if r.devices.len() > 1 { " (the largest device's)" } else { "" }
    );
    if r.empty_cache_bursts > 0 {
        println!(
            "  {} recorded segment_free/segment_unmap bursts replayed as empty_cache() \
             (they come from empty_cache or the OOM retry path; give --capacity to predict them)",
            r.empty_cache_bursts
        );
    }
    for u in r.unrecoverable.iter().take(5) {
        println!("  unrecoverable: {}", crate::exit::printable(&u.to_string()));
    }
    if r.unrecoverable.len() > 5 {
        println!("  ... and {} more unrecoverable start-state items (--json lists all)", r.unrecoverable.len() - 5);
    }
    for d in &r.devices {
        for m in d.first_mismatches.iter().take(3) {
            println!(
                "  device {} entry {}: {} of {} B on stream {}: recorded {:#x}, predicted {}",
                d.device,
                m.entry,
                m.action,
                m.size,
                m.stream,
                m.recorded_addr,
                m.predicted_addr.map_or("nothing".to_string(), |p| format!("{p:#x}"))
            );
        }
    }
    let mismatch = mismatch_words(&r);
    println!(
        "  verdict           {}",
        match r.verdict {
            // Nothing was compared: say so, not that everything matched.
            Verdict::Exact if nothing && entries == 0 => {
                "EXACT, but vacuously: the snapshot records no allocator events (only its segments), so \
                 nothing was compared beyond loading its state"
                    .to_string()
            }
            Verdict::Exact if nothing => format!(
                "EXACT, but vacuously: the snapshot records {entries} allocator event{} and no allocation among \
                 them (frees, segment events or markers only), so no address was compared; its state was loaded \
                 and its events replayed",
                if entries == 1 { "" } else { "s" }
            ),
            Verdict::Exact => "EXACT: every address and segment event matches".to_string(),
            Verdict::ExplainedByStartState => "mismatches explained by the unrecoverable start state".to_string(),
            Verdict::Mismatch => mismatch,
        }
    );
    Ok(code)
}

/// What a MISMATCH verdict rests on, from the numbers printed beside it: a snapshot at odds with
/// itself and entries the model could not replay are said as such (they are no placement the
/// start state failed to explain), then allocations placed elsewhere.
fn mismatch_words(r: &simulator::snapshot::ValidationReport) -> String {
    let mut why = Vec::new();
    let inconsistent: Vec<_> = r.unrecoverable.iter().filter(|u| u.inconsistent).collect();
    if let Some(first) = inconsistent.first() {
        why.push(format!(
            "the snapshot is inconsistent with itself: {} of its entries contradict its own final segments (the \
             first: {first}), which no start state can explain",
            inconsistent.len()
        ));
    }
    let errors: usize = r.devices.iter().map(|d| d.replay_errors.len()).sum();
    let first_error =
        r.devices.iter().find_map(|d| d.replay_errors.first().map(|e| format!("device {}, {e}", d.device)));
    if let Some(e) = first_error {
        why.push(format!("{errors} of its entries could not be replayed (the first: {e})"));
    }
    if r.nothing_compared && !why.is_empty() {
        why.push("there is no allocation to compare (the snapshot records no `alloc` entry)".into());
    }
    let unexplained: u64 = r.devices.iter().map(|d| d.unexplained_mismatches).sum();
    let placed = if unexplained > 0 && !r.unrecoverable.is_empty() {
        format!(
            ": {unexplained} allocations placed elsewhere, neither address in a start segment holding an \
             unrecoverable block"
        )
    } else {
        String::new()
    };
    let c = r.counts;
    let differ = c.alloc_addr_matches < c.allocs
        || c.segment_event_matches < c.segment_events
        || c.extra_predicted_segment_events > 0;
    match (why.is_empty(), differ) {
        (true, _) => format!("MISMATCH beyond what the start state explains{placed}"),
        (false, false) => format!("MISMATCH: {}", why.join("; ")),
        (false, true) => format!("MISMATCH: {}; and addresses or segment events differ{placed}", why.join("; ")),
    }
}

/// What a `--capacity` cannot do here: the snapshot records no release of cached memory for it
/// to predict.
fn capacity_warnings(snap: &simulator::snapshot::Snapshot, r: &simulator::snapshot::ValidationReport) -> Vec<String> {
    if r.capacity.is_none() {
        return Vec::new();
    }
    let mut w = Vec::new();
    let releases = snap
        .device_traces
        .iter()
        .flatten()
        .filter(|e| matches!(e.action, Action::SegmentFree | Action::SegmentUnmap))
        .count();
    if releases == 0 {
        w.push(
            "--capacity has nothing to predict: the snapshot records no segment_free/segment_unmap (a release \
             the model predicts at it is a mismatch)"
                .into(),
        );
    }
    w
}

/// What allocator configuration a replay followed, and where it came from when not recorded.
pub fn alloc_conf_line(shown: Option<&str>, source: simulator::alloc::ConfigSource, note: Option<&str>) -> String {
    use simulator::alloc::ConfigSource;
    let line: String = match (source, shown) {
        (ConfigSource::Override, Some("")) => "(none set: PyTorch's defaults; from --alloc-conf)".into(),
        (ConfigSource::Override, Some(c)) => format!("{c} (from --alloc-conf)"),
        (ConfigSource::Default, _) => "(none recorded: PyTorch's defaults)".into(),
        (_, Some("")) => "(none set: PyTorch's defaults)".into(),
        (_, Some(c)) => c.to_string(),
        (_, None) => "(the snapshot's recorded allocator_settings fields)".into(),
    };
    match note {
        Some(n) => format!("{line} ({n})"),
        None => line,
    }
}
