//! Arguments shared by the commands that fit a profile on `memest compare` runs.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use anyhow::Context;
use estimators::compare::{read_runs, RunRecord};
use estimators::rows::RowSet;
use simulator::profile::Profile;

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
    /// have no effect. A `--write` that is one of the runs files is refused (the profile would
    /// replace the runs).
    pub fn read(&self) -> anyhow::Result<Vec<RunRecord>> {
        if let Some(out) = &self.write {
            crate::outputs::refuse_input("--write", out, self.runs.iter().map(|r| ("the runs file", r.as_path())))?;
        }
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

/// The rows `profile` (read from `ppath`) was calibrated on (its `[calibration.rows]` and
/// `[calibration.row_digests]`), warning when some are named by position alone.
pub fn calibrated_rows(profile: &Profile, ppath: &Path) -> anyhow::Result<RowSet> {
    let calibrated = estimators::calibrate::calibrated_rows(&profile.calibration)
        .map_err(anyhow::Error::msg)
        .with_context(|| format!("{}", ppath.display()))?;
    let positional = calibrated.positional_stems();
    if !positional.is_empty() {
        eprintln!(
            "memest: warning: {} names its calibration rows of {} by position alone (no [calibration.row_digests]): \
             they are recognised only in a file of that stem with its rows in their order; `memest calibrate --write` \
             on runs from this memest records their digests",
            ppath.display(),
            positional.into_iter().collect::<Vec<_>>().join(", ")
        );
    }
    Ok(calibrated)
}
