//! `memsim convert IN OUT`: the format is chosen by each path's extension.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use simulator::perfetto::PerfettoBuilder;
use simulator::replay::{ReplayOptions, Replayer};
use trace::{ControlOp, Event, Header, Record, StateAt, TraceWriter};

use crate::input::Kind;

/// Arguments of `memsim convert`.
#[derive(clap::Args)]
pub struct Args {
    /// Input: .mtrace, .jsonl or snapshot .pickle/.pkl; `-` reads a trace from standard input.
    input: PathBuf,
    /// Output: .mtrace, .jsonl, .pickle (PyTorch memory_viz) or .json (Perfetto/Chrome trace).
    output: PathBuf,
    #[arg(long, help = crate::input::STRICT_HELP)]
    strict: bool,
}

enum Out {
    Trace,
    Pickle,
    Perfetto,
}

fn out_kind(p: &Path) -> Result<Out> {
    match p.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase).as_deref() {
        Some("mtrace") | Some("jsonl") => Ok(Out::Trace),
        Some("pickle") | Some("pkl") => Ok(Out::Pickle),
        Some("json") => Ok(Out::Perfetto),
        _ => bail!(
            "{}: unknown output format: expected .mtrace, .jsonl, .pickle (memory_viz) or .json (Perfetto)",
            p.display()
        ),
    }
}

pub fn run(a: Args) -> Result<u8> {
    let in_kind = crate::input::kind(&a.input)?;
    crate::input::exists(&a.input)?;
    let out = out_kind(&a.output)?;
    crate::input::distinct_output(&a.input, &a.output)?;
    let writing = || format!("writing {} from {}", a.output.display(), a.input.display());
    match (in_kind, out) {
        (Kind::Trace, Out::Trace) => {
            // Record by record in constant memory; the output appears only when it is whole and
            // the input accepted, so under --strict a refused input leaves the output path as it was.
            let read = crate::input::for_each_record(
                &a.input,
                |h| TraceWriter::create(&a.output, h).with_context(writing),
                |w, r| w.write(r).with_context(writing),
            )?;
            let lines = read.warnings(&a.input, a.strict)?;
            let (records, truncated) = read.summary.map_or((0, false), |s| (s.records, s.truncated));
            let carried = not_carried(&read, &a.output, Out::Trace);
            read.state.finish().with_context(writing)?;
            crate::input::warn(&lines);
            crate::input::warn(&carried);
            report(&a, records, truncated);
        }
        (Kind::Snapshot, Out::Trace) => {
            let read = read_all(&a.input, a.strict)?;
            write_trace(&a.output, &read.header, &read.state).with_context(writing)?;
            crate::input::warn(&not_carried(&read, &a.output, Out::Trace));
            report(&a, read.state.len() as u64, false);
        }
        (_, Out::Pickle) => {
            let read = read_all(&a.input, a.strict)?;
            let carried = not_carried(&read, &a.output, Out::Pickle);
            // Of the input's records: a replay's realised ones hold no marker or control call.
            let dropped = dropped_by_snapshot(&read.state, &a.output);
            let (header, mut records) = (&read.header, read.state);
            let has_end_state =
                records.iter().any(|r| matches!(&r.event, Event::SegmentState(s) if s.at == StateAt::End));
            let replay = !has_end_state && header.is_allocator_level();
            if replay {
                // Before the replay renumbers them, so that an error names the input's record.
                simulator::snapshot::check_exportable(&records).with_context(writing)?;
                // A request-only trace (e.g. symbolic): memory_viz needs segments, so show what the
                // allocator model would have done, at its addresses.
                let mut rep = Replayer::new(header, ReplayOptions::default())
                    .with_context(|| format!("{}: cannot replay", a.input.display()))?
                    .realize();
                records.iter().for_each(|r| rep.observe(r));
                records = rep.take_realized();
                eprintln!("{}: no recorded segments; exporting the allocator model's replay", a.input.display());
                let replayed = rep.finish();
                crate::input::warn(&export_warnings(&replayed));
            }
            let exported = if replay {
                simulator::snapshot::write_replayed_snapshot(&a.output, header, &records)
            } else {
                simulator::snapshot::write_snapshot(&a.output, header, &records)
            }
            .with_context(writing)?;
            if exported.entries == 0 && exported.segments == 0 {
                crate::input::warn(&[format!(
                    "{}: the snapshot holds no events and no segments: its input records no allocator event, so \
                     memory_viz shows nothing and `memsim replay` of it finds no allocator memory",
                    a.output.display()
                )]);
            }
            if let Some(conf) = &exported.alloc_conf_not_carried {
                crate::input::warn(&[format!(
                    "{}: the input's allocator configuration \"{conf}\" is not in the snapshot (a reader of a \
                     snapshot follows 2.5's rules, which refuse a key in it): `memsim replay` of it follows \
                     PyTorch's defaults, so its need and verdict may differ from the input's; give it \
                     `--torch 2.9 --alloc-conf '{conf}'`",
                    a.output.display()
                )]);
            }
            if exported.allocs == 0 && exported.segment_events > 0 {
                crate::input::warn(&[format!(
                    "{}: the snapshot holds {} segment events but no allocation (no `alloc` entry): memory_viz \
                     shows its segments, but `memsim validate` and `replay` have no request in it to replay (its \
                     input records no allocator-level request)",
                    a.output.display(),
                    exported.segment_events
                )]);
            }
            crate::input::warn(&carried);
            crate::input::warn(&dropped);
            report(&a, records.len() as u64, false);
            eprintln!("open it at https://pytorch.org/memory_viz (drag the file onto the page)");
        }
        (_, Out::Perfetto) => {
            let read = crate::input::for_each_record(
                &a.input,
                |h| {
                    PerfettoBuilder::new(h, ReplayOptions::default())
                        .with_context(|| format!("{}: cannot replay", a.input.display()))
                },
                |b, r| {
                    b.observe(r);
                    Ok(())
                },
            )?;
            crate::input::warn(&read.warnings(&a.input, a.strict)?);
            let carried = not_carried(&read, &a.output, Out::Perfetto);
            let v = read.state.finish(&read.header);
            trace::write_atomic(&a.output, |w| -> Result<()> { Ok(serde_json::to_writer(w, &v)?) })
                .with_context(writing)?;
            crate::input::warn(&carried);
            report(&a, 0, false);
            eprintln!("open it at https://ui.perfetto.dev (Open trace file)");
        }
    }
    Ok(0u8)
}

