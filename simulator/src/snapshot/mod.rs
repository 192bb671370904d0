//! PyTorch memory snapshots: import, export, start-state rebuild, validation.
