//! `memest calibrate`.

use anyhow::Context;
use estimators::calibrate::{fit, rewrite_profile, split, CalRun};
use estimators::error::write_atomic;
use simulator::profile::Profile;

#[derive(clap::Args)]
#[command(after_help = "RUNS are runs.jsonl files written by `memest compare` (measured device peak and the \
symbolic reserved prediction of each run). MLP runs (GEMMs, no convolutions) fit context+cublas; convolutional \
runs then fit cudnn. A seeded share of the runs is held out and the error before/after is reported on it; runs \
the --profile's earlier calibration was fitted on ([calibration.rows], or marked calibrated_on) are never held out.\n\
Example: memest calibrate out/mlp/runs.jsonl out/cnn/runs.jsonl --profile a100-40gb --write profiles/a100-40gb.toml")]
pub struct Args {
    #[command(flatten)]
    io: crate::fitio::FitIo,
    /// Fraction of runs held out for evaluation.
    #[arg(long, default_value_t = 0.3, allow_negative_numbers = true)]
    test_fraction: f64,
    /// Seed of the train/test split.
    #[arg(long, default_value_t = 1, allow_negative_numbers = true)]
    seed: u64,
    /// Weighted quantile of the residuals to fit (0.5 = median; higher = fewer underestimates).
    #[arg(long, default_value_t = 0.5, allow_negative_numbers = true)]
    quantile: f64,
}

/// The fewest training runs a written constant may rest on.
const MIN_RUNS_TO_WRITE: usize = 10;

