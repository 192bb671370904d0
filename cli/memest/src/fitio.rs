//! Arguments shared by the commands that fit a profile on `memest compare` runs.

use std::collections::BTreeSet;
use std::path::PathBuf;

use estimators::compare::{read_runs, RunRecord};

/// The licence recorded when `--data-licence` is not given.
const DEFAULT_LICENCE: &str = "CC BY-NC 4.0 (GPUMemNet datasets)";

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
    /// Licence of the runs' data, recorded in the written profile's provenance (with --write)
    /// [default: CC BY-NC 4.0 (GPUMemNet datasets)].
    #[arg(long)]
    pub data_licence: Option<String>,
    /// Print the fit as JSON.
    #[arg(long)]
    pub json: bool,
}

impl FitIo {
    /// The runs' paths, for provenance.
    pub fn runs_list(&self) -> String {
        self.runs.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
    }

    /// The licence to record.
    pub fn licence(&self) -> &str {
        self.data_licence.as_deref().unwrap_or(DEFAULT_LICENCE)
    }

    /// The run records of every file, each run once: a run read again (a file given twice, or
    /// runs repeated across files) was counted twice, in the fit and in its held-out share.
    /// Warns about what was dropped, about distinct runs that share an id, and about flags that
    /// have no effect.
    pub fn read(&self) -> anyhow::Result<Vec<RunRecord>> {
        if let (Some(l), None) = (&self.data_licence, &self.write) {
            eprintln!("memest: warning: --data-licence {l:?} has no effect without --write: it is recorded in the written profile");
        }
        let mut seen = BTreeSet::new();
        let all = read_runs(&self.runs)?;
        let total = all.len();
        // The whole record: distinct runs may share an id (two datasets with one file stem).
        let unique: Vec<RunRecord> =
            all.into_iter().filter(|r| seen.insert(serde_json::to_string(r).unwrap_or_default())).collect();
        if unique.len() < total {
            eprintln!(
                "memest: warning: {} of {total} run records repeat one already read (a runs.jsonl given twice?): each \
                 run is counted once",
                total - unique.len()
            );
        }
        let mut ids = BTreeSet::new();
        let shared: BTreeSet<&str> = unique.iter().filter(|r| !ids.insert(&r.id)).map(|r| r.id.as_str()).collect();
        if !shared.is_empty() {
            let first: Vec<&str> = shared.iter().take(3).copied().collect();
            eprintln!(
                "memest: warning: {} run ids belong to different runs (e.g. {}: datasets with the same file name?); all \
                 are kept, and the held-out split puts runs of one id on one side",
                shared.len(),
                first.join(", ")
            );
        }
        Ok(unique)
    }
}
