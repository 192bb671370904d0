//! `memest compare`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context;
use estimators::analytic::{Optimizer, Precision};
use estimators::compare::{aggregate, evaluate_row, read_runs, EvalContext, MlModels, Outcome, RunRecord};
use estimators::dataset::{seeded_subset, DatasetRow, Spec};
use estimators::error::write_atomic;
use estimators::symbolic::profile_version;
use estimators::trace_jobs::{trace_parallel, TraceJob, TraceResult, Trainer};
use estimators::{plots, report};
use indicatif::{ProgressBar, ProgressStyle};
use rayon::prelude::*;
use simulator::profile::Profile;

#[derive(clap::Args)]
#[command(after_help = "Writes into --out: report.md, metrics.json, runs.csv, runs.jsonl (input of `memest \
calibrate`), plots (*.svg, *.png) and traces/ (the rebuilt symbolic traces).\n\
Example: memest compare --dataset ../shared/data/gpumemnet/mlp_data_step2.csv --limit 200 --seed 1 --out out/cmp")]
pub struct Args {
    /// Dataset of measured runs (repeatable): a GPUMemNet-format CSV, or the trainer's `dataset`
    /// output (its `spec`, `optimizer` and `amp` columns say how to rebuild each row).
    #[arg(long, required = true)]
    dataset: Vec<PathBuf>,
    /// Output directory.
    #[arg(long)]
    out: PathBuf,
    /// GPU profile the runs were measured on.
    #[arg(long, default_value = simulator::profile::DEFAULT_PROFILE)]
    profile: String,
    /// A seeded random subset of this many rows per dataset (default: all rows).
    #[arg(long, allow_negative_numbers = true)]
    limit: Option<usize>,
    /// Seed of the subset (default 1; with --limit).
    #[arg(long, allow_negative_numbers = true)]
    seed: Option<u64>,
    /// Optimizer the runs trained with (GPUMemNet: adam).
    #[arg(long, default_value = "adam")]
    optimizer: String,
    /// Skip the plain-meta traces of the FakeTensor baseline (halves tracing time).
    #[arg(long)]
    no_fake_tensor: bool,
    /// Reuse traces already in OUT/traces instead of tracing again.
    #[arg(long)]
    reuse_traces: bool,
    /// Leave out rows whose id appears in these runs.jsonl files (e.g. the runs a profile was
    /// calibrated on), so an evaluation never reuses fitting data.
    #[arg(long)]
    exclude_runs: Vec<PathBuf>,
    /// Leave out the rows the profile was calibrated on (its `[calibration.rows]`). Without it
    /// they are scored, marked `calibrated_on` in runs.csv, and the report counts them.
    #[arg(long)]
    exclude_calibrated: bool,
    /// Trainer processes tracing at once (default 1); with `--backend slurm`, the array tasks.
    /// With --reuse-traces an interrupted run resumes where it stopped.
    #[arg(long, default_value_t = 1, allow_negative_numbers = true)]
    jobs: usize,
    /// Where the traces are made: `local` (trainer processes here) or `slurm` (one Slurm job
    /// array through submitit, `symtrace --batch --backend slurm`; resumable the same way).
    #[arg(long, value_parser = ["local", "slurm"], default_value = "local")]
    backend: String,
    /// submitit executor of `--backend slurm`: `slurm`, or `local`/`debug` to run the same array
    /// on this machine.
    #[arg(long, value_parser = ["slurm", "local", "debug"], default_value = "slurm")]
    submitit_cluster: String,
    /// Slurm partition of `--backend slurm`.
    #[arg(long)]
    partition: Option<String>,
    /// Time limit per array task of `--backend slurm`, minutes.
    #[arg(long, default_value_t = 60, allow_negative_numbers = true)]
    timeout_min: u32,
    /// Trained ML model file from `memest ml train` (repeatable, one per family; default
    /// $MEMTRACE_ML_MODEL). Without one, `ml` is null with the reason.
    #[arg(long)]
    ml_model: Vec<PathBuf>,
    /// Also apply an ML model to the rows of the dataset it was trained on (in-sample: not a
    /// held-out result; the report says so).
    #[arg(long)]
    ml_include_training_rows: bool,
    /// Print the metrics JSON to stdout.
    #[arg(long)]
    json: bool,
}

/// The files written into --out, beside the plots.
const OUTPUTS: [&str; 4] = ["report.md", "metrics.json", "runs.csv", "runs.jsonl"];

fn bar(len: usize, what: &str) -> ProgressBar {
    let pb = ProgressBar::new(len as u64);
    if let Ok(style) =
        ProgressStyle::with_template("{prefix:>9} [{bar:30}] {pos}/{len} {elapsed_precise} eta {eta} {msg}")
    {
        pb.set_style(style.progress_chars("=> "));
    }
    pb.set_prefix(what.to_string());
    pb
}

pub fn run(a: Args) -> anyhow::Result<()> {
    if a.jobs == 0 {
        anyhow::bail!("--jobs 0: expected at least 1 tracing process");
    }
    if a.limit == Some(0) {
        anyhow::bail!("--limit 0: expected at least 1 row per dataset");
    }
    // Rows (and their traces) are named by the dataset file's stem: two files of one stem would
    // score one file's rows with the other's traces.
    let mut stems: BTreeMap<String, &PathBuf> = Default::default();
    for d in &a.dataset {
        let stem = d.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        if let Some(other) = stems.insert(stem.clone(), d) {
            anyhow::bail!(
                "--dataset {}: its rows are named {stem}-NNNNN by the file's stem, as are those of --dataset {}: \
                 their rows and traces would be mixed up; give each file once, under names of different stems",
                d.display(),
                other.display()
            );
        }
    }
    if a.seed.is_some() && a.limit.is_none() {
        eprintln!("memest: warning: --seed has no effect without --limit: every row is used");
    }
    let seed = a.seed.unwrap_or(1);
    let (profile, ppath) = Profile::load(&a.profile)?;
    let version = profile_version(&profile, &ppath)?;
    let optimizer: Optimizer = a.optimizer.parse().map_err(anyhow::Error::msg).context("--optimizer")?;
    let mut excluded = estimators::rows::RowSet::default();
    for r in read_runs(&a.exclude_runs).context("--exclude-runs")? {
        excluded.insert(&r.id, &r.digest);
    }
    let mut model_paths = a.ml_model.clone();
    if model_paths.is_empty() {
        model_paths.extend(std::env::var_os("MEMTRACE_ML_MODEL").map(PathBuf::from));
    }
    // Every file written into --out, against every input: `--out` where the --dataset's
    // runs.csv (or the --exclude-runs file) lies replaced it.
    let inputs: Vec<(&str, &Path)> = a
        .dataset
        .iter()
        .map(|d| ("the --dataset", d.as_path()))
        .chain(a.exclude_runs.iter().map(|r| ("the --exclude-runs file", r.as_path())))
        .chain(model_paths.iter().map(|m| ("the --ml-model", m.as_path())))
        .chain([("the --profile", ppath.as_path())])
        .collect();
    let flag = format!("--out {}: its file", a.out.display());
    for file in OUTPUTS.iter().map(|f| a.out.join(f)).chain(plots::files(&a.out)) {
        crate::outputs::refuse_input(&flag, &file, inputs.iter().copied())?;
    }
    let mut loaded = Vec::new();
    for p in model_paths {
        let m =
            estimators::ml::modelfile::ModelFile::load(&p).with_context(|| format!("--ml-model {}", p.display()))?;
        loaded.push((p, m));
    }
    let ml_models = if loaded.is_empty() { None } else { Some(MlModels::new(loaded)?) };
    if a.ml_include_training_rows && ml_models.is_none() {
        eprintln!(
            "memest: warning: --ml-include-training-rows has no effect: no ML model given (--ml-model or \
             $MEMTRACE_ML_MODEL)"
        );
    }
    // (row, the dataset it came from) — ML needs the source file to recognise training rows.
    let calibrated = crate::fitio::calibrated_rows(&profile, &ppath)?;
    if a.exclude_calibrated && calibrated.is_empty() {
        eprintln!(
            "memest: warning: --exclude-calibrated has no effect: {} lists no [calibration.rows]",
            ppath.display()
        );
    }
    let mut rows: Vec<(DatasetRow, usize)> = Vec::new();
    let (mut read, mut left_out, mut by_runs) = (0, 0, 0);
    for (di, d) in a.dataset.iter().enumerate() {
        let loaded = estimators::dataset::load(d, &[])?;
        estimators::dataset::refuse_past_any_device(d, &loaded.rows)?;
        for w in &loaded.warnings {
            eprintln!("memest: warning: {}", trace::terminal::printable(w));
        }
        let mut all = loaded.rows;
        let n_read = all.len();
        read += n_read;
        all.retain(|r| !excluded.contains(&r.id, &r.digest));
        by_runs += n_read - all.len();
        if a.exclude_calibrated {
            all.retain(|r| !calibrated.contains(&r.id, &r.digest));
        }
        left_out += n_read - all.len();
        let chosen = match a.limit {
            Some(n) if n >= all.len() => {
                eprintln!(
                    "memest: warning: --limit {n} has no effect on --dataset {}: it has {} rows{}, and every one is used",
                    d.display(),
                    all.len(),
                    if all.len() < n_read { " left to compare" } else { "" }
                );
                all
            }
            Some(n) => seeded_subset(&all, n, seed),
            None => all,
        };
        rows.extend(chosen.into_iter().map(|r| (r, di)));
    }
    if !a.exclude_runs.is_empty() && by_runs == 0 {
        let files: Vec<String> = a.exclude_runs.iter().map(|p| p.display().to_string()).collect();
        eprintln!(
            "memest: warning: --exclude-runs has no effect: none of the {} runs of {} matches a row of the datasets \
             (by content digest, else by id): every row is compared",
            excluded.len(),
            files.join(", ")
        );
    }
    let ml_notes = ml_models
        .as_ref()
        .map_or_else(Vec::new, |m| crate::compare_ml::training_notes(m, &rows, &a.dataset, a.ml_include_training_rows));
    if rows.is_empty() {
        anyhow::bail!(
            "no row to compare: the datasets hold {read} rows{}",
            if left_out == 0 {
                String::new()
            } else {
                format!(
                    " and all of them were left out ({left_out} by {})",
                    match (a.exclude_runs.is_empty(), a.exclude_calibrated) {
                        (false, true) => "--exclude-runs and --exclude-calibrated",
                        (false, false) => "--exclude-runs",
                        _ => "--exclude-calibrated",
                    }
                )
            }
        );
    }
    // One profile traces and scores every row: runs measured on another GPU are said to be. A
    // GPU is its profile's `[gpu]` (a calibrated copy of the same GPU's profile is that GPU),
    // by name where the row's profile cannot be read here.
    let pname = Profile::name_of(&ppath);
    let same_gpu = |p: &str| match Profile::load(p) {
        Ok((other, _)) => other.gpu.name == profile.gpu.name && other.gpu.total_memory == profile.gpu.total_memory,
        Err(_) => Profile::name_of(Path::new(p)) == pname,
    };
    let mut judged: BTreeMap<&str, bool> = BTreeMap::new();
    let mut elsewhere: BTreeMap<String, usize> = BTreeMap::new();
    for (r, _) in &rows {
        if let Some(p) = r.profile.as_deref() {
            if !*judged.entry(p).or_insert_with(|| same_gpu(p)) {
                *elsewhere.entry(Profile::name_of(Path::new(p))).or_default() += 1;
            }
        } else if let Some(g) = r.gpu.as_deref().filter(|g| !g.eq_ignore_ascii_case(profile.gpu.name.trim())) {
            // A GPU no profile is known of (the trainer's `dataset` leaves `profile` empty).
            *elsewhere.entry(g.to_string()).or_default() += 1;
        }
    }
    if !elsewhere.is_empty() {
        let list: Vec<String> = elsewhere.iter().map(|(p, n)| format!("{n} on {p}")).collect();
        eprintln!(
            "memest: warning: {} of the {} rows were measured on another GPU than --profile {pname} ({}, by the \
             dataset's `profile` or `gpu` column): they are traced and judged as {pname}'s; compare them with their \
             own --profile",
            elsewhere.values().sum::<usize>(),
            rows.len(),
            list.join(", ")
        );
    }
    let unlabelled = rows.iter().filter(|(r, _)| r.truth.is_none() && !r.real_oom).count();
    if unlabelled == rows.len() {
        eprintln!(
            "memest: warning: none of the {} rows has a measured peak (truth): every estimator is run, but no \
             error, PEF or MCP can be scored",
            rows.len()
        );
    } else if unlabelled > 0 {
        eprintln!(
            "memest: warning: {unlabelled} of the {} rows have no measured peak (truth): estimated, not scored",
            rows.len()
        );
    }
    let zero = rows.iter().filter(|(r, _)| !r.real_oom && r.truth == Some(0.0)).count();
    if zero > 0 {
        eprintln!(
            "memest: warning: {zero} of the {} rows have a measured peak of 0 MiB (a failed measurement, not a \
             peak): estimated, but left out of the errors, PEF and MCP (report.md says so)",
            rows.len()
        );
    }
    std::fs::create_dir_all(&a.out).with_context(|| format!("cannot create {}", a.out.display()))?;
    let tdir = a.out.join("traces");
    let mut jobs = Vec::new();
    for (r, _) in &rows {
        let job = |plain: bool| TraceJob {
            name: if plain { format!("{}-plain", r.id) } else { r.id.clone() },
            model: r.spec.as_str().to_string(),
            entry: matches!(r.spec, Spec::Entry(_)),
            batch_size: r.batch,
            optimizer: r.optimizer.clone().unwrap_or_else(|| a.optimizer.clone()),
            amp: r.amp.clone(),
            plain_meta: plain,
            // The runs' GPU: its library workspaces and attention backends are emulated.
            profile: Some(ppath.display().to_string()),
            options: r.job.clone(),
        };
        jobs.push(job(false));
        if !a.no_fake_tensor {
            jobs.push(job(true));
        }
    }
    let existing = |j: &TraceJob| tdir.join(format!("{}.jsonl", j.name));
    if a.reuse_traces && !tdir.is_dir() {
        eprintln!(
            "memest: warning: --reuse-traces has no effect: {} does not exist; tracing every row",
            tdir.display()
        );
    }
    // A trace made with other settings (another --optimizer, profile or batch) is not this row's.
    let mut stale = Vec::new();
    let (reused, todo): (Vec<TraceJob>, Vec<TraceJob>) = jobs.into_iter().partition(|j| {
        let path = existing(j);
        if !(a.reuse_traces && path.is_file()) {
            return false;
        }
        match traced_otherwise(&path, j, &Profile::name_of(&ppath)) {
            None => true,
            Some(why) => {
                stale.push(format!("{}: {why}", path.display()));
                false
            }
        }
    });
    if let Some(first) = stale.first() {
        eprintln!(
            "memest: warning: --reuse-traces: {} traces were made with other settings and are traced again (the \
             first: {first})",
            stale.len()
        );
    }
    // On a cluster the array is the parallelism: one submitting trainer process here.
    let (trainer, workers) = if a.backend == "slurm" {
        let mut extra = vec![
            "--backend".to_string(),
            "slurm".into(),
            "--submitit-cluster".into(),
            a.submitit_cluster.clone(),
            "--array-parallelism".into(),
            a.jobs.to_string(),
            "--timeout-min".into(),
            a.timeout_min.to_string(),
        ];
        if let Some(p) = &a.partition {
            extra.extend(["--partition".to_string(), p.clone()]);
        }
        (Trainer { extra_args: extra, ..Trainer::local() }, 1)
    } else {
        let slurm_only = [
            ("--partition", a.partition.is_some()),
            ("--submitit-cluster", a.submitit_cluster != "slurm"),
            ("--timeout-min", a.timeout_min != 60),
        ];
        for (flag, given) in slurm_only {
            if given {
                eprintln!("memest: warning: {flag} has no effect without --backend slurm");
            }
        }
        (Trainer::local(), a.jobs)
    };
    let pb = bar(todo.len(), "tracing");
    let mut traces = if todo.is_empty() {
        Default::default()
    } else {
        trace_parallel(&trainer, &todo, &tdir, workers, |name| {
            pb.set_message(name.to_string());
            pb.inc(1);
        })?
    };
    pb.finish_and_clear();
    // What the trainer said of the rows' settings (one with no effect on the model, a default it
    // chose) reaches the user: the row's trace is of what it did with them.
    let said: Vec<String> =
        traces.iter().flat_map(|(name, t)| t.warnings.iter().map(move |w| format!("{name}: {w}"))).collect();
    if let Some(first) = said.first() {
        eprintln!(
            "memest: warning: the trainer gave {} warnings while tracing the rows (the first: {first})",
            said.len()
        );
    }
    // Each trace's job settings beside it: the header does not say them all (a sequence length,
    // an input shape), and a reused trace must be of the same job.
    for j in &todo {
        if matches!(traces.get(&j.name), Some(TraceResult { trace: Ok(_), .. })) {
            let text = serde_json::to_string(&j.options)?;
            write_atomic(&job_file(&tdir, &j.name), text.as_bytes())?;
        }
    }
    for j in reused {
        traces.insert(j.name.clone(), TraceResult { trace: Ok(existing(&j)), seconds: f64::NAN, warnings: Vec::new() });
    }
    let ctx = EvalContext { profile: &profile, profile_name: &pname, version, optimizer, precision: Precision::Fp32 };
    let pb = bar(rows.len(), "estimating");
    let lookup = |name: &str| -> Result<(PathBuf, f64), String> {
        match traces.get(name) {
            None => Err("not traced (--no-fake-tensor)".into()),
            Some(t) => t.trace.clone().map(|p| (p, t.seconds)),
        }
    };
    // Every row's replays run in this process, one row per core, in the rows' order.
    let records: Vec<RunRecord> = rows
        .par_iter()
        .map(|(r, di)| {
            let main = lookup(&r.id);
            let plain = lookup(&format!("{}-plain", r.id));
            let ml = match &ml_models {
                None => Outcome::failed("no ML model given (--ml-model or $MEMTRACE_ML_MODEL)"),
                Some(m) => m.outcome(r, &a.dataset[*di], a.ml_include_training_rows),
            };
            let mut rec = evaluate_row(r, borrow(&main), borrow(&plain), &ctx, ml);
            rec.calibrated_on = calibrated.contains(&rec.id, &rec.digest);
            pb.inc(1);
            rec
        })
        .collect();
    pb.finish_and_clear();
    let ml_outside = ml_models.as_ref().and_then(|m| crate::compare_ml::outside_training(m, &records));
    crate::compare_ml::trace_warnings(&records);
    crate::compare_ml::untraced(&records);
    let groups = aggregate(&records, profile.gpu.total_memory as f64);
    let mut truth_cols: BTreeMap<&str, usize> = Default::default();
    for (r, _) in rows.iter().filter(|(r, _)| r.truth.is_some()) {
        *truth_cols.entry(r.truth_column).or_default() += 1;
    }
    let truth_note = if truth_cols.is_empty() {
        "none (no row has a measured peak, so nothing is scored)".to_string()
    } else {
        truth_cols.iter().map(|(c, n)| format!("`{c}` for {n} rows")).collect::<Vec<_>>().join(", ")
    };
    let reserved_rows = rows.iter().filter(|(r, _)| r.reserved_truth.is_some()).count();
    let in_sample = records.iter().filter(|r| r.calibrated_on).count();
    let mut extra = String::new();
    extra += &format!(
        "\n\nCalibration: the profile's outside-allocator constants were fitted on {} rows ([calibration.rows] of {}). {}",
        calibrated.len(),
        ppath.display(),
        if truth_cols.is_empty() {
            "No row is scored here.".to_string()
        } else if a.exclude_calibrated {
            "They were left out (--exclude-calibrated): every row here is held out.".to_string()
        } else if in_sample == 0 {
            "None of them is among the rows scored here: every row here is held out.".to_string()
        } else {
            format!(
                "**{in_sample} of the {} rows scored here are among them (marked `calibrated_on` in runs.csv): their \
                 device-level errors are in-sample.** Rerun with --exclude-calibrated for held-out rows only.",
                records.len()
            )
        }
    );
    if in_sample > 0 && !a.exclude_calibrated {
        eprintln!(
            "memest: warning: {in_sample} of {} rows were calibrated on by the profile ([calibration.rows]); their \
             device-level errors are in-sample (--exclude-calibrated leaves them out)",
            records.len()
        );
    }
    if reserved_rows > 0 {
        extra += &format!(
            "\n\nAllocator level: for the {reserved_rows} rows with `max_memory_reserved_mib`, estimators with an \
             allocator-level answer (`symbolic`, `analytic`) are also scored on it against that column: the rows marked \
             `(reserved)`. There the PEF is the proxy (no memsim capped rerun at that level)."
        );
    }
    extra += "\n\nML: ";
    extra += &match &ml_models {
        None => "no model given (--ml-model or $MEMTRACE_ML_MODEL): `ml` is null.".to_string(),
        Some(m) => {
            let list: Vec<String> =
                m.trained_on().map(|(p, t, f)| format!("{} ({f}, trained on {t})", p.display())).collect();
            let known = if m.know_training_rows() {
                "The model files record what their training rows hold, so such a row is known in any file or order"
            } else {
                "A model file written before training rows were recorded names only its training CSV (every usable \
                 row of it is a training row): its rows repeated in other files are not detected"
            };
            format!(
                "{}. A model scored on rows it was trained on is not a held-out result: such rows are null unless \
                 --ml-include-training-rows. {known}.",
                list.join("; ")
            )
        }
    };
    for n in ml_notes.iter().chain(&ml_outside) {
        extra += &format!("\n\n**{n}**");
    }
    let notes = format!(
        "Datasets: {}. Rows: {}{}. Profile: {}. Device-level truth (nvidia-smi/NVML): {truth_note}.\n\
         Relative errors |est−truth|/truth; MRE is their median (xMem). PEF (memsim): the rerun capped at each estimate is \
         simulated by replaying the run's symbolic trace at capacity = estimate − profile outside-allocator memory; it is only \
         as good as the symbolic trace (circular for `symbolic` itself). PEF proxy: the PEF with \"estimate below truth\" in \
         place of the simulated rerun, so a failure is an estimate below truth, an estimate above the GPU's memory for a \
         run that fitted, or a missed real OOM; it is a proxy and not comparable with xMem's published PEF. MCP in GB (10^9 B) per run against {:.0} MiB. \
         fake_tensor is taken from the trainer's plain-meta trace (forward+backward live bytes of iteration 0); live_peak is \
         the peak of live requested bytes of the emulated trace. Latencies of trace-based estimators include the trainer's \
         tracing time.",
        a.dataset.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", "),
        rows.len(),
        a.limit.map_or(String::new(), |n| format!(" (seeded subset: at most {n} per dataset, seed {seed})"))
            + &if excluded.is_empty() { String::new() } else { format!(", excluding {} rows listed in the calibration runs", excluded.len()) },
        ppath.display(),
        profile.gpu.total_memory as f64 / 1048576.0,
    ) + &extra;
    write(&a.out.join("report.md"), &report::markdown("memest compare", &notes, &groups))?;
    let metrics_json = serde_json::to_string_pretty(&groups)?;
    write(&a.out.join("metrics.json"), &metrics_json)?;
    write(&a.out.join("runs.csv"), &report::runs_csv(&records))?;
    write(&a.out.join("runs.jsonl"), &report::runs_jsonl(&records))?;
    match plots::write_all(&a.out, &records) {
        Ok(files) => eprintln!("wrote {} plots", files.len()),
        Err(e) => eprintln!("warning: plots not written: {e:#}"),
    }
    if a.json {
        println!("{metrics_json}");
    } else {
        eprintln!("wrote {}/report.md, metrics.json, runs.csv, runs.jsonl", a.out.display());
        for g in groups.iter().filter(|g| g.group == "all") {
            let m = &g.metrics;
            println!(
                "{:<20} estimated {:>5}/{:<5} MRE {:>8} under {:>7} PEF(memsim) {:>7} PEF(proxy) {:>7}",
                if g.level == "device" { g.estimator.clone() } else { format!("{} ({})", g.estimator, g.level) },
                m.estimated,
                m.runs,
                m.mre.map_or("-".into(), |v| format!("{:.1}%", v * 100.0)),
                m.under_fraction.map_or("-".into(), |v| format!("{:.1}%", v * 100.0)),
                report::pef_memsim(m),
                report::pef_proxy(g),
            );
        }
    }
    Ok(())
}

fn borrow(x: &Result<(PathBuf, f64), String>) -> Result<(&Path, f64), String> {
    x.as_ref().map(|(p, s)| (p.as_path(), *s)).map_err(Clone::clone)
}

fn write(path: &Path, text: &str) -> anyhow::Result<()> {
    Ok(write_atomic(path, text.as_bytes())?)
}

/// Where a trace's job settings (`TraceJob::options`) are kept.
fn job_file(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}.job.json"))
}

/// Why the trace at `path` is not `job`'s: a header field the trainer writes that differs from
/// what the job asks for (`None` when they agree, or when the header cannot be read: the
/// replay then says what is wrong with the file).
fn traced_otherwise(path: &std::path::Path, job: &TraceJob, profile: &str) -> Option<String> {
    // A trace made before the settings were kept had none beyond its columns.
    let kept: serde_json::Map<String, serde_json::Value> = path
        .parent()
        .and_then(|d| std::fs::read_to_string(job_file(d, &job.name)).ok())
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_default();
    if kept != job.options {
        return Some(format!(
            "job {}, not {}",
            serde_json::Value::Object(kept),
            serde_json::Value::Object(job.options.clone())
        ));
    }
    use trace::metadata::{AMP, BATCH_SIZE, CUDA_EMULATION, MODEL, OPTIMIZER, PARAM_DTYPE, PROFILE};
    let reader = trace::Reader::open(path).ok()?;
    let h = reader.header();
    // Without autocast the regime is the parameters' own (bf16 for a bf16 model).
    let own = h.meta(&PARAM_DTYPE).filter(|d| *d == "bf16" || *d == "fp16").unwrap_or("fp32");
    let amp = job.amp.as_deref().unwrap_or(own);
    let batch = job.batch_size.to_string();
    let wanted = [
        (&MODEL, job.model.as_str()),
        (&OPTIMIZER, job.optimizer.as_str()),
        (&AMP, amp),
        (&BATCH_SIZE, batch.as_str()),
        (&CUDA_EMULATION, if job.plain_meta { "false" } else { "true" }),
        (&PROFILE, profile),
    ];
    wanted.iter().find_map(|(key, want)| {
        let got = h.meta(key)?;
        (got != *want).then(|| format!("{} {got}, not {want}", key.name))
    })
}
