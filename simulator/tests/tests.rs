mod placeholder {}
mod snapshot_import; // every shared snapshot imports with the README's action counts
mod snapshot_roundtrip; // pickle -> trace -> pickle gives memory_viz the same picture (venv torch)
mod snapshot_support; // shared-data paths (fail loudly when missing) and helpers
