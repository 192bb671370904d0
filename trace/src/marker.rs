//! The one marker grammar every producer uses.
//!
//! - `iter:<n>`: iteration `n` starts here (a point marker).
//! - `phase:<forward|backward|optimizer|data|other>`: a phase starts here and lasts until the next
//!   phase marker.
//! - anything else is free-form user text.

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
}
