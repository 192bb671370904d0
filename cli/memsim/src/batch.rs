//! Many inputs in one command: `memsim replay A B C` and `memsim stats A B C` work on every file
//! at once, one file per core (rayon), and print the results in the order given.
//!
//! One file prints exactly what it always did (a JSON object with `--json`). Several print one
//! section per file, or with `--json` a JSON array of the per-file objects; a file that fails
//! is an element `{"file": ..., "error": ...}` (and an `error:` line on stderr), the others are
//! still reported, and the exit status is 2. Otherwise it is the largest of the per-file ones.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::Result;
use rayon::prelude::*;

/// What one file gives: the exit status, the text or JSON output and the warnings.
pub struct Output {
    /// The file's exit status (0 or 1).
    pub code: u8,
    /// What `--json` prints for this file.
    pub json: Option<serde_json::Value>,
    /// What the text form prints for this file.
    pub text: String,
    /// Warning lines (printed on stderr before the output).
    pub warnings: Vec<String>,
}

impl Output {
    /// An output with nothing written yet.
    pub fn new(warnings: Vec<String>) -> Output {
        Output { code: 0, json: None, text: String::new(), warnings }
    }

    /// Appends a line to the text form.
    pub fn line(&mut self, args: std::fmt::Arguments) {
        // One line: what a trace supplies (its producer's name, its recorded configuration) is
        // printed with its control characters escaped.
        self.text.push_str(&crate::exit::printable(&args.to_string()));
        self.text.push('\n');
    }
}

/// Appends a formatted line to an [`Output`]'s text.
macro_rules! outln {
    ($o:expr) => { $o.line(format_args!("")) };
    ($o:expr, $($t:tt)*) => { $o.line(format_args!($($t)*)) };
}
pub(crate) use outln;

/// Runs `one` on every file (in parallel when there are several) and prints the results in
/// order; returns the exit status.
pub fn run(files: &[PathBuf], json: bool, one: impl Fn(&Path) -> Result<Output> + Sync) -> Result<u8> {
    crate::input::stdin_once(files)?;
    if let [file] = files {
        let out = one(file)?;
        crate::input::warn(&out.warnings);
        print(&out, json)?;
        return Ok(out.code);
    }
    crate::input::set_batch(true);
    let bar = crate::input::bar(files.len() as u64, "{spinner} {pos}/{len} files {wide_bar} {eta}");
    let done = AtomicU64::new(0);
    let outs: Vec<Result<Output>> = files
        .par_iter()
        .map(|f| {
            let r = one(f);
            let n = done.fetch_add(1, Ordering::Relaxed) + 1;
            if let Some(b) = &bar {
                b.set_position(n);
            }
            r
        })
        .collect();
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    let mut code = 0u8;
    let mut all = Vec::new();
    let stdout = std::io::stdout();
    for (file, out) in files.iter().zip(outs) {
        match out {
            Ok(out) => {
                crate::input::warn(&of_file(file, &out.warnings));
                code = code.max(out.code);
                if json {
                    all.push(out.json.unwrap_or(serde_json::Value::Null));
                } else {
                    let mut lock = stdout.lock();
                    lock.write_all(out.text.as_bytes())?;
                    lock.write_all(b"\n")?;
                }
            }
            Err(e) => {
                eprintln!("memsim: error: {}", crate::exit::printable(&crate::exit::chain_text(&e)));
                code = 2;
                all.push(serde_json::json!({"file": file.display().to_string(), "error": crate::exit::chain_text(&e)}));
            }
        }
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&all)?);
    }
    Ok(code)
}

/// A batch prints every file's warnings before any output: each names its file, where it did
/// not already.
fn of_file(file: &Path, warnings: &[String]) -> Vec<String> {
    let name = file.display().to_string();
    warnings.iter().map(|w| if w.contains(&name) { w.clone() } else { format!("{name}: {w}") }).collect()
}

fn print(out: &Output, json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(out.json.as_ref().unwrap_or(&serde_json::Value::Null))?);
    } else {
        print!("{}", out.text);
    }
    Ok(())
}
