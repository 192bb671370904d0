//! Builds `libmemtrace.so` (the shim) for the wheel and places it in the Python package
//! (`trainer/memtrace/_lib/`, ignored by git), which maturin then packs. maturin cannot put a
//! second native library beside a PyO3 module (PyO3/maturin#368), so it is built here, by a
//! nested cargo with its own target directory (no lock shared with the build that runs this
//! script), without debug info.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let root = manifest.parent().expect("python/ is inside the workspace").to_path_buf();
    for dir in ["shim/src", "trace/src", "shim/Cargo.toml", "trace/Cargo.toml"] {
        println!("cargo:rerun-if-changed={}", root.join(dir).display());
    }
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let target = out.join("shim-target");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .current_dir(&root)
        .args(["build", "--release", "--quiet", "-p", "memtrace-shim", "--lib", "--target-dir"])
        .arg(&target)
        // The extension's own flags (maturin's) are not the shim's.
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("CARGO_TARGET_DIR")
        .env("CARGO_PROFILE_RELEASE_DEBUG", "0")
        .env("CARGO_PROFILE_RELEASE_STRIP", "symbols")
        .status()
        .expect("running cargo to build the shim");
    assert!(status.success(), "building libmemtrace.so for the wheel failed ({status})");
    let built = target.join("release/libmemtrace.so");
    let dest_dir = root.join("trainer/memtrace/_lib");
    std::fs::create_dir_all(&dest_dir).expect("creating trainer/memtrace/_lib");
    // Through a temporary name: an interrupted copy never leaves a partial library.
    let tmp = dest_dir.join(".libmemtrace.so.tmp");
    std::fs::copy(&built, &tmp).expect("copying libmemtrace.so into the package");
    std::fs::rename(&tmp, dest_dir.join("libmemtrace.so")).expect("placing libmemtrace.so");
}
