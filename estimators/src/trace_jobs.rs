//! Rebuilding measured runs as symbolic traces through the trainer
//! (`python -m memtrace_trainer symtrace --batch CONFIGS.jsonl --out-dir DIR`), one process for
//! many configurations so torch is imported once.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use crate::error::{write_atomic, EstimateError, Result};

/// One configuration to trace.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceJob {
    /// Output name (the trace is `DIR/NAME.jsonl`).
    pub name: String,
    /// Trainer model spec, or `module:function` when `entry` is set.
    pub model: String,
    /// `model` is a user's entry point (`symtrace --entry`), not a model spec.
    pub entry: bool,
    /// Batch size.
    pub batch_size: u64,
    /// Optimizer name.
    pub optimizer: String,
    /// Autocast dtype (`bf16`, `fp16`); `None` for fp32.
    pub amp: Option<String>,
    /// Trace the plain meta path (the FakeTensor-style baseline).
    pub plain_meta: bool,
    /// The GPU profile to emulate (a name or a path); `None`: the trainer's default.
    pub profile: Option<String>,
    /// The job's other settings (`symtrace --batch` keys: `seq_len`, `input_shape`, ...).
    pub options: serde_json::Map<String, serde_json::Value>,
}

/// What the trainer answered for one job.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceResult {
    /// The trace written, or the trainer's error.
    pub trace: std::result::Result<PathBuf, String>,
    /// Wall seconds the trainer spent on it (time between its output lines).
    pub seconds: f64,
    /// What the trainer said of the config (a setting with no effect on the model, ...).
    pub warnings: Vec<String>,
}

/// How the trainer is run: its interpreter and the extra arguments of its `symtrace --batch`
/// (`--backend slurm --submitit-cluster ...` to trace on a cluster).
#[derive(Debug, Clone)]
pub struct Trainer {
    /// The Python interpreter ([`python`]).
    pub python: PathBuf,
    /// Appended to `symtrace --batch CONFIGS --out-dir DIR`.
    pub extra_args: Vec<String>,
}

impl Trainer {
    /// The local trainer: [`python`], no extra arguments.
    pub fn local() -> Trainer {
        Trainer { python: python(), extra_args: Vec::new() }
    }
}

/// The Python interpreter to run the trainer with: `$MEMTRACE_PYTHON`, else the repository's
/// `.venv/bin/python`, else `python3` on PATH.
pub fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("MEMTRACE_PYTHON") {
        return PathBuf::from(p);
    }
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python");
    if venv.is_file() {
        return venv;
    }
    PathBuf::from("python3")
}

/// Trace `jobs` into `dir`, calling `progress` after each. A job that fails is reported in its
/// result, never fatal. If the trainer dies mid-batch (an uncaught exception), the job it was on
/// is marked failed with its stderr tail and the rest are retried in a fresh process.
pub fn trace_batch(
    trainer: &Trainer,
    jobs: &[TraceJob],
    dir: &Path,
    progress: impl FnMut(&str),
) -> Result<BTreeMap<String, TraceResult>> {
    trace_worker(trainer, jobs, dir, 0, progress)
}

