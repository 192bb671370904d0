//! `memest estimate`.

use std::path::PathBuf;

use anyhow::Context;
use estimators::estimate::{estimate, Answer, EstimateInput, EstimateReport};
use estimators::features::Features;
use estimators::tracefile::LoadedTrace;
use simulator::profile::Profile;
use simulator::units::parse_size;

#[derive(clap::Args)]
#[command(after_help = "Act on the symbolic estimate (the headline); the others are baselines, each \
labelled with what it ignores.\n\
Exit status: 0 fits, 1 does not fit the capacity, 2 bad input or error.\n\
JSON output (--json) is schema 2, the contract `python -m memtrace_trainer estimate` reads:\n  \
{\"schema\": 2, \"headline\": \"symbolic\", \"verdict\": {\"basis\", \"need_mib\", \"capacity_mib\", \
\"capacity_source\", \"fits\"},\n  \"estimates\": {NAME: {\"device_mib\", \"reserved_mib\", \"allocated_mib\", \
\"level\", \"role\", \"ignores\"}|null},\n  \"outside_allocator\": {...}, \"seconds\", \"unavailable\", \
\"profile\", \"profile_name\", \"gpu\", \"gpu_total_mib\", \"family\", \"oom_predicted\", \"warnings\"}\n\
See estimators/README.md.")]
pub struct Args {
    /// Symbolic trace of the job (`python -m memtrace_trainer symtrace --out T`).
    #[arg(long)]
    trace: PathBuf,
    /// Features JSON of the job (`python -m memtrace_trainer features --json > F`). Without it
    /// (a step function's trace) the feature-based baselines (analytic, Horus, ML) are null.
    #[arg(long)]
    features: Option<PathBuf>,
    /// GPU profile: NAME (profiles/NAME.toml) or a path to a .toml file.
    #[arg(long, default_value = simulator::profile::DEFAULT_PROFILE)]
    profile: String,
    /// The GPU's total memory (e.g. 40GiB, 40960MiB); the memory outside the allocator is
    /// subtracted inside. Default: the profile's total memory.
    #[arg(long, value_parser = parse_size, value_name = "SIZE")]
    capacity: Option<u64>,
    /// A truncated trace is an error (exit 2) instead of a warning.
    #[arg(long)]
    strict: bool,
    /// Judge the fit on the point estimate instead of the safe number (point + the profile's
    /// calibrated margin for the job's family and regime).
    #[arg(long)]
    point: bool,
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

pub fn run(a: Args) -> anyhow::Result<u8> {
    let (profile, ppath) = Profile::load(&a.profile)?;
    let trace = LoadedTrace::load(&a.trace).with_context(|| format!("--trace {}", a.trace.display()))?;
    let plain = match &a.fake_trace {
        Some(p) => Some(LoadedTrace::load(p).with_context(|| format!("--fake-trace {}", p.display()))?),
        None => None,
    };
    // The one --strict rule (memsim's); the warnings themselves reach the report below.
    for t in std::iter::once(&trace).chain(plain.as_ref()) {
        memsim_cli::summary_warnings(Some(&t.summary), &t.path, a.strict)?;
    }
    let features = a.features.as_deref().map(Features::load).transpose()?;
    let ml_model = a.ml_model.clone().or_else(|| std::env::var_os("MEMTRACE_ML_MODEL").map(PathBuf::from));
    let ml = match (ml_model, &a.features) {
        (None, _) => Err("no ML model given (--ml-model or $MEMTRACE_ML_MODEL)".to_string()),
        (Some(_), None) => Err("needs the model's features (--features)".to_string()),
        (Some(m), Some(fpath)) => {
            let model = estimators::ml::modelfile::ModelFile::load(&m)?;
            let text = std::fs::read_to_string(fpath).with_context(|| format!("--features {}", fpath.display()))?;
            let v: serde_json::Value =
                serde_json::from_str(&text).with_context(|| format!("--features {}: not JSON", fpath.display()))?;
            let source = fpath.display().to_string();
            match estimators::ml::job::predict_job(&model, &v, &source) {
                Ok(p) => Ok(Answer::baseline("ml", p.estimate, None, "device")),
                Err(e) => Err(format!("{}: {e}", m.display())),
            }
        }
    };
    let report = estimate(&EstimateInput {
        trace: &trace,
        plain: plain.as_ref(),
        features: features.as_ref(),
        profile: (&profile, &ppath),
        capacity: a.capacity,
        batch: a.batch_size,
        point: a.point,
        ml,
    })?;
    let mut report = report;
    if a.point && report.margin.fraction == 0.0 {
        report
            .warnings
            .push(format!("--point has no effect: the safe number is the point here ({})", report.margin.note));
    }
    for w in &report.warnings {
        eprintln!("memest: warning: {w}");
    }
    let code = if report.verdict.fits { 0u8 } else { 1u8 };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", render(&report));
    }
    Ok(code)
}

/// The text report: the verdict on the headline number first, then the baselines.
pub fn render(r: &EstimateReport) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let v = &r.verdict;
    let src = v.capacity_source.describe();
    let point = if v.basis.ends_with("safe_mib") { format!("point {:.1}", v.point_mib) } else { "point".into() };
    let _ = writeln!(
        s,
        "needs {:.1} MiB on {} ({point}): {}",
        v.need_mib,
        r.gpu,
        if v.fits { "FITS" } else { "DOES NOT FIT" }
    );
    let _ = writeln!(s, "  capacity {:.1} MiB ({src}); margin: {}", v.capacity_mib, r.margin.note);
    if let Some(Some(sym)) = r.estimates.get("symbolic") {
        let o = &r.outside_allocator;
        let _ = writeln!(
            s,
            "  symbolic: peak reserved {:.1} MiB (peak allocated {:.1} MiB) + outside the allocator {:.1} MiB \
             (context {:.1}, cuBLAS {:.1}, cuDNN {:.1}, NCCL {:.1}; libraries from {})",
            sym.reserved_mib.unwrap_or(0.0),
            sym.allocated_mib.unwrap_or(0.0),
            o.total_mib,
            o.context_mib,
            o.cublas_mib,
            o.cudnn_mib,
            o.nccl_mib,
            o.libraries.source
        );
        if let Some(st) = &sym.steps {
            let steady = match st.steady_device_mib {
                Some(m) => format!("steady (steps 2-{}) {m:.1} MiB", st.count),
                None => "one step traced: no steady state".into(),
            };
            let _ = writeln!(s, "  per step: first {:.1} MiB, {steady} (device level)", st.first_step_device_mib);
        }
    }
    let _ = writeln!(s, "  profile {} ({}), family {}", r.profile_name, r.profile, r.family);
    let _ = writeln!(s, "baselines (for comparison, not for decisions):");
    for (name, ans) in r.estimates.iter().filter(|(n, _)| n.as_str() != r.headline) {
        match ans {
            Some(x) => {
                let _ = writeln!(s, "  {:<12} {:>10.1} MiB  {:<6}  ignores {}", name, x.device_mib, x.level, x.ignores);
            }
            None => {
                let _ = writeln!(s, "  {:<12} {:>10}      ({})", name, "-", r.unavailable.get(name).map_or("", |s| s));
            }
        }
    }
    s
}
