//! GPU profiles (`profiles/NAME.toml`): the facts a prediction depends on that a trace does not
//! carry. One source of truth for Rust and Python; the format is documented in profiles/README.md.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::alloc::TorchVersion;
use crate::family::Family;

/// Errors loading a profile.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProfileError {
    /// The name did not resolve to a file.
    #[error(
        "profile {name:?} not found: looked for {} (known profiles: {})",
        tried.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", "),
        if known.is_empty() { "none".to_string() } else { known.join(", ") }
    )]
    NotFound {
        /// The name or path given.
        name: String,
        /// Paths tried, in order.
        tried: Vec<PathBuf>,
        /// The profile names in the profiles directory.
        known: Vec<String>,
    },
    /// The path names something that exists but is no file (a folder, a device).
    #[error("profile {}: not a file (expected a profile .toml file, or a name: {})", path.display(),
        if known.is_empty() { "none known".to_string() } else { known.join(", ") })]
    NotAFile {
        /// The path given.
        path: PathBuf,
        /// The profile names in the profiles directory.
        known: Vec<String>,
    },
    /// The file could not be read.
    #[error("cannot read profile {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The TOML did not match the profile format (the message names the key).
    #[error("invalid profile {path}: {message}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What was wrong, naming the key.
        message: String,
    },
}

/// `[gpu]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Gpu {
    /// Device name.
    pub name: String,
    /// Total memory, bytes.
    pub total_memory: u64,
    /// Compute capability.
    pub compute_capability: [u32; 2],
    /// SM count.
    pub sm_count: u32,
}

/// `[software]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Software {
    /// torch version.
    pub torch: String,
    /// CUDA version.
    pub cuda: String,
    /// cuDNN version.
    #[serde(default)]
    pub cudnn: Option<String>,
    /// Allocator behaviour version: "2.4", "2.5" or "2.9".
    pub allocator: String,
}

/// `[outside_allocator]`, MiB.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutsideAllocator {
    /// CUDA context and runtime.
    pub context_mib: f64,
    /// cuBLAS, when any GEMM runs.
    #[serde(default)]
    pub cublas_mib: f64,
    /// cuDNN, when any convolution runs.
    #[serde(default)]
    pub cudnn_mib: f64,
    /// NCCL's communicator (device structures, proxy and kernel state), when the job has more
    /// than one rank.
    #[serde(default)]
    pub nccl_communicator_mib: f64,
    /// NCCL's buffers per connected peer (`NCCL_BUFFSIZE`, 4 MiB per channel for the Simple
    /// protocol, times channels, plus the LL/LL128 buffers), when the job has more than one rank.
    #[serde(default)]
    pub nccl_per_peer_mib: f64,
}

/// `[workspace]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Workspace {
    /// `CUBLAS_WORKSPACE_CONFIG` default.
    pub cublas_workspace_config: String,
    /// cuBLASLt workspace, KiB.
    pub cublaslt_workspace_kib: u64,
    /// Whether the Lt workspace is allocated per call.
    #[serde(default)]
    pub cublaslt_per_call: bool,
    /// cuDNN convolution workspace per call, as a multiple of the larger of the call's input and
    /// output bytes (the symbolic tracer's model; default 1.0). Fitted on measured runs where no
    /// workspace table exists (`docs/results.md`).
    #[serde(default = "default_cudnn_factor")]
    pub cudnn_workspace_factor: f64,
}

fn default_cudnn_factor() -> f64 {
    1.0
}

/// A GPU profile.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    /// The GPU.
    pub gpu: Gpu,
    /// Software versions.
    pub software: Software,
    /// Memory outside the caching allocator.
    pub outside_allocator: OutsideAllocator,
    /// Library workspace rules.
    pub workspace: Workspace,
    /// Provenance written by `memest calibrate`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub calibration: BTreeMap<String, toml::Value>,
    /// Which constants were measured and which were not.
    #[serde(default)]
    pub provenance: Provenance,
    /// The calibrated safety margins (`memest safety`); `None`: the safe number is the point.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub safety: Option<Safety>,
}