/// [`trace_batch`] over `workers` trainer processes at once (each gets every `workers`-th job),
/// for machines with more cores than one Python process uses.
pub fn trace_parallel(
    trainer: &Trainer,
    jobs: &[TraceJob],
    dir: &Path,
    workers: usize,
    progress: impl FnMut(&str) + Send,
) -> Result<BTreeMap<String, TraceResult>> {
    let workers = workers.clamp(1, jobs.len().max(1));
    if workers == 1 {
        return trace_batch(trainer, jobs, dir, progress);
    }
    let progress = std::sync::Mutex::new(progress);
    let chunks: Vec<Vec<TraceJob>> =
        (0..workers).map(|w| jobs.iter().skip(w).step_by(workers).cloned().collect()).collect();
    let outcomes: Vec<Result<BTreeMap<String, TraceResult>>> = std::thread::scope(|scope| {
        let handles: Vec<_> = chunks
            .iter()
            .enumerate()
            .map(|(w, chunk)| {
                let progress = &progress;
                scope.spawn(move || {
                    trace_worker(trainer, chunk, dir, w, |name| {
                        if let Ok(mut p) = progress.lock() {
                            p(name);
                        }
                    })
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(EstimateError::Calibration("a tracing worker panicked".into()))))
            .collect()
    });
    let mut all = BTreeMap::new();
    for o in outcomes {
        all.extend(o?);
    }
    Ok(all)
}

fn trace_worker(
    trainer: &Trainer,
    jobs: &[TraceJob],
    dir: &Path,
    worker: usize,
    mut progress: impl FnMut(&str),
) -> Result<BTreeMap<String, TraceResult>> {
    std::fs::create_dir_all(dir).map_err(|source| EstimateError::Io {
        path: dir.to_path_buf(),
        action: "cannot create directory",
        source,
    })?;
    let mut results = BTreeMap::new();
    let mut pending: Vec<TraceJob> = jobs.to_vec();
    while !pending.is_empty() {
        let died = run_once(trainer, &pending, dir, worker, &mut results, &mut progress)?;
        pending.retain(|j| !results.contains_key(&j.name));
        match died {
            None => break,
            Some(message) => {
                // Nothing done in this process: the trainer cannot start at all.
                let Some(first) = pending.first() else { break };
                if pending.len() == jobs.len() && results.is_empty() {
                    return Err(EstimateError::Command { command: trainer_command(trainer, dir, worker), message });
                }
                results.insert(
                    first.name.clone(),
                    TraceResult { trace: Err(message), seconds: 0.0, warnings: Vec::new() },
                );
                progress(&first.name);
                pending.remove(0);
            }
        }
    }
    for j in jobs {
        results.entry(j.name.clone()).or_insert_with(|| TraceResult {
            trace: Err("the trainer printed no result for this config".into()),
            seconds: 0.0,
            warnings: Vec::new(),
        });
    }
    Ok(results)
}

fn configs_file(dir: &Path, worker: usize) -> PathBuf {
    dir.join(if worker == 0 { "configs.jsonl".to_string() } else { format!("configs-{worker}.jsonl") })
}

fn trainer_command(trainer: &Trainer, dir: &Path, worker: usize) -> String {
    let mut cmd = format!(
        "{} -m memtrace_trainer symtrace --batch {} --out-dir {}",
        trainer.python.display(),
        configs_file(dir, worker).display(),
        dir.display()
    );
    for a in &trainer.extra_args {
        cmd.push(' ');
        cmd.push_str(a);
    }
    cmd
}

/// One trainer process over `jobs`; `Some(message)` when it died before answering them all.
fn run_once(
    trainer: &Trainer,
    jobs: &[TraceJob],
    dir: &Path,
    worker: usize,
    results: &mut BTreeMap<String, TraceResult>,
    progress: &mut impl FnMut(&str),
) -> Result<Option<String>> {
    let configs = configs_file(dir, worker);
    let mut text = String::new();
    for j in jobs {
        let mut o = serde_json::Value::Object(j.options.clone());
        o["name"] = j.name.clone().into();
        o["batch_size"] = j.batch_size.into();
        o["optimizer"] = j.optimizer.clone().into();
        o[if j.entry { "entry" } else { "model" }] = serde_json::Value::String(j.model.clone());
        if let Some(amp) = &j.amp {
            o["amp"] = serde_json::Value::String(amp.clone());
        }
        if j.plain_meta {
            o["no_cuda_emulation"] = serde_json::Value::Bool(true);
        }
        if let Some(p) = &j.profile {
            o["profile"] = serde_json::Value::String(p.clone());
        }
        text.push_str(&o.to_string());
        text.push('\n');
    }
    write_atomic(&configs, text.as_bytes())?;
    let cmd_err = |message: String| EstimateError::Command { command: trainer_command(trainer, dir, worker), message };
    let mut child = Command::new(&trainer.python)
        .args(["-m", "memtrace_trainer", "symtrace", "--batch"])
        .arg(&configs)
        .arg("--out-dir")
        .arg(dir)
        .args(&trainer.extra_args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| cmd_err(format!("cannot start ({e}); set MEMTRACE_PYTHON or run scripts/setup.sh")))?;
    let stdout = child.stdout.take().ok_or_else(|| cmd_err("no stdout".into()))?;
    let stderr = child.stderr.take().ok_or_else(|| cmd_err("no stderr".into()))?;
    // Drain stderr concurrently so a chatty trainer cannot block on a full pipe.
    let err_thread = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut BufReader::new(stderr), &mut s);
        s
    });
    let mut answered = 0usize;
    let mut last = Instant::now();
    for line in BufReader::new(stdout).lines() {
        let line = line.map_err(|e| cmd_err(format!("reading its output: {e}")))?;
        let now = Instant::now();
        let seconds = now.duration_since(last).as_secs_f64();
        last = now;
        let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else { continue };
        let Some(name) = v.get("name").and_then(|n| n.as_str()).map(str::to_string) else { continue };
        let trace = match (v.get("out").and_then(|o| o.as_str()), v.get("error").and_then(|e| e.as_str())) {
            (Some(out), _) => Ok(PathBuf::from(out)),
            (None, Some(e)) => Err(e.to_string()),
            (None, None) => Err("trainer printed neither \"out\" nor \"error\"".to_string()),
        };
        let warnings = v
            .get("warnings")
            .and_then(|w| w.as_array())
            .map(|w| w.iter().filter_map(|s| s.as_str().map(str::to_string)).collect())
            .unwrap_or_default();
        progress(&name);
        answered += 1;
        results.insert(name, TraceResult { trace, seconds, warnings });
    }
    let status = child.wait().map_err(|e| cmd_err(format!("waiting: {e}")))?;
    let stderr_text = err_thread.join().unwrap_or_default();
    if answered < jobs.len() {
        let mut tail: Vec<&str> = stderr_text.lines().rev().take(6).collect();
        tail.reverse();
        return Ok(Some(format!(
            "trainer exited with {status} after {answered} of {} configs: {}",
            jobs.len(),
            tail.join(" | ")
        )));
    }
    Ok(None)
}
