//! Shared helpers of the snapshot test modules: locating /work/shared data (failing loudly when
//! it is missing) and the plain rounding rule.

use std::path::PathBuf;

use simulator::snapshot::{self, Snapshot};

/// Every file in ../shared/data/snapshots, as listed in its README.
pub const SHARED_FILES: [&str; 16] = [
    "Charran78--DocuBox--dump_snapshot.pickle",
    "Constructor-Sun--code_location--memory_snapshot.pickle",
    "JasperSolt--EoR_NN--snapshot.pickle",
    "MAGMA27--assignment2-systems--memory_snapshot.pickle",
    "Maphsge4--select_n--snapshot.pickle",
    "Muduard--LayoutEditing--memory_snapshot.pkl",
    "Wedsonlin--assignment2-systems--results_medium_128_inference_memory_snapshot.pickle",
    "Wedsonlin--assignment2-systems--results_medium_512_training_memory_snapshot.pickle",
    "albi2--thesis-text-to-SQL--dump_snapshot.pickle",
    "bcrafton--assignment2-systems--memory_snapshot.pickle",
    "cranberrii--ftcourse--memory_snapshot.pickle",
    "kkaitlyn111--cs336-a2-systems--memory_2.7b_forward.pickle",
    "kkaitlyn111--cs336-a2-systems--memory_ctx128_fullstep.pickle",
    "kkaitlyn111--cs336-a2-systems--memory_ctx256_forward.pickle",
    "kkaitlyn111--cs336-a2-systems--memory_files_memory_ctx128_fullstep_.pickle",
    "kkaitlyn111--cs336-a2-systems--memory_small_forward.pickle",
];

/// The repository root: the workspace directory holding `Cargo.lock`, above the crate whose
/// tests include this file.
fn repo() -> PathBuf {
    let crate_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    crate_dir.ancestors().find(|d| d.join("Cargo.lock").is_file()).unwrap_or(&crate_dir).to_path_buf()
}

/// ../shared/data/snapshots relative to the repository root.
pub fn shared_dir() -> PathBuf {
    let dir = repo().join("../shared/data/snapshots");
    assert!(
        dir.is_dir(),
        "shared snapshot data missing: expected {} (the project's ../shared checkout)",
        dir.display()
    );
    dir
}

/// Path of one shared snapshot; panics with the path when it is missing.
pub fn shared_path(file: &str) -> PathBuf {
    let p = shared_dir().join(file);
    assert!(p.is_file(), "shared snapshot missing: {}", p.display());
    p
}

/// Reads one shared snapshot.
pub fn shared_snapshot(file: &str) -> Snapshot {
    let p = shared_path(file);
    snapshot::read_snapshot(&p).unwrap_or_else(|e| panic!("{e}"))
}

/// Path of a fixture under tests/fixtures/snapshots.
pub fn fixture(file: &str) -> PathBuf {
    let p = repo().join("tests/fixtures/snapshots").join(file);
    assert!(p.is_file(), "fixture missing: {}", p.display());
    p
}

/// The default allocator configuration: `round_size` with no `roundup_power2_divisions` (up to
/// a multiple of 512, at least 512) and no `max_split_size`.
pub fn plain() -> simulator::alloc::AllocatorConfig {
    simulator::alloc::AllocatorConfig::default()
}
