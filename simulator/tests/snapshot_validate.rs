//! Replay validation against every shared snapshot with a trace; expectations from the allocator
//! reference §16 (all placements match, or the documented exception).

use simulator::snapshot::{self, ValidateOptions, ValidationReport, Verdict};

use crate::snapshot_support::{shared_snapshot, SHARED_FILES};

fn run(file: &str, opts: &ValidateOptions) -> ValidationReport {
    let snap = shared_snapshot(file);
    snapshot::validate(&snap, opts).unwrap_or_else(|e| panic!("{file}: {e}"))
}

/// One row of docs/validation.md.
fn row(file: &str, r: &ValidationReport) -> String {
    let unmap = r
        .devices
        .iter()
        .filter_map(|d| d.before_first_unmap.map(|c| format!("{}/{}", c.alloc_addr_matches, c.allocs)))
        .collect::<Vec<_>>();
    format!(
        "| {file} | {}/{} | {}/{} | {} | {} | {} | {} | {} | {} | {:?} |",
        r.alloc_addr_matches,
        r.allocs,
        r.segment_event_matches,
        r.segment_events,
        r.extra_predicted_segment_events,
        r.recorded_peak_reserved_bytes,
        r.predicted_peak_reserved_bytes,
        r.empty_cache_bursts,
        r.unrecoverable.len(),
        if unmap.is_empty() { "-".to_string() } else { unmap.join(", ") },
        r.verdict,
    )
}

#[test]
fn validation_table_over_every_shared_snapshot() {
    let mut rows = Vec::new();
    for file in SHARED_FILES {
        let r = run(file, &ValidateOptions::default());
        rows.push(row(file, &r));
        if r.verdict != Verdict::Exact {
            for d in &r.devices {
                eprintln!(
                    "{file} dev {}: {:?} before_unmap {:?} errors {:?}\n  first {:?}",
                    d.device, d.counts, d.before_first_unmap, d.replay_errors, &d.first_mismatches[..d.first_mismatches.len().min(3)]
                );
            }
            eprintln!("{file}: unrecoverable {:?}", r.unrecoverable.iter().take(5).collect::<Vec<_>>());
        }
    }
    println!("{}", rows.join("\n"));
}
