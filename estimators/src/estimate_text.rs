//! The estimate in words. Every view of an estimate (memest's text, the trainer's `estimate`
//! text, the Python API's `str` and notebook cell, the HTML report's headline) joins these parts
//! and words nothing itself, so the sentence a user acts on is written once.
//!
//! The words are made from an [`EstimateView`]: the fields of the estimate JSON (schema 3) they
//! need. memest fills one from its report; `memest render` reads one from a JSON file, so the
//! trainer's estimate, which adds baselines of its own (PyTorch's MemTracker), is worded by the
//! same function after it has added them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use simulator::fit;

use crate::estimate::{EstimateReport, StepPeaks, VerdictReport};

/// The estimate as lines of text, in parts a caller can place its own lines between.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EstimateText {
    /// What is needed where: `needs 1234.5 MiB on GPU (point 1200.0)`; the verdict follows it.
    pub headline: String,
    /// `FITS` or `DOES NOT FIT` ([`fit::verdict_word`]), of the need in the headline.
    pub verdict: String,
    /// Indented lines under the headline: capacity and margin, the symbolic breakdown (with the
    /// memory outside the allocator by library), the per-step peaks, the profile and family.
    pub details: Vec<String>,
    /// The baselines' heading, then one indented line per baseline.
    pub baselines: Vec<String>,
}

/// One estimator's answer, as the words use it.
#[derive(Debug, Clone, Deserialize)]
pub struct AnswerView {
    /// Its number; `None` for a need no device holds (the verdict's `need_unbounded`).
    pub device_mib: Option<f64>,
    /// The safe number (the point plus the profile's margin), where the estimator has one.
    #[serde(default)]
    pub safe_mib: Option<f64>,
    /// Allocator level, where modelled.
    #[serde(default)]
    pub reserved_mib: Option<f64>,
    /// `reserved_mib` is a failed allocation's floor, not a peak.
    #[serde(default)]
    pub reserved_oom_floor: bool,
    /// Peak allocated, where modelled.
    #[serde(default)]
    pub allocated_mib: Option<f64>,
    /// What the number measures.
    pub level: String,
    /// What it leaves out.
    pub ignores: String,
    /// Per-step peaks (the headline).
    #[serde(default)]
    pub steps: Option<StepPeaks>,
}

/// The memory outside the allocator, as the words use it.
#[derive(Debug, Clone, Deserialize)]
pub struct OutsideView {
    /// CUDA context.
    pub context_mib: f64,
    /// cuBLAS.
    pub cublas_mib: f64,
    /// cuDNN.
    pub cudnn_mib: f64,
    /// NCCL.
    pub nccl_mib: f64,
    /// Held by the trace itself (absent before it was reported).
    #[serde(default)]
    pub recorded_mib: f64,
    /// The sum.
    pub total_mib: f64,
    /// Where the libraries counted came from.
    pub libraries: LibrariesView,
}

/// Where the libraries counted came from.
#[derive(Debug, Clone, Deserialize)]
pub struct LibrariesView {
    /// `trace`, `features`, `unknown`, ...
    pub source: String,
}

/// The margin's sentence.
#[derive(Debug, Clone, Deserialize)]
pub struct MarginView {
    /// What the margin rests on.
    pub note: String,
    /// Safe = point + fraction × scale (absent in the trainer's older files: not checked then).
    #[serde(default)]
    pub fraction: Option<f64>,
    /// What the fraction multiplies: `point` or `reserved`.
    #[serde(default)]
    pub scale: Option<String>,
}

/// The fields of an estimate (memest's schema 3, or the trainer's, which adds to it) that the
/// words use; other fields are ignored.
#[derive(Debug, Clone, Deserialize)]
pub struct EstimateView {
    /// The schema version ([`crate::estimate::SCHEMA`]); the words are of that schema alone.
    pub schema: u32,
    /// The estimator to act on.
    pub headline: String,
    /// The verdict.
    pub verdict: VerdictReport,
    /// Every estimator's answer, `null` where it could not run.
    pub estimates: BTreeMap<String, Option<AnswerView>>,
    /// Why an estimator is `null`.
    #[serde(default)]
    pub unavailable: BTreeMap<String, String>,
    /// Memory outside the allocator.
    pub outside_allocator: OutsideView,
    /// The safety margin.
    pub margin: MarginView,
    /// The profile's path (memest's JSON); the trainer's puts the name given here and the path
    /// in `profile_path`.
    pub profile: String,
    /// The profile's path in the trainer's JSON.
    #[serde(default)]
    pub profile_path: Option<String>,
    /// The profile's name.
    pub profile_name: String,
    /// The GPU's name.
    pub gpu: String,
    /// The job's family.
    pub family: String,
    /// What the estimate said beside its verdict (none in a file without them).
    #[serde(default)]
    pub warnings: Vec<String>,
}

impl From<&EstimateReport> for EstimateView {
    fn from(r: &EstimateReport) -> EstimateView {
        let o = &r.outside_allocator;
        let answer = |a: &crate::estimate::Answer| AnswerView {
            device_mib: a.device_mib,
            safe_mib: a.safe_mib,
            reserved_mib: a.reserved_mib,
            reserved_oom_floor: a.reserved_oom_floor,
            allocated_mib: a.allocated_mib,
            level: a.level.to_string(),
            ignores: a.ignores.to_string(),
            steps: a.steps.clone(),
        };
        EstimateView {
            schema: r.schema,
            headline: r.headline.to_string(),
            verdict: r.verdict.clone(),
            estimates: r.estimates.iter().map(|(k, a)| (k.clone(), a.as_ref().map(answer))).collect(),
            unavailable: r.unavailable.clone(),
            outside_allocator: OutsideView {
                context_mib: o.context_mib,
                cublas_mib: o.cublas_mib,
                cudnn_mib: o.cudnn_mib,
                nccl_mib: o.nccl_mib,
                recorded_mib: o.recorded_mib,
                total_mib: o.total_mib,
                libraries: LibrariesView { source: o.libraries.source.to_string() },
            },
            margin: MarginView {
                note: r.margin.note.clone(),
                fraction: Some(r.margin.fraction),
                scale: Some(r.margin.scale.clone()),
            },
            profile: r.profile.clone(),
            profile_path: None,
            profile_name: r.profile_name.clone(),
            gpu: r.gpu.clone(),
            family: r.family.to_string(),
            warnings: r.warnings.clone(),
        }
    }
}

