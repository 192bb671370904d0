//! `memest estimate`.

use std::path::PathBuf;

use anyhow::Context;
use estimators::estimate::{estimate, EstimateInput};
use estimators::features::Features;
use estimators::tracefile::LoadedTrace;
use simulator::profile::Profile;

#[derive(clap::Args)]
#[command(after_help = "JSON output (--json), the contract `python -m memtrace_trainer estimate` reads:\n  \
{\"estimates\": {\"symbolic\": {\"device_mib\", \"reserved_mib\", \"level\"}, \"analytic\": {...},\n  \
\"horus\": {...}, \"live_peak\": {...}, \"fake_tensor\": {...}|null, \"ml\": {...}|null},\n  \
\"seconds\": {NAME: s}, \"unavailable\": {NAME: why}, \"profile\", \"gpu_total_mib\", \"family\", \"oom_predicted\"}\n\
See estimators/README.md.")]
pub struct Args {
    /// Symbolic trace of the job (`python -m memtrace_trainer symtrace --out T`).
    #[arg(long)]
    trace: PathBuf,
    /// Features JSON of the job (`python -m memtrace_trainer features --json > F`).
    #[arg(long)]
    features: PathBuf,
    /// GPU profile: NAME (profiles/NAME.toml) or a path to a .toml file.
    #[arg(long, default_value = "a100-40gb")]
    profile: String,
    /// Plain-meta trace of the same job (`symtrace --no-cuda-emulation`) for the FakeTensor baseline.
    #[arg(long)]
    fake_trace: Option<PathBuf>,
    /// Batch size (default: from the features, else the trace's metadata).
    #[arg(long)]
    batch_size: Option<u64>,
    /// Trained ML model file (or $MEMTRACE_ML_MODEL); `ml` is null without one.
    #[arg(long)]
    ml_model: Option<PathBuf>,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let (profile, ppath) = Profile::load(&a.profile)?;
    let trace = LoadedTrace::load(&a.trace).with_context(|| format!("--trace {}", a.trace.display()))?;
    let plain = match &a.fake_trace {
        Some(p) => Some(LoadedTrace::load(p).with_context(|| format!("--fake-trace {}", p.display()))?),
        None => None,
    };
    let features = Features::load(&a.features)?;
    let ml_model = a.ml_model.clone().or_else(|| std::env::var_os("MEMTRACE_ML_MODEL").map(PathBuf::from));
    let ml = match ml_model {
        None => Err("no ML model given (--ml-model or $MEMTRACE_ML_MODEL)".to_string()),
        Some(m) => {
            let model = estimators::ml::modelfile::ModelFile::load(&m)?;
            let text =
                std::fs::read_to_string(&a.features).with_context(|| format!("--features {}", a.features.display()))?;
            let v: serde_json::Value = serde_json::from_str(&text)
                .with_context(|| format!("--features {}: not JSON", a.features.display()))?;
            let source = a.features.display().to_string();
            match estimators::ml::job::predict_job(&model, &v, &source) {
                Ok(p) => {
                    Ok(estimators::estimate::Answer { device_mib: p.estimate, reserved_mib: None, level: "device" })
                }
                Err(e) => Err(format!("{}: {e}", m.display())),
            }
        }
    };
    let report = estimate(&EstimateInput {
        trace: &trace,
        plain: plain.as_ref(),
        features: &features,
        profile: (&profile, &ppath),
        batch: a.batch_size,
        ml,
    })?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    println!("profile {} ({:.0} MiB), family {}", report.profile, report.gpu_total_mib, report.family);
    println!("{:<12} {:>12} {:>12}  {:<8} {:>10}", "estimator", "MiB", "reserved", "level", "seconds");
    for (name, ans) in &report.estimates {
        let secs = report.seconds.get(name).map_or(String::new(), |s| format!("{s:.4}"));
        match ans {
            Some(x) => println!(
                "{:<12} {:>12.1} {:>12}  {:<8} {:>10}",
                name,
                x.device_mib,
                x.reserved_mib.map_or("-".into(), |r| format!("{r:.1}")),
                x.level,
                secs
            ),
            None => println!("{:<12} {:>12}  ({})", name, "-", report.unavailable.get(name).map_or("", |s| s)),
        }
    }
    if report.oom_predicted == Some(true) {
        println!("symbolic: the job would run out of memory on this GPU");
    }
    Ok(())
}
