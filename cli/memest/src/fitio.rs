//! Arguments shared by the commands that fit a profile on `memest compare` runs.

use std::path::PathBuf;

/// Inputs and outputs of a profile fit (`memest calibrate`, `memest safety`).
#[derive(clap::Args)]
pub struct FitIo {
    /// runs.jsonl files from `memest compare`.
    #[arg(required = true)]
    pub runs: Vec<PathBuf>,
    /// The profile the runs were estimated with (its constants are the priors, and --write starts
    /// from it).
    #[arg(long, default_value = simulator::profile::DEFAULT_PROFILE)]
    pub profile: String,
    /// Write the fitted profile here (atomically); otherwise only report the fit.
    #[arg(long)]
    pub write: Option<PathBuf>,
    /// Licence of the runs' data, recorded in the profile's provenance.
    #[arg(long, default_value = "CC BY-NC 4.0 (GPUMemNet datasets)")]
    pub data_licence: String,
    /// Print the fit as JSON.
    #[arg(long)]
    pub json: bool,
}

impl FitIo {
    /// The runs' paths, for provenance.
    pub fn runs_list(&self) -> String {
        self.runs.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
    }
}
