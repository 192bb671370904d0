//! `memsim`: replay allocator-level traces through an exact model of PyTorch's CUDA caching
//! allocator, summarise and convert traces, validate the model on real snapshots, and simulate
//! several jobs sharing one GPU.
//!
//! Thin binary: argument parsing and I/O here; the rules live in the `simulator` library.

mod batch;
mod colocate;
mod convert;
pub mod exit;
mod input;
mod profile;
mod replay;
mod report;
mod stats;
mod validate;

/// The one `--strict` rule, shared with `memest`.
pub use input::{input_warnings, summary_warnings, STRICT_HELP};
pub use replay::point_without_effect;

use clap::{Parser, Subcommand};

/// Predict the GPU memory a PyTorch training job reserves, from a trace, with an exact model of
/// the CUDA caching allocator.
#[derive(Parser)]
#[command(
    name = "memsim",
    version,
    about,
    long_about = None,
    propagate_version = true,
    after_help = "Exit status: 0 success or fits; 1 does not fit (replay with a capacity, colocate), or, for \
                  validate, the model differs from the snapshot; 2 bad input or error."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Replay an allocator-level trace (.mtrace, .jsonl, or a snapshot .pickle) and report peak
    /// reserved/allocated memory, fragmentation at the peak, and OOM at a capacity.
    Replay(replay::Args),
    /// Summarise a trace: events per kind and API, allocations, peak live device bytes, kernels.
    Stats(stats::Args),
    /// Convert between .mtrace, .jsonl, PyTorch snapshot .pickle (memory_viz) and Perfetto .json
    /// (export only). The format is chosen by extension.
    Convert(convert::Args),
    /// Replay a real PyTorch memory snapshot and compare every predicted block address and
    /// segment event with the recorded ones. Exit status 1 when they differ beyond what the
    /// unrecoverable start state explains.
    Validate(validate::Args),
    /// Simulate several jobs sharing one GPU: does the set fit, the combined peak and when it
    /// happens, and the smallest capacity that fits.
    Colocate(colocate::Args),
    /// Write one self-contained HTML page explaining a trace's memory: memory over the run by
    /// category, what is alive at the peak and where it was allocated, the segment map at the
    /// peak, a verdict per GPU profile, and with --estimate the estimators side by side.
    Report(report::Args),
    /// Show a GPU profile as memsim reads it (`--json` for programs: the Python side reads
    /// profiles through this).
    Profile(profile::Args),
}

fn run(cli: Cli) -> anyhow::Result<u8> {
    match cli.command {
        Command::Replay(a) => replay::run(a),
        Command::Stats(a) => stats::run(a),
        Command::Convert(a) => convert::run(a),
        Command::Validate(a) => validate::run(a),
        Command::Colocate(a) => colocate::run(a),
        Command::Profile(a) => profile::run(a),
        Command::Report(a) => report::run(a),
    }
}

/// `memsim ARGS...` (the first item is the program name): the exit status, after printing the
/// output and, on failure, the error chain on stderr (the one exit path, [`exit::main_with`]).
pub fn main(args: impl IntoIterator<Item = std::ffi::OsString>) -> u8 {
    exit::main_with("memsim", args, run)
}