/// `[safety]`: how much to add to a symbolic point estimate so that, on measured runs of the
/// same family and regime, the safe number is under the truth in at most `miss_rate` of runs.
/// Fitted by split conformal prediction (`memest safety`) on runs the calibration of the
/// outside-allocator constants did not use; the held-out figures are measured on yet other runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Safety {
    /// The stated miss rate (e.g. 0.02): the share of runs whose truth may exceed the safe number.
    pub miss_rate: f64,
    /// How the margins were fitted.
    #[serde(default)]
    pub method: String,
    /// What fitted them (`memest safety`).
    #[serde(default)]
    pub fitted_by: String,
    /// Which runs.
    #[serde(default)]
    pub runs: String,
    /// Licence of the measured data.
    #[serde(default)]
    pub data_licence: String,
    /// Margins by family (`mlp`, `cnn`, `transformer`).
    #[serde(default)]
    pub families: BTreeMap<String, FamilyMargin>,
}

/// One family's calibrated margin and what it achieved on held-out runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FamilyMargin {
    /// The regime the runs were measured in (e.g. `fp32 adam`).
    pub regime: String,
    /// Safe = point + margin × (the point, or the reserved peak: see `scale`).
    pub margin: f64,
    /// What the margin multiplies: `point` (the device estimate) or `reserved` (the allocator's
    /// part, where the trace's uncertainty lives). Default `point`.
    #[serde(default = "default_scale")]
    pub scale: String,
    /// Runs the margin was fitted on.
    pub calibration_runs: u64,
    /// Runs it was evaluated on.
    pub held_out_runs: u64,
    /// Share of held-out runs whose truth exceeded the safe number.
    pub held_out_miss_rate: f64,
    /// Median of (safe − truth) / truth on held-out runs.
    pub held_out_median_over: f64,
    /// Median |point − truth| / truth on held-out runs.
    pub held_out_point_mre: f64,
}

/// `[provenance]`: the constants nobody has measured on this GPU. Every use of one is warned
/// about, so a prediction that rests on a guess says so.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Provenance {
    /// Dotted keys (`outside_allocator.cublas_mib`, `gpu.total_memory`, ...) whose values are
    /// placeholders, not measurements.
    #[serde(default)]
    pub unmeasured: Vec<String>,
}

fn default_scale() -> String {
    "point".into()
}

/// The profile an estimate uses when none is given: `memest estimate` and `compare`, the trainer's
/// `estimate` and `memtrace.estimate` (the Python side's `DEFAULT_PROFILE` says the same;
/// `trainer/tests/test_estimate.py` checks they agree). Commands that judge a trace only when
/// asked (`memsim replay`, `colocate`) use none by default, `memsim report` every profile, and
/// the searches (`max-batch`, `max-seq`, `min-world-size`) require one.
pub const DEFAULT_PROFILE: &str = "a100-40gb";

/// The keys `[provenance] unmeasured` may name.
pub const MEASURABLE_KEYS: &[&str] = &[
    "gpu.total_memory",
    "gpu.sm_count",
    "outside_allocator.context_mib",
    "outside_allocator.cublas_mib",
    "outside_allocator.cudnn_mib",
    "outside_allocator.nccl_communicator_mib",
    "outside_allocator.nccl_per_peer_mib",
    "workspace.cublas_workspace_config",
    "workspace.cublaslt_workspace_kib",
    "workspace.cublaslt_per_call",
    "workspace.cudnn_workspace_factor",
];

impl Profile {
    /// Parse profile text; `path` is only used in messages.
    pub fn parse(text: &str, path: &Path) -> Result<Profile, ProfileError> {
        let p: Profile = toml::from_str(text).map_err(|e| ProfileError::Invalid {
            path: path.to_path_buf(),
            message: e.to_string().trim().to_string(),
        })?;
        p.check(path)?;
        Ok(p)
    }

