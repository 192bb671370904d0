//! The header's `metadata` keys: one list for every producer (the symbolic tracer, the shim, the
//! snapshot importer) and every reader (memsim, memest). A key the readers act on is read only
//! through [`Header::meta`] with a [`Key`] from here, so a misspelt key does not compile, and a
//! value outside the key's domain is ignored with a warning ([`Header::metadata_warnings`])
//! instead of being read as something else (`uses_gemm = "True"` as false, `amp = "BF16"` as a
//! regime no margin is calibrated for). The JSON schema's `metadata` properties are generated
//! from [`KEYS`], and the Python tracer's tests check every key it writes against that schema.
//!
//! Other keys stay free-form: a producer may record what it likes, and readers never act on it.

use std::path::Path;

use crate::Header;

/// The values a key admits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Values {
    /// `true` or `false`.
    Flag,
    /// One of these names, spelt as listed.
    OneOf(&'static [&'static str]),
    /// A decimal integer above zero.
    Positive,
    /// A decimal integer, zero or above.
    Natural,
    /// Names separated by commas; empty when there are none.
    List,
    /// Integers above zero separated by commas (a shape), at least one.
    Dims,
    /// Any text: descriptive, read by people.
    Text,
}

impl Values {
    /// Whether `value` is in the domain.
    pub fn admits(self, value: &str) -> bool {
        let digits = !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit());
        // No leading zeros: "08" is as likely a typo as a number.
        let canonical = digits && (value == "0" || !value.starts_with('0'));
        match self {
            Values::Flag => matches!(value, "true" | "false"),
            Values::OneOf(names) => names.contains(&value),
            Values::Positive => canonical && value != "0" && value.parse::<u64>().is_ok(),
            Values::Natural => canonical && value.parse::<u64>().is_ok(),
            Values::List => value.is_empty() || value.split(',').all(|n| !n.trim().is_empty()),
            Values::Dims => value.split(',').all(|n| Values::Positive.admits(n)),
            Values::Text => true,
        }
    }

    /// The domain in words, for a warning: "true or false", "one of fp32, bf16, fp16", ...
    pub fn expected(self) -> String {
        match self {
            Values::Flag => "true or false".into(),
            Values::OneOf(names) => format!("one of {}", names.join(", ")),
            Values::Positive => "an integer above zero".into(),
            Values::Natural => "an integer, zero or above".into(),
            Values::List => "names separated by commas".into(),
            Values::Dims => "integers above zero separated by commas".into(),
            Values::Text => "any text".into(),
        }
    }

    /// The domain as a regular expression over the whole value (JSON schema `pattern`), for the
    /// kinds an `enum` cannot state.
    pub fn pattern(self) -> Option<&'static str> {
        match self {
            Values::Positive => Some("^[1-9][0-9]*$"),
            Values::Natural => Some("^(0|[1-9][0-9]*)$"),
            Values::List => Some("^([^,]*[^,\\s][^,]*(,[^,]*[^,\\s][^,]*)*)?$"),
            Values::Dims => Some("^[1-9][0-9]*(,[1-9][0-9]*)*$"),
            Values::Flag | Values::OneOf(_) | Values::Text => None,
        }
    }

    /// The names an `enum` states, for [`Values::Flag`] and [`Values::OneOf`].
    pub fn names(self) -> Option<&'static [&'static str]> {
        match self {
            Values::Flag => Some(&["true", "false"]),
            Values::OneOf(names) => Some(names),
            _ => None,
        }
    }
}

/// A metadata key: its name in the header, its values and what it says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Key {
    /// The name in the header's `metadata` map.
    pub name: &'static str,
    /// The values it admits.
    pub values: Values,
    /// What it says, and who writes and reads it (the schema's `description`).
    pub doc: &'static str,
}

const fn key(name: &'static str, values: Values, doc: &'static str) -> Key {
    Key { name, values, doc }
}

/// The precision regimes a trace's `amp` names; [`PARAM_DTYPE`] uses the same names.
pub const PRECISIONS: &[&str] = &["fp32", "bf16", "fp16"];

