//! The safety margin: how much above its point estimate a trace's safe number is, from the
//! profile's `[safety]` calibration for the job's family and precision regime.

use serde::Serialize;
use trace::{metadata, Header};

use crate::family::Family;
use crate::profile::Profile;

/// The safety margin applied to one trace's point estimate.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Margin {
    /// Safe = point + fraction × (point, or reserved peak when `scale` is `reserved`).
    pub fraction: f64,
    /// What the fraction multiplies: `point` or `reserved`.
    pub scale: String,
    /// The stated miss rate the margin was calibrated for (`None`: no calibration applies).
    pub miss_rate: Option<f64>,
    /// The job's family and regime, as the trace says (e.g. `cnn fp32`).
    pub regime: String,
    /// The calibrated family whose margin is used (`None`: no margin).
    pub calibrated_family: Option<String>,
    /// Whether coverage was measured for this family and regime (false: borrowed or none).
    pub coverage_measured: bool,
    /// What the margin rests on, in a sentence.
    pub note: String,
}

impl Margin {
    /// No margin, for this reason.
    pub fn none(regime: String, note: impl Into<String>, measured: bool) -> Margin {
        Margin {
            fraction: 0.0,
            scale: "point".into(),
            miss_rate: None,
            regime,
            calibrated_family: None,
            coverage_measured: measured,
            note: note.into(),
        }
    }

    /// The safe number for a point estimate and its reserved (allocator) part, bytes, rounded up.
    pub fn safe(&self, point: u64, reserved: u64) -> u64 {
        let base = if self.scale == "reserved" { reserved } else { point };
        point.saturating_add((base as f64 * self.fraction).ceil() as u64)
    }
}

/// Families whose memory is dominated by GEMMs borrow each other's margin: a Transformer without
/// its own calibration takes the MLP's, the closest measured family.
fn nearest(family: Family) -> [Family; 3] {
    match family {
        Family::Transformer => [Family::Transformer, Family::Mlp, Family::Cnn],
        Family::Cnn => [Family::Cnn, Family::Mlp, Family::Transformer],
        Family::Mlp => [Family::Mlp, Family::Transformer, Family::Cnn],
    }
}

/// The margin for a trace with this header, of a job of this family ([`Family::of_header`], or
/// the features' when the header names none). Traces recorded on a real run (the shim's) get none:
/// they are measurements. Symbolic traces get their family's calibrated margin when the profile
/// has one for their regime; otherwise the nearest calibrated family's (at least the largest, when
/// the family is unknown), with "coverage unmeasured for this regime".
pub fn margin(profile: &Profile, header: &Header, family: Option<Family>) -> Margin {
    // Only the symbolic tracer counts events on a logical clock; every trace of a real run (the
    // shim's, a converted snapshot) carries time or nothing.
    let measured_run = header.meta(&metadata::CLOCK).is_none();
    let precision = header.meta(&metadata::AMP).unwrap_or("fp32").to_string();
    let optimizer = header.meta(&metadata::OPTIMIZER);
    // What the job does that no calibration run did (GPUMemNet's runs: no checkpointing, one GPU).
    let beyond: Vec<String> = [
        header.meta(&metadata::CHECKPOINTING).filter(|c| *c != "none").map(|c| format!("checkpointing {c}")),
        header.meta(&metadata::STRATEGY).filter(|s| *s != "none").map(|s| format!("strategy {s}")),
    ]
    .into_iter()
    .flatten()
    .collect();
    let regime = [family.map_or("unknown-family", Family::name), &precision]
        .into_iter()
        .chain(optimizer)
        .map(str::to_string)
        .chain(beyond.iter().cloned())
        .collect::<Vec<_>>()
        .join(" ");
    if measured_run {
        return Margin::none(regime, "a trace recorded on a real run is a measurement: no margin", true);
    }
    let Some(sf) = &profile.safety else {
        return Margin::none(
            regime,
            "the profile has no [safety] calibration: the safe number is the point estimate",
            false,
        );
    };
    let chosen = match family {
        Some(f) => nearest(f).iter().find_map(|n| sf.families.get(n.name()).map(|m| (n.name().to_string(), m))),
        // Unknown family: the widest calibrated margin.
        None => sf.families.iter().max_by(|a, b| a.1.margin.total_cmp(&b.1.margin)).map(|(n, m)| (n.clone(), m)),
    };
    let Some((name, m)) = chosen else {
        return Margin::none(regime, "the profile's [safety] table calibrates no family", false);
    };
    let same_family = family.map(Family::name) == Some(name.as_str());
    // The calibration's regime is its precision, then its optimizer when it names one.
    let mut words = m.regime.split_whitespace();
    let same_regime = words.next() == Some(precision.as_str())
        && words.next().is_none_or(|o| optimizer == Some(o))
        // A margin fitted over mixed regimes ("bf16 adam / fp32 adam") measured none of them.
        && words.next().is_none()
        && beyond.is_empty();
    let measured = same_family && same_regime;
    let note = if measured {
        format!(
            "{name} margin {:.1}% of the {} for a {:.0}% miss rate; held out: truth above the safe number in \
             {:.1}% of {} runs",
            m.margin * 100.0,
            m.scale,
            sf.miss_rate * 100.0,
            m.held_out_miss_rate * 100.0,
            m.held_out_runs
        )
    } else {
        format!(
            "coverage unmeasured for this regime ({regime}): using the nearest calibrated one, {name} {} \
             (margin {:.1}% of the {})",
            m.regime,
            m.margin * 100.0,
            m.scale
        )
    };
    Margin {
        fraction: m.margin,
        scale: m.scale.clone(),
        miss_rate: Some(sf.miss_rate),
        regime,
        calibrated_family: Some(name),
        coverage_measured: measured,
        note,
    }
}
