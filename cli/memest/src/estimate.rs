//! `memest estimate`.

use std::path::PathBuf;

use anyhow::Context;
use estimators::estimate::{estimate, Answer, EstimateInput};
use estimators::estimate_text::EstimateText;
use estimators::features_file::FeaturesFile;
use estimators::tracefile::LoadedTrace;
use simulator::profile::Profile;
use simulator::units::parse_capacity;

#[derive(clap::Args)]
#[command(after_help = "Act on the symbolic estimate (the headline); the others are baselines, each \
labelled with what it ignores.\n\
Exit status: 0 fits, 1 does not fit the capacity, 2 bad input or error.\n\
JSON output (--json) is schema 3, the contract `python -m memtrace_trainer estimate` reads:\n  \
{\"schema\": 3, \"headline\": \"symbolic\", \"verdict\": {\"basis\", \"point_mib\", \"need_mib\", \
\"need_unbounded\" (why no device holds the need; the MiB are then null), \"capacity_mib\", \"capacity_source\", \
\"fits\", \"allocator_budget_mib\", \"need_at_capacity\" (the need is the replay at this capacity's budget)},\n  \"estimates\": {NAME: {\"device_mib\", \"reserved_mib\", \
\"allocated_mib\", \"safe_mib\" (symbolic), \"reserved_oom_floor\" (symbolic, only when true: the \
reserved is a failed allocation's floor), \"steps\" (symbolic, with iteration markers), \"level\", \"role\", \
\"ignores\"}|null},\n  \"outside_allocator\": {...}, \"margin\": {...}, \"seconds\", \"unavailable\", \"profile\", \
\"profile_name\", \"gpu\", \"gpu_total_mib\", \"family\", \"oom_predicted\", \"warnings\",\n  \
\"text\": {\"headline\", \"verdict\", \"details\", \"baselines\"}}\n\
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
    #[arg(long, value_parser = parse_capacity, value_name = "SIZE", allow_negative_numbers = true)]
    capacity: Option<u64>,
    #[arg(long, help = memsim_cli::STRICT_HELP)]
    strict: bool,
    /// Judge the fit on the point estimate (peak reserved plus memory outside the allocator)
    /// instead of the safe number (the point plus the profile's calibrated margin for the job's
    /// family and regime).
    #[arg(long)]
    point: bool,
    /// Plain-meta trace of the same job (`symtrace --no-cuda-emulation`) for the FakeTensor baseline.
    #[arg(long)]
    fake_trace: Option<PathBuf>,
    /// Batch size (default: from the features, else the trace's metadata).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..), allow_negative_numbers = true)]
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
    // The one --strict rule (memsim's: an input cut short, a state-only snapshot's trace); the
    // warnings themselves (the same lines, `LoadedTrace::warnings`) reach the report below.
    for t in std::iter::once(&trace).chain(plain.as_ref()) {
        memsim_cli::input_warnings(&t.header, Some(&t.summary), &t.path, a.strict)?;
    }
    let file = a.features.as_deref().map(FeaturesFile::load).transpose()?;
    let mut warnings: Vec<String> = file.iter().flat_map(|f| f.warnings.iter().cloned()).collect();
    if a.features.is_none() {
        // Only the feature-based baselines (analytic, Horus, ML) use these.
        let unused = [
            a.batch_size.map(|b| format!("--batch-size {b}")),
            a.ml_model.as_ref().map(|m| format!("--ml-model {}", m.display())),
        ];
        for flag in unused.into_iter().flatten() {
            eprintln!(
                "memest: warning: {flag} has no effect without --features: only the feature-based baselines \
                 (analytic, Horus, ML) use it"
            );
        }
    }
    let ml_model = a.ml_model.clone().or_else(|| std::env::var_os("MEMTRACE_ML_MODEL").map(PathBuf::from));
    let ml = match (ml_model, &file) {
        (None, _) => Err("no ML model given (--ml-model or $MEMTRACE_ML_MODEL)".to_string()),
        (Some(_), None) => Err("needs the model's features (--features)".to_string()),
        (Some(m), Some(file)) => {
            let from = if a.ml_model.is_some() { "--ml-model" } else { "$MEMTRACE_ML_MODEL" };
            let model =
                estimators::ml::modelfile::ModelFile::load(&m).with_context(|| format!("{from} {}", m.display()))?;
            let source = a.features.as_deref().map(|p| p.display().to_string()).unwrap_or_default();
            match estimators::ml::job::predict_job(&model, &m, file, &source) {
                Ok(p) => {
                    warnings.extend(p.warnings.iter().map(|w| format!("ml: {w}")));
                    // A negative answer is no memory figure: null, with the reason.
                    match p.prediction.mib() {
                        Ok(mib) => Ok(Answer::baseline("ml", mib, None, "device")),
                        Err(why) => Err(format!("{}: {why}", m.display())),
                    }
                }
                Err(e) => Err(format!("{}: {e}", m.display())),
            }
        }
    };
    let features = file.as_ref().map(|f| &f.features);
    let report = estimate(&EstimateInput {
        trace: &trace,
        plain: plain.as_ref(),
        features,
        profile: (&profile, &ppath),
        capacity: a.capacity,
        batch: a.batch_size,
        point: a.point,
        ml,
    })?;
    let mut report = report;
    // What the features file and the ML model could not vouch for, before the estimate's own.
    warnings.append(&mut report.warnings);
    report.warnings = warnings;
    if a.point {
        // memsim's rule and words: an estimate always has a verdict.
        report.warnings.extend(memsim_cli::point_without_effect(true, &[&report.margin]));
    }
    for w in &report.warnings {
        eprintln!("memest: warning: {}", trace::terminal::printable(w));
    }
    let code = if report.verdict.fits { 0u8 } else { 1u8 };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", trace::terminal::printable_lines(&report.text.render()));
    }
    Ok(code)
}