fn report(a: &Args, records: u64, truncated: bool) {
    let n = if records > 0 { format!("{records} records: ") } else { String::new() };
    let t = if truncated { " (input was truncated; everything before the cut was converted)" } else { "" };
    eprintln!("{n}{} -> {}{t}", a.input.display(), a.output.display());
}

/// What an output of kind `kind` cannot say of its input, which the warnings before said: that
/// it did not hold the whole run (an output that is not a trace, a memory_viz snapshot or a
/// Perfetto trace: a snapshot read back looks whole; a trace keeps what its producer wrote, its
/// end or its missing `process_exit`, except a cut inside an event, which the report line says),
/// the records of unknown kinds that were skipped, and a snapshot's caveats (a trace's header
/// and a memory_viz snapshot's kept header carry them; a Perfetto trace has no place for them).
/// memsim reads a trace or a snapshot back but not a Perfetto trace, so the words for it say what
/// its viewer shows instead.
fn not_carried<S>(read: &crate::input::Read<S>, output: &Path, kind: Out) -> Vec<String> {
    let mut lines = Vec::new();
    let out = output.display();
    let unsaid = match kind {
        Out::Perfetto => "opened in Perfetto, its timeline shows no sign of them",
        Out::Trace | Out::Pickle => "read back, it gives no warning of them",
    };
    if let Some(s) = &read.summary {
        if s.incomplete() && !matches!(kind, Out::Trace) {
            let looks = match kind {
                Out::Perfetto => "opened in Perfetto, its timeline looks like the whole run",
                Out::Trace | Out::Pickle => "read back, it looks whole",
            };
            lines.push(format!("{out}: the output does not record that its input is incomplete (see above): {looks}"));
        }
        if s.unknown_skipped > 0 {
            lines.push(format!(
                "{out}: the {} records of kinds this version does not know are not in the output, which does not say \
                 they were left out: {unsaid}",
                s.unknown_skipped
            ));
        }
        if s.unread_fields() {
            lines.push(format!(
                "{out}: the fields this version does not read (see above) are not in the output, which does not say \
                 they were left out: {unsaid}"
            ));
        }
    }
    if !simulator::snapshot::Caveats::of(&read.header).lines.is_empty() && matches!(kind, Out::Perfetto) {
        lines.push(format!(
            "{out}: the output does not carry the snapshot's caveats above (a Perfetto trace has no place for them): \
             opened in Perfetto, its timeline shows no sign of them; keep the snapshot, or a trace converted from it, \
             for them"
        ));
    }
    lines
}