impl EstimateText {
    /// The words of an estimate.
    pub fn of(r: &EstimateView) -> EstimateText {
        let v = &r.verdict;
        // A need no device holds is said as one, with why, never as a number of MiB.
        let point = match (v.need_unbounded, v.point_mib) {
            (Some(why), _) => why.describe().to_string(),
            (None, Some(p)) if v.basis.ends_with("safe_mib") => format!("point {p:.1}"),
            (None, _) => "point".into(),
        };
        let (need, capacity) = match v.need_mib {
            Some(need) => simulator::units::need_and_capacity_mib(need, v.capacity_mib, 1),
            // Infinite MiB saturate to `u64::MAX` bytes, which `units` words as UNBOUNDED.
            None => simulator::units::need_and_capacity_mib(f64::INFINITY, v.capacity_mib, 1),
        };
        let mut details =
            vec![format!("  capacity {capacity} ({}); margin: {}", v.capacity_source.describe(), r.margin.note)];
        // memsim replay's words: the need at a budget is that budget's, so a need printed beside
        // one capacity is not the need at another.
        if let (true, Some(budget)) = (v.need_at_capacity, v.allocator_budget_mib) {
            details.push(format!(
                "  the need is the replay at this capacity: replayed within the allocator budget of {budget:.1} MiB \
                 (the capacity less the memory outside the allocator); when it fills, the allocator frees its cache \
                 and retries, so the need can differ at another --capacity"
            ));
        }
        if let Some(Some(sym)) = r.estimates.get(&r.headline) {
            let o = &r.outside_allocator;
            // A failed allocation's floor is no peak: said as memsim says it, so that the peaks
            // and per-step figures beside it (which never count the request) do not contradict it.
            let reserved = if sym.reserved_oom_floor {
                format!(
                    "reserved at least {:.1} MiB (an allocation failed: the bytes held then plus its size; peak \
                     allocated {:.1} MiB)",
                    sym.reserved_mib.unwrap_or(0.0),
                    sym.allocated_mib.unwrap_or(0.0)
                )
            } else {
                format!(
                    "peak reserved {:.1} MiB (peak allocated {:.1} MiB)",
                    sym.reserved_mib.unwrap_or(0.0),
                    sym.allocated_mib.unwrap_or(0.0)
                )
            };
            details.push(format!(
                "  {}: {reserved} + outside the allocator {:.1} MiB \
                 (context {:.1}, cuBLAS {:.1}, cuDNN {:.1}, NCCL {:.1}{}; libraries from {})",
                r.headline,
                o.total_mib,
                o.context_mib,
                o.cublas_mib,
                o.cudnn_mib,
                o.nccl_mib,
                if o.recorded_mib > 0.0 { format!(", held by the trace {:.1}", o.recorded_mib) } else { String::new() },
                o.libraries.source
            ));
            if let Some(st) = &sym.steps {
                let steady = match st.steady_device_mib {
                    Some(m) => format!("steady (steps 2-{}) {m:.1} MiB", st.count),
                    None => "one step traced: no steady state".into(),
                };
                let failed = if sym.reserved_oom_floor { "; the failed allocation is in no step's peak" } else { "" };
                details.push(format!(
                    "  per step: first {:.1} MiB, {steady} (device level{failed})",
                    st.first_step_device_mib
                ));
            }
        }
        let path = r.profile_path.as_deref().unwrap_or(&r.profile);
        details.push(format!("  profile {} ({path}), family {}", r.profile_name, r.family));
        let mut baselines = vec!["baselines (for comparison, not for decisions):".to_string()];
        for (name, ans) in r.estimates.iter().filter(|(n, _)| **n != r.headline) {
            baselines.push(match ans {
                Some(x) => {
                    let n = x.device_mib.map_or(simulator::units::UNBOUNDED.to_string(), |m| format!("{m:>10.1} MiB"));
                    format!("  {:<12} {n}  {:<6}  ignores {}", name, x.level, x.ignores)
                }
                None => format!("  {:<12} {:>10}      ({})", name, "-", r.unavailable.get(name).map_or("", |s| s)),
            });
        }
        // A failed allocation's floor bounds the need from below, as the details line says.
        let floor = v.need_mib.is_some()
            && r.estimates.get(&r.headline).is_some_and(|a| a.as_ref().is_some_and(|a| a.reserved_oom_floor));
        let at_least = if floor { "at least " } else { "" };
        EstimateText {
            headline: format!("needs {at_least}{need} on {} ({point})", r.gpu),
            verdict: fit::verdict_word(v.fits).to_string(),
            details,
            baselines,
        }
    }

    /// The first line: the headline and its verdict.
    pub fn sentence(&self) -> String {
        format!("{}: {}", self.headline, self.verdict)
    }

    /// The whole text, as `memest estimate` prints it.
    pub fn render(&self) -> String {
        let mut s = self.sentence();
        s.push('\n');
        for line in self.details.iter().chain(&self.baselines) {
            s.push_str(line);
            s.push('\n');
        }
        s
    }
}
