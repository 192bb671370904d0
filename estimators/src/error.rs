//! The library's error type. Every variant names the file (or input) and what was expected, so
//! the CLI can print the chain and nothing else.

use std::path::PathBuf;

/// Errors of the estimators library.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EstimateError {
    /// A file could not be read or written.
    #[error("{path}: {action}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What was being done ("cannot read", "cannot write").
        action: &'static str,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A JSON input did not have the expected shape.
    #[error("{path}: field {field:?}: {expected}")]
    Field {
        /// The file (or a description of the input).
        path: PathBuf,
        /// The offending field.
        field: String,
        /// What was expected.
        expected: String,
    },
    /// A line of a JSON Lines input did not parse.
    #[error("{}:{line}: {expected}", path.display())]
    Line {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What was expected, and the parser's message.
        expected: String,
    },
    /// A CSV input had a bad row or column.
    #[error("{path}: row {row}: column {column:?}: {expected}")]
    Csv {
        /// The file.
        path: PathBuf,
        /// 1-based data row (0 = the header).
        row: usize,
        /// The column.
        column: String,
        /// What was expected.
        expected: String,
    },
    /// A trace could not be read.
    #[error(transparent)]
    Trace(#[from] trace::TraceError),
    /// A trace could not be replayed.
    #[error("{path}: cannot replay")]
    Replay {
        /// The trace.
        path: PathBuf,
        /// Why.
        source: simulator::replay::ReplaySetupError,
    },
    /// A GPU profile could not be loaded.
    #[error(transparent)]
    Profile(#[from] simulator::profile::ProfileError),
    /// The profile's `software.allocator` is not a modelled allocator version.
    #[error("{path}: software.allocator")]
    AllocatorVersion {
        /// The profile file.
        path: PathBuf,
        /// Why.
        source: simulator::alloc::VersionError,
    },
    /// An external command (the trainer) failed.
    #[error("{command}: {message}")]
    Command {
        /// The command line, abbreviated.
        command: String,
        /// What went wrong (exit status, stderr tail).
        message: String,
    },
    /// Plotting failed.
    #[error("{path}: cannot draw plot: {message}")]
    Plot {
        /// The output file.
        path: PathBuf,
        /// The backend's message.
        message: String,
    },
    /// Calibration was impossible with the runs given.
    #[error("calibration: {0}")]
    Calibration(String),
}

/// An error and its sources, `: `-separated (what anyhow's `{:#}` prints), for messages kept in
/// reports rather than printed by the CLI.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// Result alias of the library.
pub type Result<T, E = EstimateError> = std::result::Result<T, E>;

/// [`trace::write_bytes_atomic`] with this crate's error: a failure never leaves a partial output.
pub fn write_atomic(path: &std::path::Path, bytes: &[u8]) -> Result<()> {
    trace::write_bytes_atomic(path, bytes).map_err(|source| EstimateError::Io {
        path: path.to_path_buf(),
        action: "cannot write",
        source,
    })
}
