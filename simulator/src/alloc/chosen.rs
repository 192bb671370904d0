//! Which allocator configuration a replay follows: the one rule `memsim replay` and `memsim
//! validate` share.
//!
//! - `--alloc-conf` replaces what the trace recorded wholesale, as `PYTORCH_CUDA_ALLOC_CONF`
//!   would for a new run; the recorded settings it drops or changes are named in a warning.
//! - Otherwise a snapshot's `allocator_settings` are followed: its `PYTORCH_CUDA_ALLOC_CONF`
//!   string, with the fields beside it on top (what the allocator reported in force when the
//!   snapshot was taken: a program may change them at run time). Where the string names a key
//!   whose field says otherwise, the field is followed and a warning names the conflict.
//! - Otherwise the allocator configuration string the trace header's environment recorded.

use serde::Serialize;

use super::shown::{names, KEYS};
use super::{AllocatorConfig, ConfigError, TorchVersion};

/// Where the configuration in force came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ConfigSource {
    /// `--alloc-conf`.
    Override,
    /// The trace's or snapshot's recorded settings.
    Recorded,
    /// Nothing recorded: PyTorch's defaults.
    Default,
}

/// What the trace recorded of its allocator configuration.
#[derive(Debug, Clone, Copy, Default)]
pub struct RecordedConfig<'a> {
    /// The configuration string of the header's environment (`PYTORCH_ALLOC_CONF` or
    /// `PYTORCH_CUDA_ALLOC_CONF`).
    pub env: Option<&'a str>,
    /// A snapshot's `allocator_settings`.
    pub settings: Option<&'a serde_json::Value>,
}

/// The configuration a replay follows, where it came from, and what to warn about.
#[derive(Debug, Clone)]
pub struct ChosenConfig {
    /// The configuration.
    pub cfg: AllocatorConfig,
    /// Its string in `PYTORCH_CUDA_ALLOC_CONF` syntax, when there is one (`""`: set, to nothing):
    /// the configuration replayed, so a snapshot's fields that the recorded string contradicts or
    /// leaves out are written into it.
    pub shown: Option<String>,
    /// Which parts of `shown` a snapshot's fields decided, where they did.
    pub note: Option<String>,
    /// Where it came from.
    pub source: ConfigSource,
    /// Recorded settings that contradict each other, or that `--alloc-conf` drops.
    pub warnings: Vec<String>,
}

/// Why no configuration could be chosen: where the bad one came from, and what was wrong.
#[derive(Debug, Clone)]
pub struct ChooseError {
    /// `--alloc-conf`, or where in the trace.
    pub source_name: &'static str,
    /// The parse error (names the key).
    pub error: ConfigError,
}

/// The configuration a replay follows (see the module documentation).
pub fn choose(
    over: Option<&str>,
    recorded: RecordedConfig<'_>,
    version: TorchVersion,
) -> Result<ChosenConfig, ChooseError> {
    let mut warnings = Vec::new();
    let (rec, rec_shown, note) = match recorded_config(recorded, version, over.is_none(), &mut warnings) {
        Ok(r) => r,
        // What `--alloc-conf` replaces need not be readable: it is dropped, with a word.
        Err(e) if over.is_some() => {
            warnings.push(format!(
                "recorded settings unreadable (allocator configuration {}: {}); replaced by --alloc-conf",
                e.source_name, e.error
            ));
            (None, None, None)
        }
        Err(e) => return Err(e),
    };
    let Some(over) = over else {
        let source = if rec.is_some() { ConfigSource::Recorded } else { ConfigSource::Default };
        return Ok(ChosenConfig { cfg: rec.unwrap_or_default(), shown: rec_shown, note, source, warnings });
    };
    let cfg =
        AllocatorConfig::parse(over, version).map_err(|error| ChooseError { source_name: "--alloc-conf", error })?;
    warnings.extend(super::shown::repeated(over, "given by --alloc-conf"));
    if let Some(rec) = &rec {
        let default = AllocatorConfig::default();
        let dropped: Vec<String> = KEYS
            .iter()
            .filter(|(_, show, _)| show(rec) != show(&default) && show(rec) != show(&cfg))
            .map(|(key, show, _)| format!("{key} {} (now {})", show(rec), show(&cfg)))
            .collect();
        if !dropped.is_empty() {
            warnings.push(format!(
                "--alloc-conf replaces the allocator configuration the trace recorded ({}), as \
                 PYTORCH_CUDA_ALLOC_CONF would for a new run; recorded settings dropped or changed: {}; repeat in \
                 --alloc-conf any you mean to keep",
                rec_shown.as_deref().map_or("its allocator_settings".to_string(), |s| format!("\"{s}\"")),
                dropped.join(", ")
            ));
        }
    }
    Ok(ChosenConfig { cfg, shown: Some(over.to_string()), note: None, source: ConfigSource::Override, warnings })
}

/// The configuration the trace recorded, its string and what of it the snapshot's fields
/// decided, if any. `contradictions`: warn where the snapshot's string and fields disagree (not
/// when `--alloc-conf` replaces both).
fn recorded_config(
    recorded: RecordedConfig<'_>,
    version: TorchVersion,
    contradictions: bool,
    warnings: &mut Vec<String>,
) -> Result<Recorded, ChooseError> {
    if let Some(settings) = recorded.settings {
        let source_name = "recorded as the snapshot's allocator_settings";
        let settings_conf = settings.get("PYTORCH_CUDA_ALLOC_CONF").and_then(|v| v.as_str()).map(str::to_string);
        let cfg = AllocatorConfig::from_snapshot_settings(settings, version)
            .map_err(|error| ChooseError { source_name, error })?;
        let by_string = match settings_conf.as_deref() {
            Some(s) => AllocatorConfig::parse(s, version).map_err(|error| ChooseError { source_name, error })?,
            None => AllocatorConfig::default(),
        };
        if let Some(s) = settings_conf.as_deref().filter(|_| contradictions) {
            warnings.extend(super::shown::repeated(s, "the snapshot recorded"));
            for (key, show, _) in KEYS {
                if names(s, key) && show(&by_string) != show(&cfg) {
                    warnings.push(format!(
                        "the snapshot's recorded allocator settings contradict each other: its PYTORCH_CUDA_ALLOC_CONF \
                         string says {key} {}, its allocator_settings field says {}; following the field (what the \
                         allocator reported in force when the snapshot was taken)",
                        show(&by_string),
                        show(&cfg)
                    ));
                }
            }
        }
        let (shown, note) = super::shown::with_fields(settings_conf.as_deref(), &by_string, &cfg);
        Ok((Some(cfg), shown, note))
    } else if let Some(env) = recorded.env {
        let cfg = AllocatorConfig::parse(env, version)
            .map_err(|error| ChooseError { source_name: "recorded in the trace header's environment", error })?;
        if contradictions {
            warnings.extend(super::shown::repeated(env, "the trace header recorded"));
        }
        Ok((Some(cfg), Some(env.to_string()), None))
    } else {
        Ok((None, None, None))
    }
}

/// What the trace recorded: the configuration, its string, and which parts of the string a
/// snapshot's fields decided.
type Recorded = (Option<AllocatorConfig>, Option<String>, Option<String>);