/// `logical`: timestamps are the symbolic tracer's event numbers, not time, and the trace is of
/// no real run (its safe number gets a margin). Absent on a real run's trace.
pub const CLOCK: Key = key(
    "clock",
    Values::OneOf(&["logical"]),
    "logical: the timestamps are the symbolic tracer's event numbers, not time; the trace is of no real run",
);
/// The precision regime: autocast's dtype, else the parameters' when they are bf16 or fp16.
pub const AMP: Key = key(
    "amp",
    Values::OneOf(PRECISIONS),
    "the precision regime (autocast's dtype, else bf16/fp16 parameters', else fp32); names the safety margin",
);
/// The dtype of most floating-point parameter bytes (`none` without any, torch's name for others).
pub const PARAM_DTYPE: Key = key(
    "param_dtype",
    Values::Text,
    "the dtype holding most floating-point parameter bytes: fp32, bf16, fp16, none, or torch's name",
);
/// Whether any GEMM ran (cuBLAS loaded), from the ops the tracer saw.
pub const USES_GEMM: Key = key("uses_gemm", Values::Flag, "whether a GEMM ran, so cuBLAS is loaded");
/// Whether any convolution ran (cuDNN loaded), from the ops the tracer saw.
pub const USES_CONV: Key = key("uses_conv", Values::Flag, "whether a convolution ran, so cuDNN is loaded");
/// Whether the job turned on `torch.backends.cudnn.benchmark` before a convolution: cuDNN's
/// autotuning then takes workspaces sized to the memory free at the time, which no trace models.
pub const CUDNN_BENCHMARK: Key = key(
    "cudnn_benchmark",
    Values::Flag,
    "whether torch.backends.cudnn.benchmark was on at a convolution (autotuning workspaces sized to free memory)",
);
/// Whether the tracer emulated CUDA's own allocations (workspaces), or traced the plain meta path.
pub const CUDA_EMULATION: Key = key(
    "cuda_emulation",
    Values::Flag,
    "whether the tracer emulated CUDA's allocations (library workspaces), or traced the plain meta path",
);
/// The class names of the modules whose forward ran; the job's family is derived from them.
pub const LAYER_TYPES: Key = key(
    "layer_types",
    Values::List,
    "class names of the modules whose forward ran, sorted, each once; the model family is derived from them",
);
/// The family a trace written before [`LAYER_TYPES`] existed recorded.
pub const FAMILY: Key = key(
    "family",
    Values::OneOf(&["mlp", "cnn", "transformer", "MLP", "CNN", "Transformer"]),
    "the model family, as traces written before layer_types recorded it",
);
/// The optimizers the traced job stepped, comma-separated (`none` without any).
pub const OPTIMIZER: Key = key("optimizer", Values::Text, "the optimizers the job stepped, comma-separated, or none");
/// Samples per step.
pub const BATCH_SIZE: Key = key("batch_size", Values::Positive, "samples per step");
/// Tokens per sample of a sequence model.
pub const SEQ_LEN: Key = key("seq_len", Values::Positive, "tokens per sample (a sequence model)");
/// One sample's dimensions, comma-separated (`3,224,224`).
pub const INPUT_SHAPE: Key =
    key("input_shape", Values::Dims, "one sample's dimensions, comma-separated (e.g. 3,224,224)");
/// Training steps traced.
pub const ITERATIONS: Key = key("iterations", Values::Positive, "training steps traced");
/// Micro-batches accumulated per optimizer step.
pub const GRAD_ACCUM: Key = key("grad_accum", Values::Positive, "micro-batches accumulated per optimizer step");
/// Ranks of the job; above 1 each holds NCCL buffers outside the allocator.
pub const WORLD_SIZE: Key =
    key("world_size", Values::Positive, "ranks of the job; above 1 each rank holds NCCL buffers outside the allocator");
/// The rank the trace is of.
pub const RANK: Key = key("rank", Values::Natural, "the rank this trace is of");
/// Parameters of the model.
pub const PARAMETERS: Key = key("parameters", Values::Natural, "parameters of the model");
/// Parameters the optimizer updates.
pub const TRAINABLE_PARAMETERS: Key = key("trainable_parameters", Values::Natural, "parameters the optimizer updates");
/// Sharding units (FSDP's wrapped modules, the root included); 1 without sharding.
pub const UNITS: Key =
    key("units", Values::Positive, "sharding units (FSDP-wrapped modules, the root included); 1 unsharded");
/// Parameter bytes one rank holds under sharding.
pub const LOCAL_PARAMETER_BYTES: Key =
    key("local_parameter_bytes", Values::Natural, "parameter bytes one rank holds under its sharding");
/// Bytes a paged optimizer keeps in unified memory, outside the allocator.
pub const PAGED_OPTIMIZER_BYTES: Key = key(
    "paged_optimizer_bytes",
    Values::Natural,
    "optimizer state bytes a paged optimizer keeps in unified memory, outside the caching allocator",
);
/// The SDPA backends the tracer chose, with counts.
pub const SDPA_BACKENDS: Key =
    key("sdpa_backends", Values::List, "scaled-dot-product attention backends chosen, as backend:calls");
