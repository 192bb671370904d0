//! The one error type of the format crate.
//!
//! Messages are self-contained (they embed the underlying cause) so that both `{}` and `{:#}`
//! print everything a user needs: the file, the byte offset or line, the field, what was expected.

use std::path::PathBuf;

/// Everything that can go wrong reading or writing a trace.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TraceError {
    /// An I/O operation failed; `context` says which (e.g. "reading event frame at byte 1234").
    #[error("{context}: {error}")]
    Io {
        /// What was being done.
        context: String,
        /// The OS error.
        error: std::io::Error,
    },

    /// The input starts with neither the binary magic nor a JSON Lines object (a UTF-8
    /// byte-order mark before one is named as such).
    #[error("{}", bad_magic(.found))]
    BadMagic {
        /// The first bytes seen (at most 16).
        found: Vec<u8>,
    },

    /// The file's format version is one this reader does not know: newer than it, or 0, which
    /// no writer has used.
    #[error(
        "unsupported trace format version {found}: this reader knows versions 1 to {max}; {}",
        if *found == 0 { "version 0 was never written, so the header is damaged" } else { "upgrade memtrace to read it" }
    )]
    UnsupportedVersion {
        /// The version in the file.
        found: u64,
        /// The newest version this reader knows ([`crate::FORMAT_VERSION`]).
        max: u16,
    },

    /// The file's flag word sets bits that this version reserves.
    #[error(
        "unsupported trace flags {flags:#06x}: bits {reserved:#06x} are reserved in format version 1 \
         (written by a newer or foreign producer)"
    )]
    UnsupportedFlags {
        /// The whole flag word.
        flags: u16,
        /// The reserved bits that were set.
        reserved: u16,
    },

    /// The input ends before the header is complete (an empty file, or one cut inside its header).
    #[error("incomplete trace header: the input ends at byte {offset} while reading {what}")]
    PartialHeader {
        /// Bytes available.
        offset: u64,
        /// Which part of the header was being read.
        what: &'static str,
    },

    /// A JSON Lines input whose first line is not a header object.
    #[error("missing trace header: line {line} should be an object with \"kind\":\"header\", found {found}")]
    MissingHeader {
        /// The 1-based line number of the first non-blank line.
        line: u64,
        /// A short description of what was there.
        found: String,
    },

    /// A binary frame (or the header frame) that cannot be decoded.
    #[error("corrupt trace frame at byte {offset}: {reason}")]
    CorruptFrame {
        /// Byte offset of the frame's first byte (its tag).
        offset: u64,
        /// What was wrong.
        reason: String,
    },

    /// A binary trace's magic where a frame belongs: a second trace appended to the first.
    #[error(
        "a second trace header starts at byte {offset} (the magic bytes \"MEMTRACE\" where a record belongs): \
         two traces concatenated into one file? Split it at byte {offset} to read each"
    )]
    SecondHeader {
        /// Byte offset of the second magic.
        offset: u64,
    },

    /// A JSON Lines line that cannot be decoded.
    #[error("invalid JSON Lines record at line {line}{}: {message}", field_suffix(.field))]
    Json {
        /// The 1-based line number.
        line: u64,
        /// The offending field (a path such as `blocks[2].state`), when known.
        field: Option<String>,
        /// What was wrong and what was expected.
        message: String,
    },

    /// A record that cannot be encoded (e.g. a JSON writer given a non-finite float).
    #[error("cannot encode {what}: {message}")]
    Encode {
        /// What was being encoded.
        what: String,
        /// Why it failed.
        message: String,
    },

    /// An output path whose extension names no trace form.
    #[error(
        "{}: unknown trace format: expected the extension .mtrace (binary) or .jsonl (JSON Lines)",
        path.display()
    )]
    UnknownExtension {
        /// The path.
        path: PathBuf,
    },

    /// An error while working on a named file.
    #[error("{}: {inner}", path.display())]
    InFile {
        /// The file.
        path: PathBuf,
        /// The error.
        inner: Box<TraceError>,
    },
}

impl TraceError {
    /// An I/O error with a context phrase.
    pub fn io(context: impl Into<String>, error: std::io::Error) -> Self {
        TraceError::Io { context: context.into(), error }
    }

    /// This error, attributed to `path` (not twice).
    pub fn in_file(self, path: impl Into<PathBuf>) -> Self {
        match self {
            e @ TraceError::InFile { .. } => e,
            e => TraceError::InFile { path: path.into(), inner: Box::new(e) },
        }
    }

    /// The error without its file attribution.
    pub fn innermost(&self) -> &TraceError {
        match self {
            TraceError::InFile { inner, .. } => inner.innermost(),
            e => e,
        }
    }

    /// The byte offset this error points at, for binary-form errors.
    pub fn offset(&self) -> Option<u64> {
        match self.innermost() {
            TraceError::CorruptFrame { offset, .. }
            | TraceError::PartialHeader { offset, .. }
            | TraceError::SecondHeader { offset } => Some(*offset),
            _ => None,
        }
    }
}

fn field_suffix(field: &Option<String>) -> String {
    match field {
        Some(f) => format!(", field `{f}`"),
        None => String::new(),
    }
}

/// The UTF-8 byte-order mark some editors put first in a text file.
const BOM: &[u8] = b"\xef\xbb\xbf";

fn bad_magic(found: &[u8]) -> String {
    if found.starts_with(BOM) {
        return format!(
            "not a memtrace trace: it starts with a UTF-8 byte-order mark (ef bb bf), which the JSON Lines form does \
             not allow: save it without one (found {})",
            describe_bytes(found)
        );
    }
    // Protocol 2 and later pickles open with PROTO (0x80): a PyTorch memory snapshot, most
    // likely, which is not a trace until converted.
    let pickle = if found.first() == Some(&0x80) {
        " (it starts as a Python pickle does: a PyTorch memory snapshot? `memsim convert SNAPSHOT.pickle \
         OUT.mtrace` makes a trace of one)"
    } else {
        ""
    };
    format!(
        "not a memtrace trace: expected the magic bytes \"MEMTRACE\" (binary form) or '{{' (JSON Lines form), found \
         {}{pickle}",
        describe_bytes(found)
    )
}

fn describe_bytes(bytes: &[u8]) -> String {
    if bytes.is_empty() {
        return "an empty input".to_string();
    }
    let hex: Vec<String> = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let text: String = bytes.iter().map(|&b| if b.is_ascii_graphic() || b == b' ' { b as char } else { '.' }).collect();
    format!("bytes {} ({text:?})", hex.join(" "))
}