/// What a memory_viz snapshot has no place for, counted in the input: the allocations'
/// categories (the breakdown at the peak), the markers (the per-step peaks) and the program's
/// memory fractions (PyTorch's `allocator_settings` report none, and its trace has no entry for a
/// call). Replayed from the snapshot, all are gone; a fraction changes the need itself.
fn dropped_by_snapshot(records: &[Record], output: &Path) -> Vec<String> {
    let categorized = records.iter().filter(|r| matches!(&r.event, Event::Alloc(a) if a.category.is_some())).count();
    let markers = records.iter().filter(|r| matches!(r.event, Event::Marker(_))).count();
    let fractions = records
        .iter()
        .filter(|r| matches!(&r.event, Event::Control(c) if matches!(c.op, ControlOp::SetMemoryFraction { .. })))
        .count();
    let mut lines = Vec::new();
    if categorized > 0 || markers > 0 {
        lines.push(format!(
            "{}: a memory_viz snapshot keeps no allocation category and no marker: {categorized} categorized \
             allocations and {markers} markers are not in it, so `memsim replay` of it has no breakdown by category \
             and no per-step peaks (keep the .mtrace or .jsonl for those)",
            output.display()
        ));
    }
    if fractions > 0 {
        lines.push(format!(
            "{}: a memory_viz snapshot has no place for a memory fraction: the {fractions} \
             set_per_process_memory_fraction calls (`set_memory_fraction` records) are not in it, so `memsim replay` \
             of it follows no fraction and its need and verdict may differ from the input's (keep the .mtrace or \
             .jsonl to judge a fit)",
            output.display()
        ));
    }
    lines
}

/// Every record of `path` in memory, its warnings printed (an error under `strict` when the
/// input does not hold the whole run).
fn read_all(path: &Path, strict: bool) -> Result<crate::input::Read<Vec<Record>>> {
    let read = crate::input::for_each_record(
        path,
        |_| Ok(Vec::new()),
        |v, r| {
            v.push(r.clone());
            Ok(())
        },
    )?;
    crate::input::warn(&read.warnings(path, strict)?);
    Ok(read)
}

fn write_trace(path: &Path, header: &Header, records: &[Record]) -> Result<()> {
    let mut w = TraceWriter::create(path, header)?;
    for r in records {
        w.write(r)?;
    }
    w.finish()?;
    Ok(())
}

/// What an export of the model's replay leaves out or could not place, which the snapshot
/// itself does not show.
fn export_warnings(r: &simulator::replay::ReplayReport) -> Vec<String> {
    let mut w = Vec::new();
    if r.rejected > 0 {
        w.push(format!(
            "{} requests rejected by the model are not in the snapshot, e.g.: {}",
            r.rejected,
            r.rejected_examples.join("; ")
        ));
    }
    if r.recorded_outside_bytes > 0 {
        w.push(format!(
            "the device memory the trace held outside the caching allocator (VMM handles, managed memory, other \
             modules' requests), up to {}, is not in the snapshot, which shows the allocator's segments only",
            simulator::units::bytes_text(r.recorded_outside_bytes)
        ));
    }
    if let Some(d) = &r.first_oom.oom_detail {
        w.push(format!("an allocation failed in the model's replay and is not in the snapshot: {d}"));
    }
    w.extend(r.recorded_oom.map(|o| o.warning()));
    w
}