    fn check(&self, path: &Path) -> Result<(), ProfileError> {
        let bad = |message: String| Err(ProfileError::Invalid { path: path.to_path_buf(), message });
        if !matches!(self.software.allocator.as_str(), "2.4" | "2.5" | "2.9") {
            return bad(format!(
                "software.allocator = {:?}: expected \"2.4\", \"2.5\" or \"2.9\"",
                self.software.allocator
            ));
        }
        let sw = &self.software;
        let torch: TorchVersion = match sw.torch.parse() {
            Ok(v) => v,
            Err(e) => return bad(format!("software.torch = {:?}: {e}", sw.torch)),
        };
        // The allocator version is implied by torch's (profiles/README.md): another is a slip
        // that would replay one release's rules under another's name.
        if torch.to_string() != sw.allocator {
            return bad(format!(
                "software.allocator = {:?} does not match software.torch = {:?}, whose allocator rules are the \
                 {torch} family's: expected \"{torch}\"",
                sw.allocator, sw.torch
            ));
        }
        for (key, v) in [("cuda", Some(&sw.cuda)), ("cudnn", sw.cudnn.as_ref())] {
            let Some(v) = v else { continue };
            if !v.starts_with(|c: char| c.is_ascii_digit()) || !v.chars().all(|c| c.is_ascii_digit() || c == '.') {
                return bad(format!("software.{key} = {v:?}: expected a version number such as \"12.4\""));
            }
        }
        if self.gpu.total_memory == 0 {
            return bad("gpu.total_memory must be > 0 bytes".into());
        }
        // Far above any GPU, and no more than a capacity given by hand may be
        // (`trace::units::MAX_CAPACITY`).
        if self.gpu.total_memory > trace::units::MAX_CAPACITY {
            return bad(format!(
                "gpu.total_memory = {}: more than 256 TiB, which no GPU holds; expected bytes",
                self.gpu.total_memory
            ));
        }
        if let Err(e) = parse_cublas_workspace_config(&self.workspace.cublas_workspace_config) {
            return bad(format!("workspace.cublas_workspace_config: {e}"));
        }
        for (k, v) in [
            ("context_mib", self.outside_allocator.context_mib),
            ("cublas_mib", self.outside_allocator.cublas_mib),
            ("cudnn_mib", self.outside_allocator.cudnn_mib),
            ("nccl_communicator_mib", self.outside_allocator.nccl_communicator_mib),
            ("nccl_per_peer_mib", self.outside_allocator.nccl_per_peer_mib),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return bad(format!("outside_allocator.{k} = {v}: expected a finite number of MiB >= 0"));
            }
            // No term outside the allocator holds more than the whole GPU; a larger one is a
            // typo (bytes for MiB), and would overflow the sums it enters.
            let total_mib = self.gpu.total_memory as f64 / (1u64 << 20) as f64;
            if v > total_mib {
                return bad(format!(
                    "outside_allocator.{k} = {v}: more than the GPU's whole memory ({total_mib:.0} MiB, \
                     gpu.total_memory); expected MiB"
                ));
            }
        }
        if let Some(sf) = &self.safety {
            if !(sf.miss_rate > 0.0 && sf.miss_rate < 1.0) {
                return bad(format!("safety.miss_rate = {}: expected a fraction in (0, 1)", sf.miss_rate));
            }
            for (name, f) in &sf.families {
                if !Family::ALL.iter().any(|f| f.name() == name) {
                    let names: Vec<&str> = Family::ALL.iter().map(|f| f.name()).collect();
                    return bad(format!("safety.families.{name}: expected one of {}", names.join(", ")));
                }
                if !matches!(f.scale.as_str(), "point" | "reserved") {
                    return bad(format!(
                        "safety.families.{name}.scale = {:?}: expected \"point\" or \"reserved\"",
                        f.scale
                    ));
                }
                if !(f.margin.is_finite() && f.margin >= 0.0) {
                    return bad(format!("safety.families.{name}.margin = {}: expected a fraction >= 0", f.margin));
                }
            }
        }
        let f = self.workspace.cudnn_workspace_factor;
        if !(f.is_finite() && f >= 0.0) {
            return bad(format!("workspace.cudnn_workspace_factor = {f}: expected a finite multiple >= 0"));
        }
        for k in &self.provenance.unmeasured {
            if !MEASURABLE_KEYS.contains(&k.as_str()) {
                return bad(format!(
                    "provenance.unmeasured names {k:?}: expected one of {}",
                    MEASURABLE_KEYS.join(", ")
                ));
            }
        }
        Ok(())
    }

    /// Load a profile by name (`profiles/NAME.toml`) or path.
    pub fn load(name_or_path: &str) -> Result<(Profile, PathBuf), ProfileError> {
        let path = resolve(name_or_path)?;
        // A profile is a few KiB of TOML.
        let text = trace::read_small_string(&path, 16 << 20)
            .map_err(|source| ProfileError::Io { path: path.clone(), source })?;
        Ok((Profile::parse(&text, &path)?, path))
    }

    /// cuBLAS workspace bytes per (handle, stream).
    pub fn cublas_workspace_bytes(&self) -> u64 {
        parse_cublas_workspace_config(&self.workspace.cublas_workspace_config).unwrap_or(0)
    }

    /// Whether `key` (a [`MEASURABLE_KEYS`] entry) is marked unmeasured.
    pub fn is_unmeasured(&self, key: &str) -> bool {
        self.provenance.unmeasured.iter().any(|k| k == key)
    }

    /// The profile's name: its file stem.
    pub fn name_of(path: &Path) -> String {
        path.file_stem().map_or_else(|| path.display().to_string(), |s| s.to_string_lossy().into_owned())
    }
}