#[derive(clap::Args)]
#[command(after_help = "Exit status: 0 worded, 2 bad input (the file, and the field that is missing or \
of the wrong type, or verdict numbers that contradict each other: a `verdict.fits` against its need and \
capacity, a basis not the headline's, a `point_mib` not the headline's `device_mib`, a `need_mib` not the \
number its basis names, a safe need or `safe_mib` below the point; parts the writer derives that contradict \
their whole: an `outside_allocator.total_mib` not its terms' sum, a step's peak above the headline's, a `safe_mib` \
not the point plus the margin).\nJSON output (--json): {\"headline\", \"verdict\", \"details\": [lines], \
\"baselines\": [lines]}, the `text` object of `memest estimate --json`.")]
pub struct RenderArgs {
    /// The estimate: `memest estimate --json` or `python -m memtrace_trainer estimate --json`
    /// output (`-` reads stdin).
    #[arg(value_name = "EST.json")]
    file: PathBuf,
    /// Print the parts (headline, verdict, detail and baseline lines) as JSON.
    #[arg(long)]
    json: bool,
}

/// `memest render`.
pub fn render(a: RenderArgs) -> anyhow::Result<()> {
    let stdin = a.file.as_os_str() == "-";
    let name = if stdin { "stdin".to_string() } else { a.file.display().to_string() };
    let text = if stdin {
        std::io::read_to_string(std::io::stdin()).context("reading the estimate from stdin")?
    } else {
        trace::read_small_string(&a.file, 256 << 20).with_context(|| format!("cannot read {name}"))?
    };
    // The one parser of the format, which `memsim report --estimate` reads through too.
    let view = estimators::estimate_file::parse(&text).map_err(|e| anyhow::anyhow!("{name}: {e}"))?.view;
    let words = EstimateText::of(&view);
    if a.json {
        println!("{}", serde_json::to_string_pretty(&words)?);
    } else {
        print!("{}", trace::terminal::printable_lines(&words.render()));
    }
    Ok(())
}
