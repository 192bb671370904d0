//! `mtrace-jsonl IN.mtrace OUT.jsonl`: convert a trace to JSON Lines, for scripts (the GPU check)
//! that read traces from Python where `memsim` may not be available.

use std::process::ExitCode;

use anyhow::{bail, Context, Result};

fn run() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [input, output] = args.as_slice() else {
        bail!("usage: mtrace-jsonl IN.mtrace OUT.jsonl");
    };
    let summary = trace::convert(input, output).with_context(|| format!("converting {input} to {output}"))?;
    if summary.truncated {
        eprintln!("{input}: truncated (the producer was cut short); converted up to the last complete event");
    }
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mtrace-jsonl: {e:#}");
            ExitCode::FAILURE
        }
    }
}
