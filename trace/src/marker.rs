//! The one marker grammar every producer uses.
//!
//! - `iter:<n>`: iteration `n` starts here (a point marker).
//! - `phase:<forward|backward|optimizer|data|other>`: a phase starts here and lasts until the next
//!   phase marker.
//! - anything else is free-form user text.
//!
//! One producer's own markers are read apart from the grammar: the shim's notes that it stopped
//! recording at its `MEMTRACE_MAX_BYTES` limit ([`byte_limit`], [`parse_byte_limit`]) or when it
//! could not allocate its queue ([`QUEUE_UNALLOCATED`]), and that CUPTI activity records still
//! buffered at a fatal signal may be missing ([`CUPTI_UNDELIVERED`]). To the grammar they are user
//! text.

/// A training phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Phase {
    /// Forward pass (and loss).
    Forward,
    /// Backward pass.
    Backward,
    /// Optimizer step and `zero_grad`.
    Optimizer,
    /// Data loading and host-to-device copies.
    Data,
    /// Anything else.
    Other,
}

impl Phase {
    /// All phases.
    pub const ALL: [Phase; 5] = [Phase::Forward, Phase::Backward, Phase::Optimizer, Phase::Data, Phase::Other];

    /// The marker spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Forward => "forward",
            Phase::Backward => "backward",
            Phase::Optimizer => "optimizer",
            Phase::Data => "data",
            Phase::Other => "other",
        }
    }
}

/// A parsed marker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MarkerKind<'a> {
    /// `iter:<n>`.
    Iter(u64),
    /// `phase:<p>`.
    Phase(Phase),
    /// Free-form text.
    User(&'a str),
}

/// Parse a marker's text. Text that looks like `iter:` or `phase:` but does not parse is user text.
pub fn parse(text: &str) -> MarkerKind<'_> {
    if let Some(n) = text.strip_prefix("iter:") {
        if let Ok(n) = n.parse() {
            return MarkerKind::Iter(n);
        }
    }
    if let Some(p) = text.strip_prefix("phase:") {
        if let Some(p) = Phase::ALL.into_iter().find(|ph| ph.as_str() == p) {
            return MarkerKind::Phase(p);
        }
    }
    MarkerKind::User(text)
}

/// The marker text for iteration `n`.
pub fn iter(n: u64) -> String {
    format!("iter:{n}")
}

/// The marker text for a phase.
pub fn phase(p: Phase) -> String {
    format!("phase:{}", p.as_str())
}

/// What the shim's marker says before the limit.
const BYTE_LIMIT_PREFIX: &str = "memtrace: MEMTRACE_MAX_BYTES=";
/// What it says after.
const BYTE_LIMIT_SUFFIX: &str = " reached; recording stopped";

/// The marker text a producer writes when it stops recording because its trace reached
/// `max_bytes` (the shim's `MEMTRACE_MAX_BYTES`): everything after it went unrecorded, though
/// the producer may still close the trace with its `process_exit`.
pub fn byte_limit(max_bytes: u64) -> String {
    format!("{BYTE_LIMIT_PREFIX}{max_bytes}{BYTE_LIMIT_SUFFIX}")
}

/// The limit a [`byte_limit`] marker names; `None` for any other text.
pub fn parse_byte_limit(text: &str) -> Option<u64> {
    text.strip_prefix(BYTE_LIMIT_PREFIX)?.strip_suffix(BYTE_LIMIT_SUFFIX)?.parse().ok()
}

/// The marker text a producer writes when it stops recording because the memory for its event
/// queue could not be allocated (the shim under a tight memory limit): what the run did after
/// went unrecorded.
pub const QUEUE_UNALLOCATED: &str = "memtrace: a queue's memory could not be allocated; recording stopped";

/// The marker text a producer writes when the process was ended by a signal before the activity
/// records still buffered inside CUPTI could be delivered (the shim's `MEMTRACE_CUPTI=1`): any
/// of the run's `kernel_exec` and `mem_activity` records may be missing (CUPTI delivers them only
/// when its buffers fill or are flushed).
pub const CUPTI_UNDELIVERED: &str =
    "memtrace: CUPTI activity records buffered at the fatal signal could not be delivered; kernel_exec and \
     mem_activity records may be missing";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grammar() {
        assert_eq!(parse("iter:3"), MarkerKind::Iter(3));
        assert_eq!(parse("phase:backward"), MarkerKind::Phase(Phase::Backward));
        assert_eq!(parse("phase:warmup"), MarkerKind::User("phase:warmup"));
        assert_eq!(parse("iter:x"), MarkerKind::User("iter:x"));
        assert_eq!(parse(&iter(7)), MarkerKind::Iter(7));
        for p in Phase::ALL {
            assert_eq!(parse(&phase(p)), MarkerKind::Phase(p));
        }
    }

    #[test]
    fn byte_limit_marker() {
        // The shim's text, as it writes it.
        assert_eq!(parse_byte_limit("memtrace: MEMTRACE_MAX_BYTES=20000 reached; recording stopped"), Some(20000));
        assert_eq!(parse_byte_limit(&byte_limit(1 << 30)), Some(1 << 30));
        assert_eq!(parse_byte_limit("memtrace: MEMTRACE_MAX_BYTES=x reached; recording stopped"), None);
        assert_eq!(parse_byte_limit("iter:3"), None);
        assert_eq!(parse(&byte_limit(5)), MarkerKind::User(&byte_limit(5)));
    }
}
