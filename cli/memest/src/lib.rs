//! memest: estimate a training job's GPU memory with every estimator, compare estimators on
//! measured runs, and calibrate GPU profiles.

mod calibrate;
mod compare;
mod compare_ml;
mod estimate;
mod fitio;
pub mod ml;
mod outputs;
mod safety;
pub mod utilization;

use clap::{Parser, Subcommand};

/// Estimate how much GPU memory a training job needs.
///
/// Estimators: `symbolic` (meta-device trace replayed through memsim's model of PyTorch's caching
/// allocator, plus the GPU profile's memory outside the allocator), `analytic` (closed form),
/// `horus` (the Horus formula as GPUMemNet implemented it), `fake_tensor` (the FakeTensor
/// baseline: live bytes of forward and backward, no optimizer, no allocator), `live_peak` (our
/// trace's live bytes without the allocator model) and `ml` (GPUMemNet-style models).
#[derive(Parser)]
#[command(
    name = "memest",
    version,
    about,
    long_about,
    after_help = "Exit status: 0 success or fits; 1 does not fit (estimate); 2 bad input or error."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Every estimator's answer for one job (a symbolic trace plus its features), in MiB.
    Estimate(estimate::Args),
    /// Word an estimate JSON (`memest estimate --json`, or the trainer's `estimate --json`) as
    /// `memest estimate` prints it; `--json` prints the parts every other view joins.
    Render(estimate::RenderArgs),
    /// Run every estimator on a dataset of measured runs and report metrics, tables and plots.
    Compare(compare::Args),
    /// Fit a profile's outside-allocator constants (context, cuBLAS, cuDNN) on measured runs.
    Calibrate(calibrate::Args),
    /// Fit the safety margins of a profile (split conformal prediction on measured runs).
    Safety(safety::Args),
    /// Train, apply and evaluate GPUMemNet-style ML estimators (`memest ml --help`).
    Ml(ml::MlArgs),
    /// Classify GPU utilization (DCGM SMACT/SMOCC classes) from model features (`memest util --help`).
    Util(utilization::UtilArgs),
}

fn run(cli: Cli) -> anyhow::Result<u8> {
    match cli.command {
        Command::Estimate(a) => estimate::run(a),
        Command::Render(a) => estimate::render(a).map(|()| 0u8),
        Command::Compare(a) => compare::run(a).map(|()| 0u8),
        Command::Calibrate(a) => calibrate::run(a).map(|()| 0u8),
        Command::Safety(a) => safety::run(a).map(|()| 0u8),
        Command::Ml(a) => ml::run(a),
        Command::Util(a) => utilization::run(a),
    }
}

/// `memest ARGS...` (the first item is the program name): the exit status, after printing the
/// output and, on failure, the error chain on stderr (the one exit path, [`memsim_cli::exit::main_with`]).
pub fn main(args: impl IntoIterator<Item = std::ffi::OsString>) -> u8 {
    memsim_cli::exit::main_with("memest", args, run)
}
