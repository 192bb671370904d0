//! Integration tests of the trace format crate (one test binary; see `autotests = false`).
#![recursion_limit = "512"]

#[path = "it/strategies.rs"]
mod strategies; // proptest strategies for every event kind (helpers, no tests)
#[path = "it/support.rs"]
mod support; // in-memory encode/decode helpers (no tests)

#[path = "it/corruption.rs"]
mod corruption; // bad magic, versions, flags, tag 0, absurd lengths, garbage: errors with offsets/lines
#[path = "it/files.rs"]
mod files; // TraceWriter temp-file + rename, Reader::open errors naming the path, convert
#[path = "it/forward_compat.rs"]
mod forward_compat; // unknown tags/kinds skipped and counted, appended fields ignored
#[path = "it/golden.rs"]
mod golden; // committed tests/fixtures/trace-v1 files decode and re-encode byte for byte
#[path = "it/roundtrip.rs"]
mod roundtrip; // every kind through binary, JSON Lines, and binary → JSONL → binary byte-identical
#[path = "it/schema.rs"]
mod schema;
#[path = "it/truncation.rs"]
mod truncation; // a cut at every byte offset reads a prefix of records and sets `truncated` // schema/trace.schema.json is generated from the code and validates every written line
#[path = "it/enum_codes.rs"]
mod enum_codes; // on-disk variant indexes and API codes are pinned (FORMAT.md §1.7)
