//! PyTorch memory snapshots: import, export, start-state rebuild, validation.
//!
//! - [`read_snapshot`] / [`parse_snapshot`] decode a `torch.cuda.memory._dump_snapshot()` pickle
//!   (or the old list-of-segments form) with a memo-sharing unpickler ([`pickle`]).
//! - [`rebuild`] recovers the allocator state at the first trace entry by walking the trace
//!   backwards from the final `segments` (allocator reference §15).
//! - [`import`] turns a snapshot into a memtrace header and records; [`export`] writes records
//!   back as a snapshot pickle that memory_viz opens.
//! - [`validate`] replays the block-level events through the allocator model and compares every
//!   placement and segment event with the recorded ones.

mod caveats;
mod check;
pub mod export;
pub mod import;
pub mod libraries;
pub mod model;
pub mod pickle;
mod pickle_writer;
pub mod rebuild;
mod resync;
mod settings;
pub mod validate;

pub use caveats::{input_warnings, Caveats};
pub use export::{check_exportable, export_snapshot, write_replayed_snapshot, write_snapshot, Exported};
pub use import::{import, Imported, PRODUCER};
pub use model::{parse_snapshot, read_snapshot, Action, Block, Segment, Snapshot, TraceEntry};
pub use rebuild::{rebuild, StartBlock, StartSegment, StartState, Unrecoverable};
pub use validate::{
    guess_version, rebuild_with, snapshot_choice, snapshot_config, validate, validate_from, ValidateOptions,
    ValidationReport, Verdict,
};

use std::path::PathBuf;

use crate::alloc::TorchVersion;

/// Imports a snapshot with the rounding of its own allocator settings (or of `alloc_conf`, or
/// the defaults): the usual entry point for `memsim convert X.pickle Y`.
pub fn import_snapshot(
    snap: &Snapshot,
    version: Option<TorchVersion>,
    alloc_conf: Option<&str>,
) -> Result<Imported, SnapshotError> {
    let (cfg, _) = snapshot_config(snap, version, alloc_conf)?;
    Ok(import(snap, &cfg))
}

/// Errors reading, converting or writing snapshots.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SnapshotError {
    /// The file could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The bytes are not a pickle this reader accepts.
    #[error("{file}: not a readable snapshot pickle: {source}")]
    Pickle {
        /// The file (or the name given for in-memory bytes).
        file: String,
        /// Where and why decoding stopped.
        source: pickle::PickleError,
    },
    /// A field is missing or has the wrong type or value.
    #[error("{file}: field {field}: expected {expected}")]
    Field {
        /// The file.
        file: String,
        /// Path of the field, e.g. `device_traces[0][12].addr`.
        field: String,
        /// What was expected (and what was found).
        expected: String,
    },
    /// A trace record cannot be expressed in a snapshot.
    #[error("record {index}: {message}")]
    Export {
        /// Index of the record in the input.
        index: usize,
        /// Why.
        message: String,
    },
    /// The allocator settings (or an override) are invalid, or the model rejected the rebuilt
    /// start state.
    #[error("{message}")]
    Config {
        /// What was wrong, naming the key or the segment.
        message: String,
    },
    /// The output file could not be written.
    #[error("cannot write {}: {source}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}
