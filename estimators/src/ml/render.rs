//! Plain-text/Markdown tables of protocol reports, shared by `memest ml` and `memest util`.

use super::protocol::{MeanStd, Report};

fn ms(v: &Option<MeanStd>, digits: usize) -> String {
    match v {
        Some(m) => format!("{:.d$} ± {:.d$}", m.mean, m.std, d = digits),
        None => "–".into(),
    }
}

/// Digits for an error in the target's unit: MiB errors need none past one, ratio errors three.
fn unit_digits(v: Option<f64>) -> usize {
    if v.is_some_and(|v| v.abs() < 10.0) {
        3
    } else {
        1
    }
}

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or("–".into(), |x| format!("{x:.digits$}"))
}

/// Markdown tables (classifiers, then regressors) of a report, preceded by a summary line.
pub fn markdown(r: &Report) -> String {
    let mut out = format!(
        "{} protocol on `{}`: family {}, target {}, {} rows (test {}), {} folds, seed {}\n",
        r.protocol, r.dataset, r.family, r.target, r.rows, r.test_rows, r.folds, r.seed
    );
    out += &format!("bins {} with counts {:?}\n", r.bins.join(" "), r.class_counts);
    for (reason, n) in &r.excluded {
        out += &format!("excluded {n} rows: {reason}\n");
    }
    let classifiers: Vec<_> = r.models.iter().filter(|m| m.test.is_some()).collect();
    if !classifiers.is_empty() {
        let val = r.protocol == "gpumemnet";
        out += "\n| model | CV accuracy | CV F1 macro | CV F1 weighted |";
        if val {
            out += " val accuracy |";
        }
        out += " test accuracy | test F1 macro | test F1 weighted | below diag | top-bin recall | fit s | P50 µs | P99 µs |\n|---|---|---|---|";
        if val {
            out += "---|";
        }
        out += "---|---|---|---|---|---|---|---|\n";
        for m in classifiers {
            let t = m.test.as_ref().expect("filtered");
            out += &format!(
                "| {} | {} | {} | {} |",
                m.model,
                ms(&m.cv_accuracy, 3),
                ms(&m.cv_f1_macro, 3),
                ms(&m.cv_f1_weighted, 3)
            );
            if val {
                out += &format!(" {} |", opt(m.validation.as_ref().map(|v| v.accuracy), 3));
            }
            out += &format!(
                " {:.3} | {:.3} | {:.3} | {:.3} | {} | {:.2} | {:.1} | {:.1} |\n",
                t.accuracy,
                t.f1_macro,
                t.f1_weighted,
                t.below_diagonal,
                opt(t.high_class_recall, 3),
                m.fit_seconds,
                m.latency.p50_us,
                m.latency.p99_us
            );
        }
    }
    let regressors: Vec<_> = r.models.iter().filter(|m| m.test_value.is_some()).collect();
    if !regressors.is_empty() {
        out += "\n| regressor | CV MRE | CV MAE | test MRE | test MAE | test under-rate | fit s | P50 µs | P99 µs |\n|---|---|---|---|---|---|---|---|---|\n";
        for m in regressors {
            let t = m.test_value.as_ref().expect("filtered");
            out += &format!(
                "| {} | {} | {} | {} | {} | {} | {:.2} | {:.1} | {:.1} |\n",
                m.model,
                ms(&m.cv_mre, 3),
                ms(&m.cv_mae, unit_digits(m.cv_mae.map(|c| c.mean))),
                opt(t.mre, 3),
                opt(t.mae, unit_digits(t.mae)),
                opt(t.under_rate, 3),
                m.fit_seconds,
                m.latency.p50_us,
                m.latency.p99_us
            );
        }
    }
    for m in r.models.iter().filter(|m| m.error.is_some()) {
        out += &format!("\nfailed: {}: {}", m.model, m.error.as_deref().unwrap_or(""));
    }
    for n in &r.notes {
        out += &format!("\nnote: {n}");
    }
    out.push('\n');
    out
}
