//! `memest safety`.

use anyhow::Context;
use estimators::error::write_atomic;
use estimators::safety::{estimated_otherwise, fit, rewrite_safety, table, Skip};
use simulator::profile::Profile;

#[derive(clap::Args)]
#[command(after_help = "RUNS are runs.jsonl files written by `memest compare` (measured device peak and the \
symbolic point estimate of each run). Runs the --profile's [calibration.rows] name (by content, or by position \
where it records no digests), or marked calibrated_on when compared, are left out. \
Per family, split conformal prediction on one seeded share of the runs fits the margin at which the safe number \
(point + margin x scale, the scale being the point or its reserved part) is under the truth in at most --miss-rate \
of runs; the other share measures it.\n\
Example: memest safety out/full/*/runs.jsonl --profile a100-40gb --write profiles/a100-40gb.toml")]
pub struct Args {
    #[command(flatten)]
    io: crate::fitio::FitIo,
    /// The stated miss rate: the share of runs whose truth may exceed the safe number.
    #[arg(long, default_value_t = 0.02, allow_negative_numbers = true)]
    miss_rate: f64,
    /// Fraction of runs held out to measure the margin's miss rate.
    #[arg(long, default_value_t = 0.5, allow_negative_numbers = true)]
    held_out: f64,
    /// Seed of the calibration/held-out split.
    #[arg(long, default_value_t = 1, allow_negative_numbers = true)]
    seed: u64,
    /// The regime the runs were measured in, precision first ("fp32 adam") [default: what the
    /// runs record; fp32 adam, GPUMemNet's, for runs that record none].
    #[arg(long)]
    regime: Option<String>,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    if !(a.miss_rate > 0.0 && a.miss_rate < 1.0) {
        anyhow::bail!("--miss-rate {}: expected a fraction in (0, 1)", a.miss_rate);
    }
    if !(a.held_out > 0.0 && a.held_out < 1.0) {
        anyhow::bail!("--held-out {}: expected a fraction in (0, 1)", a.held_out);
    }
    const PRECISIONS: [&str; 3] = ["fp32", "bf16", "fp16"];
    if let Some(regime) =
        a.regime.as_ref().filter(|r| !r.split_whitespace().next().is_some_and(|p| PRECISIONS.contains(&p)))
    {
        anyhow::bail!(
            "--regime {:?}: expected the runs' precision first ({}), then what else describes them (e.g. \
             \"fp32 adam\"): a margin is applied to traces of its family and precision",
            regime,
            PRECISIONS.join(", ")
        );
    }
    let (profile, ppath) = Profile::load(&a.io.profile)?;
    let records = a.io.read()?;
    let pname = Profile::name_of(&ppath);
    for w in estimated_otherwise(&records, &profile, &pname) {
        eprintln!("memest: warning: {}", trace::terminal::printable(&w));
    }
    // The profile's own calibration rows, whichever profile the runs were compared with.
    let calibrated = crate::fitio::calibrated_rows(&profile, &ppath)?;
    let (regime, said) = estimators::safety::regime(&records, a.regime.as_deref());
    for w in said {
        eprintln!("memest: warning: {}", trace::terminal::printable(&w));
    }
    // The runs files are named, as calibrate's error names them: which input had nothing to fit.
    let fit = fit(&records, &calibrated, a.miss_rate, a.held_out, a.seed, &regime).with_context(|| a.io.runs_list())?;
    if !fit.too_few.is_empty() {
        eprintln!(
            "memest: warning: no margin for {}: too few runs on the calibration split (lower --held-out, or give \
             more runs)",
            fit.too_few.join(", ")
        );
    }
    if a.io.write.is_some() {
        let dropped: Vec<&String> =
            profile.safety.iter().flat_map(|s| s.families.keys()).filter(|f| !fit.families.contains_key(*f)).collect();
        if !dropped.is_empty() {
            eprintln!(
                "memest: warning: --write replaces {}'s [safety] table: its margins for {} are not refitted by \
                 these runs and are dropped (give every family's runs in one call to keep them)",
                ppath.display(),
                dropped.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
            );
        }
    }
    if a.io.json {
        println!("{}", serde_json::to_string_pretty(&fit)?);
    } else {
        println!(
            "{:<12} {:>8} {:>9} {:>11} {:>9} {:>14} {:>14} {:>10}",
            "family", "margin", "of the", "calibrated", "held out", "held-out miss", "median over", "point MRE"
        );
        for (name, f) in &fit.families {
            let m = &f.margin;
            println!(
                "{:<12} {:>7.2}% {:>9} {:>11} {:>9} {:>13.2}% {:>13.2}% {:>9.2}%{}",
                // A family is the runs file's text: escaped, as every other memest line is.
                trace::terminal::printable(name),
                m.margin * 100.0,
                m.scale,
                m.calibration_runs,
                m.held_out_runs,
                m.held_out_miss_rate * 100.0,
                m.held_out_median_over * 100.0,
                m.held_out_point_mre * 100.0,
                if f.exact { "" } else { "  (too few runs for the guarantee: largest score used)" }
            );
        }
        for (why, n) in &fit.skipped {
            println!("skipped {n} records: {}", why.name());
        }
    }
    if let Some(out) = &a.io.write {
        // A margin short of its guarantee in the profile would read, to every verdict, as one
        // measured to hold: not written.
        let short: Vec<&str> = fit.families.iter().filter(|(_, f)| !f.exact).map(|(n, _)| n.as_str()).collect();
        if !short.is_empty() {
            anyhow::bail!(
                "--write {}: the margins of {} rest on too few calibration runs for the --miss-rate {} guarantee \
                 (the largest score was used): not written; give more runs or lower --held-out",
                out.display(),
                short.join(", "),
                a.miss_rate
            );
        }
        let text =
            trace::read_small_string(&ppath, 16 << 20).with_context(|| format!("cannot read {}", ppath.display()))?;
        let runs = a.io.runs_list();
        let method = format!(
            "split conformal prediction per family: score (truth - point)/scale, scale = the point or the reserved \
             peak (the one with the smaller median over-reservation on the calibration split), margin = the \
             ceil((n+1)(1-a))-th smallest score of the calibration split (clamped at 0), a = {}; split seed {}, \
             held-out fraction {}; {}",
            a.miss_rate,
            a.seed,
            a.held_out,
            left_out(fit.skipped.get(&Skip::CalibratedOn).copied().unwrap_or(0), calibrated.len(), &pname)
        );
        let new_text = rewrite_safety(&text, &table(&fit, a.miss_rate, &runs, &method, a.io.licence()))
            .map_err(anyhow::Error::msg)?;
        Profile::parse(&new_text, out).context("the rewritten profile does not parse")?;
        write_atomic(out, new_text.as_bytes())?;
        eprintln!("wrote {}", out.display());
    }
    Ok(())
}

/// What the written method says of the runs the constants of profile `name` were fitted on.
fn left_out(n: usize, listed: usize, name: &str) -> String {
    if n > 0 {
        format!(
            "{n} runs the [outside_allocator] constants were fitted on left out ({name}'s [calibration.rows], or \
             marked calibrated_on when compared)"
        )
    } else if listed > 0 {
        format!("none of the runs is among the {listed} rows of {name}'s [calibration.rows]")
    } else {
        format!("{name} lists no [calibration.rows]: no run was left out as calibrated on")
    }
}