/// The snapshot's `external_annotations`, as JSON text (written by the snapshot importer).
pub const SNAPSHOT_ANNOTATIONS: Key = key(
    "snapshot.external_annotations",
    Values::Text,
    "the snapshot's external_annotations as JSON text (memsim convert of a snapshot)",
);
/// `true` when the snapshot was in the old list-of-segments form (written by the importer).
pub const SNAPSHOT_LIST_FORM: Key = key(
    "snapshot.list_form",
    Values::Flag,
    "true when the snapshot was the old list-of-segments form (memsim convert of a snapshot)",
);
/// `true` when the producer writes a `process_exit` record last, whatever its name: a trace of
/// it without one was cut short ([`crate::read::Summary::cut_short`]).
pub const ENDS_WITH_EXIT: Key = key(
    "ends_with_exit",
    Values::Flag,
    "true when the producer writes a process_exit record last, so a trace without one was cut short (memsim \
     convert of a snapshot)",
);
/// When the traced process started (`/proc/self/stat`'s start time, clock ticks since boot):
/// with the header's pid it names one process, which keeps both across an exec.
pub const SHIM_PROCESS_START: Key = key(
    "memtrace.process_start",
    Values::Natural,
    "the traced process's start time in clock ticks since boot (with pid, names one process across exec)",
);
/// Whether the shim recorded kernel launches (`1`) or not (`0`).
pub const SHIM_KERNELS: Key =
    key("memtrace.kernels", Values::OneOf(&["0", "1"]), "1 when the shim recorded kernel launches");

/// The model or step traced.
pub const MODEL: Key = key("model", Values::Text, "the model or step traced");
/// The model's task (a zoo model).
pub const TASK: Key = key("task", Values::Text, "the model's task (a zoo model)");
/// Activation checkpointing.
pub const CHECKPOINTING: Key = key("checkpointing", Values::Text, "activation checkpointing (none, or the policy)");
/// The GPU profile the trace was emulated for.
pub const PROFILE: Key = key("profile", Values::Text, "the GPU profile the trace was emulated for");
/// The profile's compute capability.
pub const COMPUTE_CAPABILITY: Key =
    key("compute_capability", Values::Text, "the profile's compute capability (major.minor)");
/// The torch version that traced the job.
pub const TORCH: Key = key("torch", Values::Text, "the torch version that traced the job");
/// The distributed strategy.
pub const STRATEGY: Key = key("strategy", Values::Text, "the distributed strategy (ddp, fsdp, ...)");
/// What the distributed strategy runs as on the tracer's one process.
pub const RUNS_AS: Key = key("runs_as", Values::Text, "the code the distributed strategy runs as on one process");
/// FSDP mixed precision.
pub const FSDP_MP: Key = key("fsdp_mp", Values::Text, "FSDP mixed precision as param_dtype:reduce_dtype");
/// What a replay of the snapshot a trace was converted from cannot show, one caveat a line, as
/// memsim words them: kept so that every read of the trace says them, as a read of the snapshot
/// does (written by the snapshot importer, read through `simulator::snapshot::Caveats`).
pub const SNAPSHOT_CAVEATS: Key = key(
    "snapshot.caveats",
    Values::Text,
    "what a replay of the snapshot cannot show, one caveat a line; every memsim command reading the trace prints \
     them (memsim convert of a snapshot)",
);
/// `true` when the snapshot recorded no allocator event, only its segments when it was dumped:
/// its peaks are that state, and `--strict` refuses it, converted or not.
pub const SNAPSHOT_STATE_ONLY: Key = key(
    "snapshot.state_only",
    Values::Flag,
    "true when the snapshot recorded no allocator event, only its segments at dump time (--strict refuses it) \
     (memsim convert of a snapshot)",
);

/// How many trace entries of actions this version did not know the snapshot held, left out of
/// the trace: `--strict` refuses a trace with any, as it does records of unknown kinds.
pub const SNAPSHOT_UNKNOWN_ACTIONS: Key = key(
    "snapshot.unknown_actions",
    Values::Natural,
    "how many trace entries of actions this version did not know the snapshot held, left out (--strict refuses \
     any) (memsim convert of a snapshot)",
);

