//! Integration tests of the trace format crate (one test binary; see `autotests = false`).
#![recursion_limit = "512"]

/// Proptest strategies for every event kind (helpers, no tests).
#[path = "it/strategies.rs"]
mod strategies;
/// In-memory encode/decode helpers (no tests).
#[path = "it/support.rs"]
mod support;

/// `Reader::next_records` in batches reads what `next_record` reads one at a time.
#[path = "it/batched.rs"]
mod batched;
/// Bad magic, versions, flags, tag 0, absurd lengths, garbage: errors with offsets or lines.
#[path = "it/corruption.rs"]
mod corruption;
/// On-disk enum variant indexes and API codes are pinned (FORMAT.md §1.7).
#[path = "it/enum_codes.rs"]
mod enum_codes;
/// The hand-written launch/alloc/free encoders equal the generic bincode path byte for byte.
#[path = "it/fastframe.rs"]
mod fastframe;
/// The hand-written alloc/free/launch decoders read what the derived ones read.
#[path = "it/fastread.rs"]
mod fastread;
/// `TraceWriter` temp file + rename, `Reader::open` errors naming the path.
#[path = "it/files.rs"]
mod files;
/// Unknown tags and kinds skipped and counted, appended fields ignored.
#[path = "it/forward_compat.rs"]
mod forward_compat;
/// Committed tests/fixtures/trace-v1 files decode and re-encode byte for byte.
#[path = "it/golden.rs"]
mod golden;
/// Every kind through binary, JSON Lines, and binary → JSONL → binary byte-identical.
#[path = "it/roundtrip.rs"]
mod roundtrip;
/// schema/trace.schema.json is generated from the code and validates every written line.
#[path = "it/schema.rs"]
mod schema;
/// A cut at every byte offset reads a prefix of records and sets `truncated`.
#[path = "it/truncation.rs"]
mod truncation;
/// Events the producer lost and a stop at its byte limit: counted in the summary and said.
#[path = "it/unrecorded.rs"]
mod unrecorded;
