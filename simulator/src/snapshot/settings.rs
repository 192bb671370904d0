//! Which allocator configuration and rules a snapshot is replayed with: the recorded settings
//! or `--alloc-conf`, by the rule `memsim replay` follows too ([`crate::alloc::choose`]).

use crate::alloc::{AllocatorConfig, ChosenConfig, RecordedConfig, TorchVersion};

use super::model::Snapshot;
use super::SnapshotError;

/// The release whose rules a snapshot was most likely written under: `allocator_settings` appeared
/// around 2.2 and `graph_capture_record_stream_reuse` in 2.9; older files get the oldest family
/// modelled.
pub fn guess_version(snap: &Snapshot) -> TorchVersion {
    match &snap.allocator_settings {
        Some(s) if s.get("graph_capture_record_stream_reuse").is_some() => TorchVersion::V2_9,
        Some(_) => TorchVersion::V2_5,
        None => TorchVersion::V2_4,
    }
}

/// The allocator configuration (where it came from, and what to warn about) and version for
/// replaying a snapshot: `alloc_conf` overrides the recorded settings; without settings the
/// defaults apply.
pub fn snapshot_choice(
    snap: &Snapshot,
    version: Option<TorchVersion>,
    alloc_conf: Option<&str>,
) -> Result<(ChosenConfig, TorchVersion), SnapshotError> {
    let version = version.unwrap_or_else(|| guess_version(snap));
    let recorded = RecordedConfig { env: None, settings: snap.allocator_settings.as_ref() };
    let chosen = crate::alloc::choose(alloc_conf, recorded, version).map_err(|e| SnapshotError::Config {
        message: format!("allocator configuration {}: {}", e.source_name, e.error),
    })?;
    Ok((chosen, version))
}

/// [`snapshot_choice`]'s configuration alone.
pub fn snapshot_config(
    snap: &Snapshot,
    version: Option<TorchVersion>,
    alloc_conf: Option<&str>,
) -> Result<(AllocatorConfig, TorchVersion), SnapshotError> {
    snapshot_choice(snap, version, alloc_conf).map(|(c, v)| (c.cfg, v))
}

/// A warning when the snapshot is one memsim wrote itself from a trace that was not a PyTorch
/// snapshot (it carries a `memtrace_header` naming another producer, or none): its records are
/// not PyTorch's, so validating it compares the model with itself. A PyTorch snapshot converted
/// to a trace and back keeps PyTorch's own addresses and segment events: no warning.
pub fn circular(snap: &Snapshot) -> Option<String> {
    let kept = snap.memtrace_header.as_ref()?;
    let producer = kept.get("producer").and_then(serde_json::Value::as_str);
    (producer != Some(super::import::PRODUCER)).then(|| {
        format!(
            "the snapshot was written by memsim (it carries a memtrace_header; the records came from {}): its \
             addresses and segment events are not PyTorch's, so the comparison is circular and an EXACT verdict \
             says nothing about the model; validate a snapshot PyTorch dumped (torch.cuda.memory._dump_snapshot)",
            producer.map_or("an unnamed producer".to_string(), |p| format!("\"{p}\""))
        )
    })
}