/// Every key with a meaning, in the schema's order: those readers act on, then those written
/// for people; keys added later are appended, whichever they are.
pub const KEYS: &[Key] = &[
    CLOCK,
    AMP,
    PARAM_DTYPE,
    USES_GEMM,
    USES_CONV,
    CUDNN_BENCHMARK,
    CUDA_EMULATION,
    LAYER_TYPES,
    FAMILY,
    OPTIMIZER,
    BATCH_SIZE,
    SEQ_LEN,
    INPUT_SHAPE,
    ITERATIONS,
    GRAD_ACCUM,
    WORLD_SIZE,
    RANK,
    UNITS,
    PARAMETERS,
    TRAINABLE_PARAMETERS,
    LOCAL_PARAMETER_BYTES,
    PAGED_OPTIMIZER_BYTES,
    SDPA_BACKENDS,
    SNAPSHOT_ANNOTATIONS,
    SNAPSHOT_LIST_FORM,
    ENDS_WITH_EXIT,
    SHIM_KERNELS,
    SHIM_PROCESS_START,
    MODEL,
    TASK,
    CHECKPOINTING,
    PROFILE,
    COMPUTE_CAPABILITY,
    TORCH,
    STRATEGY,
    RUNS_AS,
    FSDP_MP,
    SNAPSHOT_CAVEATS,
    SNAPSHOT_STATE_ONLY,
    SNAPSHOT_UNKNOWN_ACTIONS,
];

/// The key of this name, if it has a meaning.
pub fn lookup(name: &str) -> Option<&'static Key> {
    KEYS.iter().find(|k| k.name == name)
}

impl Header {
    /// The value of a metadata key, when it is in the key's domain; a value outside it reads as
    /// absent (and [`Header::metadata_warnings`] says so).
    pub fn meta(&self, key: &Key) -> Option<&str> {
        self.metadata.get(key.name).map(String::as_str).filter(|v| key.values.admits(v))
    }

    /// A [`Values::Flag`] key's value.
    pub fn meta_flag(&self, key: &Key) -> Option<bool> {
        self.meta(key).map(|v| v == "true")
    }

    /// A [`Values::Positive`] or [`Values::Natural`] key's value.
    pub fn meta_count(&self, key: &Key) -> Option<u64> {
        self.meta(key).and_then(|v| v.parse().ok())
    }

    /// Records a key's value.
    pub fn set_meta(&mut self, key: &Key, value: impl Into<String>) {
        self.metadata.insert(key.name.to_string(), value.into());
    }

    /// One line for each known key whose value is outside its domain, naming `path`, the key,
    /// the value and what was expected; the value is ignored.
    pub fn metadata_warnings(&self, path: &Path) -> Vec<String> {
        self.metadata
            .iter()
            .filter_map(|(name, value)| {
                let key = lookup(name)?;
                (!key.values.admits(value)).then(|| {
                    format!(
                        "{}: header metadata `{name}` = {value:?}: expected {}; ignored",
                        path.display(),
                        key.values.expected()
                    )
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique() {
        let mut names: Vec<&str> = KEYS.iter().map(|k| k.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), KEYS.len(), "a key is listed twice");
    }

    #[test]
    fn domains() {
        let check = |values: Values, ok: &[&str], bad: &[&str]| {
            for v in ok {
                assert!(values.admits(v), "{values:?} should admit {v:?}");
            }
            for v in bad {
                assert!(!values.admits(v), "{values:?} should refuse {v:?}");
            }
        };
        check(Values::Flag, &["true", "false"], &["True", "1", "", "yes"]);
        check(Values::OneOf(PRECISIONS), &["fp32", "bf16"], &["BF16", "float32", ""]);
        check(
            Values::Positive,
            &["1", "8", "18446744073709551615"],
            &["0", "08", "-1", "", "1.5", "18446744073709551616"],
        );
        check(Values::Natural, &["0", "12"], &["00", "-0", " 1", "x"]);
        check(Values::List, &["", "Linear", "Conv2d,Linear", "flash:3, math:1"], &[",", "Linear,", ",Linear", "a,,b"]);
        check(Values::Text, &["", "anything, at all"], &[]);
    }

    #[test]
    fn a_value_outside_its_domain_reads_as_absent_and_is_warned_about() {
        let mut h = Header::new("t", "0", crate::Level::Allocator);
        h.set_meta(&USES_GEMM, "True");
        h.set_meta(&BATCH_SIZE, "8");
        h.metadata.insert("my_own_key".into(), "whatever".into());
        assert_eq!(h.meta_flag(&USES_GEMM), None);
        assert_eq!(h.meta_count(&BATCH_SIZE), Some(8));
        assert_eq!(
            h.metadata_warnings(Path::new("t.jsonl")),
            ["t.jsonl: header metadata `uses_gemm` = \"True\": expected true or false; ignored"]
        );
    }
}