pub fn run(a: Args) -> anyhow::Result<()> {
    if !(0.0..1.0).contains(&a.test_fraction) {
        anyhow::bail!("--test-fraction {}: expected a fraction in [0, 1)", a.test_fraction);
    }
    let (profile, ppath) = Profile::load(&a.io.profile)?;
    if !(0.0..=1.0).contains(&a.quantile) {
        anyhow::bail!("--quantile {}: expected a fraction in [0, 1]", a.quantile);
    }
    let records = a.io.read()?;
    // The residuals are of the points the runs' own profile gave: another GPU's are not this one's.
    let pname = Profile::name_of(&ppath);
    if let Some(w) = estimators::safety::another_gpu(&records, &profile, &pname, "a constant") {
        eprintln!("memest: warning: {}", trace::terminal::printable(&w));
    }
    let calibrated = crate::fitio::calibrated_rows(&profile, &ppath)?;
    // A run the prior constants were fitted on says nothing held out of them: it is trained on,
    // never in the held-out split whose "before" error would be in-sample.
    let (mut runs, mut in_sample) = (Vec::new(), Vec::new());
    for r in &records {
        if let Some(run) = CalRun::from_record(r) {
            if r.in_calibration(&calibrated) {
                in_sample.push(run)
            } else {
                runs.push(run)
            }
        }
    }
    if !in_sample.is_empty() {
        eprintln!(
            "memest: note: {} of the runs were fitted on by {}'s earlier calibration ([calibration.rows], or marked \
             calibrated_on when compared): they are trained on but kept out of the held-out split, whose \
             \"before\" error would be in-sample for them",
            in_sample.len(),
            ppath.display()
        );
    }
    // `usable` counts the in-sample runs too; they join the training split only.
    let (fresh, usable) = (runs.len(), runs.len() + in_sample.len());
    if usable < records.len() {
        eprintln!(
            "memest: warning: {} of {} runs left out of the fit: no measured peak (or a zero one, or a real OOM), or no \
             symbolic estimate",
            records.len() - usable,
            records.len()
        );
    }
    let (mut train, test) = split(&runs, a.test_fraction, a.seed);
    train.extend(in_sample);
    // The fit's own message ("no training run has both ...") blamed the runs, not the fraction.
    if train.is_empty() && !test.is_empty() {
        anyhow::bail!(
            "--test-fraction {} holds out {} of the {} usable runs and leaves no training run: lower it",
            a.test_fraction,
            test.len(),
            usable
        );
    }
    let total = profile.gpu.total_memory as f64;
    let fit = fit(&profile.outside_allocator, &train, &test, a.quantile, total).with_context(|| a.io.runs_list())?;
    if a.io.json {
        println!("{}", serde_json::to_string_pretty(&fit)?);
    } else {
        let o = &fit.outside;
        println!("runs with truth and a symbolic estimate: {usable} (train {}, test {})", train.len(), test.len());
        println!(
            "fitted on {} MLP runs and {} convolutional runs (weighted quantile {})",
            fit.train_mlp, fit.train_conv, a.quantile
        );
        println!("context_mib {:.1}  cublas_mib {:.1}  cudnn_mib {:.1}", o.context_mib, o.cublas_mib, o.cudnn_mib);
        for n in &fit.notes {
            println!("note: {n}");
        }
        let pct = |v: Option<f64>| v.map_or("-".into(), |x| format!("{:.2}%", x * 100.0));
        println!("held-out MRE: before {} after {}", pct(fit.before.mre), pct(fit.after.mre));
        println!(
            "held-out underestimates: before {} after {}",
            pct(fit.before.under_fraction),
            pct(fit.after.under_fraction)
        );
    }
    if fit.below_reserved > 0 {
        eprintln!(
            "memest: warning: {} of {} training runs measured a peak below their symbolic reserved peak, which \
             contradicts the model (the device holds at least what the allocator reserved)",
            fit.below_reserved,
            train.len()
        );
    }
    if fit.left_out_no_library > 0 {
        eprintln!(
            "memest: warning: {} of {} training runs left out of the fit: they load neither cuBLAS nor cuDNN \
             (uses_gemm and uses_conv false)",
            fit.left_out_no_library,
            train.len()
        );
    }
    if let Some(out) = &a.io.write {
        // A constant clamped to 0 is not what the runs say; written, every estimate on this GPU
        // would carry it as measured.
        if fit.clamped {
            anyhow::bail!(
                "--write {}: a fitted residual is below zero (measured peaks below the symbolic reserved peak) and its \
                 constant was clamped to 0: the runs contradict the model, so no profile is written (without --write \
                 the fit is only printed)",
                out.display()
            );
        }
        // A weighted quantile of a handful of runs is one of them, not a calibration; the
        // profile would carry it as the constants of every estimate on this GPU.
        for (n, what) in [
            (fit.train_mlp, "context_mib and cublas_mib (MLP runs)"),
            (fit.train_conv, "cudnn_mib (convolutional runs)"),
        ] {
            if n > 0 && n < MIN_RUNS_TO_WRITE {
                anyhow::bail!(
                    "--write {}: {what} would rest on {n} runs; at least {MIN_RUNS_TO_WRITE} are needed to write a \
                     profile (without --write the fit is only printed)",
                    out.display()
                );
            }
        }
        if fit.test == 0 {
            // Runs the prior constants were fitted on are never held out: with nothing else, they
            // are the cause, whatever the fraction.
            let why = if fresh == 0 {
                format!(
                    "every one of the {usable} runs was fitted on by {}'s earlier calibration, and those are never held out",
                    ppath.display()
                )
            } else {
                format!(
                    "--test-fraction {} of the {fresh} runs the earlier calibration was not fitted on",
                    a.test_fraction
                )
            };
            eprintln!(
                "memest: warning: no run is held out ({why}): {} records no held-out error for its constants",
                out.display()
            );
        }
        if profile.safety.is_some() {
            eprintln!(
                "memest: warning: {}'s [safety] margins are kept as they are, but they were fitted against its old \
                 [outside_allocator] constants: refit them with `memest safety` on runs estimated with {}",
                ppath.display(),
                out.display()
            );
        }
        let text =
            trace::read_small_string(&ppath, 16 << 20).with_context(|| format!("cannot read {}", ppath.display()))?;
        let pct = |v: Option<f64>| v.map_or("n/a".into(), |x| format!("{:.2}%", x * 100.0));
        let provenance = vec![
            ("fitted_by".to_string(), "memest calibrate".to_string()),
            ("runs".to_string(), a.io.runs_list()),
            ("data_licence".to_string(), a.io.licence().to_string()),
            (
                "method".to_string(),
                format!(
                    "weighted quantile {} (weights 1/truth) of truth - symbolic reserved; context+cublas from {} MLP runs, cudnn from {} convolutional runs; split seed {}, test fraction {} of the {fresh} runs the prior constants were not fitted on ({} that were trained on only)",
                    a.quantile, fit.train_mlp, fit.train_conv, a.seed, a.test_fraction, usable - fresh
                ),
            ),
            ("notes".to_string(), fit.notes.join("; ")),
            ("held_out_runs".to_string(), fit.test.to_string()),
            ("held_out_mre_before".to_string(), pct(fit.before.mre)),
            ("held_out_mre_after".to_string(), pct(fit.after.mre)),
            ("held_out_under_before".to_string(), pct(fit.before.under_fraction)),
            ("held_out_under_after".to_string(), pct(fit.after.under_fraction)),
        ];
        // Every row the runs came from, measured or not: all of them were looked at.
        let mut rows = estimators::rows::RowSet::default();
        for r in &records {
            rows.insert(&r.id, &r.digest);
        }
        // A constant this fit kept came from the profile's earlier calibration: the rows that
        // one was fitted on stay in-sample, or `compare` would count them as held out.
        if fit.train_mlp == 0 || fit.train_conv == 0 {
            let old = &calibrated;
            if !old.is_empty() {
                eprintln!(
                    "memest: note: {} of {}'s earlier [calibration.rows] are kept: the {} its earlier calibration \
                     fitted are kept too",
                    old.len(),
                    ppath.display(),
                    if fit.train_mlp == 0 { "context_mib and cublas_mib" } else { "cudnn_mib" }
                );
            }
            for id in old.ids() {
                rows.insert(id, "");
            }
            for (stem, digests) in old.digests() {
                rows.insert_digests(stem, digests.iter().map(String::as_str));
            }
        }
        let new_text = rewrite_profile(&text, &fit.outside, &provenance, &rows);
        // The rewritten profile must load, or nothing is written.
        Profile::parse(&new_text, out).context("the rewritten profile does not parse")?;
        write_atomic(out, new_text.as_bytes())?;
        eprintln!("wrote {}", out.display());
    }
    Ok(())
}
