//! What a replay of an imported snapshot cannot show: the one owner of those caveats. The
//! importer finds them and writes them into the trace header (`snapshot.caveats`,
//! `snapshot.state_only`), so that the trace a snapshot converts to says them wherever it is
//! read (replay, stats, report, a JSON Lines copy, a memory_viz snapshot written again), as a
//! read of the snapshot itself does.

use std::path::Path;

use trace::{metadata, Header};

use super::model::{Skipped, Snapshot, ANNOTATE, MALLOC_WITH_ADDRESS};
use super::rebuild::StartState;

/// What a read of a trace did not give whole, as warning lines naming `path`: the reader's
/// ([`trace::Summary::warnings`]: cut short, records skipped, events lost), header metadata
/// values outside their key's domain (ignored), and the caveats of the snapshot it was converted
/// from. The one list memsim and memest print (`--strict`'s refusals: `memsim_cli::input_warnings`).
pub fn input_warnings(header: &Header, summary: Option<&trace::Summary>, path: &Path) -> Vec<String> {
    let mut lines = summary.map(|s| s.warnings(path)).unwrap_or_default();
    lines.extend(header.metadata_warnings(path));
    lines.extend(Caveats::of(header).warnings(path));
    lines
}

/// A snapshot's caveats, as kept in a header.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Caveats {
    /// One line each, as memsim prints them (without the file's name).
    pub lines: Vec<String>,
    /// The snapshot records no allocator event, only its segments when it was dumped: it does
    /// not hold the run, and its peaks are only that state (what `--strict` refuses).
    pub state_only: bool,
    /// Trace entries of actions this version does not know, left out (what `--strict` refuses,
    /// as it refuses records of unknown kinds).
    pub unknown_actions: u64,
}

impl Caveats {
    /// The caveats a header carries (none for a trace that was never a snapshot).
    pub fn of(header: &Header) -> Caveats {
        let lines = header
            .meta(&metadata::SNAPSHOT_CAVEATS)
            .map(|t| t.lines().map(str::trim).filter(|l| !l.is_empty()).map(str::to_string).collect())
            .unwrap_or_default();
        Caveats {
            lines,
            state_only: header.meta_flag(&metadata::SNAPSHOT_STATE_ONLY) == Some(true),
            unknown_actions: header.meta_count(&metadata::SNAPSHOT_UNKNOWN_ACTIONS).unwrap_or(0),
        }
    }

    /// The caveats as warning lines naming the file `path` (what memsim and memest print).
    pub fn warnings(&self, path: &Path) -> Vec<String> {
        self.lines.iter().map(|n| format!("{}: {n}", path.display())).collect()
    }

    /// What a replay of `snap`, imported with the start state `start`, cannot show.
    pub(super) fn found(snap: &Snapshot, start: &StartState) -> Caveats {
        let mut lines = Vec::new();
        let state_only = snap.device_traces.iter().flatten().all(|e| e.action.left_out());
        if state_only {
            lines.push(
                "the snapshot records no allocator events (only its segments when it was dumped): the peaks are \
                 only the state at dump time, not the run's own peak, which may have been higher"
                    .to_string(),
            );
        }
        // A block whose only doubt is its size (freed during the trace, a hidden tail at most
        // 1 MiB) leaves the start state standing: the real snapshots with such blocks validate
        // exactly. The rest are start states the walk could not see, or a snapshot at odds with itself.
        let doubts: Vec<_> = start.unrecoverable.iter().filter(|u| !u.size_only).collect();
        if let Some(first) = doubts.first() {
            lines.push(format!(
                "the snapshot's start state could not be fully recovered ({} items, the first: {first}): blocks \
                 allocated before recording began may be missing or misplaced, so the peaks may differ from the run's \
                 (memsim validate lists them)",
                doubts.len()
            ));
        }
        lines.extend(entry_caveats(snap));
        let unknown_actions = snap.skipped.iter().filter(|(a, _)| *a != ANNOTATE).map(|(_, s)| s.count as u64).sum();
        Caveats { lines, state_only, unknown_actions }
    }

    /// Adds these caveats to those `header` carries already (a snapshot memsim wrote from a
    /// converted one keeps its source's), each line once.
    pub(super) fn add_to(self, header: &mut Header) {
        let mut all = Caveats::of(header);
        for l in self.lines {
            if !all.lines.contains(&l) {
                all.lines.push(l);
            }
        }
        if !all.lines.is_empty() {
            // A caveat is one line: a newline inside one (a frame's name) must not split it.
            let lines: Vec<String> = all.lines.iter().map(|l| l.replace(['\n', '\r'], " ")).collect();
            header.set_meta(&metadata::SNAPSHOT_CAVEATS, lines.join("\n"));
        }
        if all.state_only || self.state_only {
            header.set_meta(&metadata::SNAPSHOT_STATE_ONLY, "true");
        }
        let unknown = all.unknown_actions.max(self.unknown_actions);
        if unknown > 0 {
            header.set_meta(&metadata::SNAPSHOT_UNKNOWN_ACTIONS, unknown.to_string());
        }
    }
}

/// The trace entries a replay of `snap` leaves out, one line per action, and those it replays
/// without following the allocator's internals that tagged them, one line per tag (replay's
/// caveats and validate's warnings alike).
pub(super) fn entry_caveats(snap: &Snapshot) -> Vec<String> {
    let tagged = snap.tagged.iter().map(|(tag, Skipped { count: n, first })| {
        let entries = if *n == 1 { "trace entry" } else { "trace entries" };
        if tag == MALLOC_WITH_ADDRESS {
            format!(
                "{n} {entries} tagged {tag:?} by the allocator (the first: {first}): the prefix block PyTorch \
                 allocates and frees to place a block at an address its caller chose (allocateWithAddress), which \
                 memsim replays as an ordinary block by its own best fit, so addresses from there on, and the \
                 peaks, may differ from the run's (a snapshot memsim writes lacks the tags)"
            )
        } else {
            format!(
                "{n} {entries} tagged {tag:?} by the allocator's internals, a tag this version does not know (the \
                 first: {first}): replayed as plain entries, so the peaks may differ from the run's (a snapshot \
                 memsim writes lacks the tags)"
            )
        }
    });
    let left_out = snap.skipped.iter().map(|(action, skipped)| {
        let (n, first) = (skipped.count, &skipped.first);
        let (entries, they) = if n == 1 { ("trace entry", "it changes") } else { ("trace entries", "they change") };
        if action == ANNOTATE {
            format!(
                "{n} '{ANNOTATE}' {entries} (metadata attached to allocations; the first: {first}) left out: \
                     leaving them out changes no peak, but memsim does not keep them (a snapshot it writes lacks them)"
            )
        } else {
            format!(
                "{n} {entries} of action {action:?}, which this version does not know (the first: {first}), left \
                     out: if {they} memory, the peaks may differ from the run's (a newer memsim may read them)"
            )
        }
    });
    left_out.chain(tagged).collect()
}