/// `CUBLAS_WORKSPACE_CONFIG` (`:SIZE_KiB:COUNT[:SIZE_KiB:COUNT...]`) → total bytes.
pub fn parse_cublas_workspace_config(s: &str) -> Result<u64, String> {
    let parts: Vec<&str> = s.split(':').collect();
    if parts.first() != Some(&"") || parts.len() < 3 || parts.len().is_multiple_of(2) {
        return Err(format!("{s:?}: expected \":SIZE_KiB:COUNT\" pairs, e.g. \":4096:8\""));
    }
    let mut total = 0u64;
    for pair in parts[1..].chunks(2) {
        let n = |t: &str| t.parse::<u64>().map_err(|_| format!("{s:?}: {t:?} is not a whole number"));
        total = total.saturating_add(n(pair[0])?.saturating_mul(n(pair[1])?).saturating_mul(1024));
    }
    Ok(total)
}

/// The directory holding the built-in profiles: `$MEMTRACE_PROFILES`, else `profiles/` in the
/// repository this binary was built from, else `profiles/` under the current directory.
pub fn profiles_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("MEMTRACE_PROFILES") {
        return PathBuf::from(d);
    }
    let built = Path::new(env!("CARGO_MANIFEST_DIR")).join("../profiles");
    if built.is_dir() {
        return built.canonicalize().unwrap_or(built);
    }
    PathBuf::from("profiles")
}

/// Resolve a profile name or path to a file.
pub fn resolve(name_or_path: &str) -> Result<PathBuf, ProfileError> {
    let direct = PathBuf::from(name_or_path);
    let mut tried = Vec::new();
    if name_or_path.ends_with(".toml") || name_or_path.contains('/') {
        if direct.is_file() {
            return Ok(direct);
        }
        if direct.exists() {
            return Err(ProfileError::NotAFile { path: direct, known: known_profiles() });
        }
        tried.push(direct);
    } else {
        let p = profiles_dir().join(format!("{name_or_path}.toml"));
        if p.is_file() {
            return Ok(p);
        }
        tried.push(p);
    }
    Err(ProfileError::NotFound { name: name_or_path.to_string(), tried, known: known_profiles() })
}

/// The names of the profiles in [`profiles_dir`], sorted.
pub fn known_profiles() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(profiles_dir())
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "toml"))
                .map(|p| Profile::name_of(&p))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}
