mod alloc_config; // rounding vectors, divisions tables per version, ALLOC_CONF parse errors
mod alloc_expandable; // expandable segments: mapping, page rounding, unmapping, OOM path
mod alloc_native; // hand-written native cases, one per rule and config option
mod alloc_props; // proptest invariants and differential fuzzing against alloc_reference
mod alloc_reference; // a naive Vec-of-segments model of the native rules, for differential tests
mod alloc_support; // the test script language and the state-consistency checker
mod fit; // the fit check: in-memory shortcut == lockstep replay at every budget; margins and verdicts
mod records; // hand-built trace records (shared with the memsim command's tests)
mod replay_live; // the numbered live blocks hold what a map by trace address holds, on random refusing traces
mod replay_steps; // the two-phase replay (classify on the decoding thread) == observe, on real snapshots and unusual records
mod report; // the memory report: collect on known answers, the page, memsim report end to end
mod snapshot_export; // snapshots written from a replay keep its OOMs and settings; blocks outside a segment refused
mod snapshot_import; // every shared snapshot imports with the README's action counts
mod snapshot_pickle; // the streaming unpickler: opcodes, memo sharing, errors, serde-pickle agreement
mod snapshot_rebuild; // start-state rebuild on hand-made fixtures with known answers
mod snapshot_roundtrip; // pickle -> trace -> pickle gives memory_viz the same picture (venv torch)
mod snapshot_support; // shared-data paths (fail loudly when missing) and helpers
mod snapshot_validate; // replay validation per shared snapshot, expectations from the spec §16
mod util_metrics; // busy fraction, SM activity, occupancy, gaps and phases on hand-built kernel timelines
mod util_occupancy; // the occupancy calculator on CUDA's documented cases, launch failures, invariants
