//! The trace header: who wrote the trace, about which process, on which machine, at which level.

use std::collections::BTreeMap;

use bincode::{Decode, Encode};
use serde::{Deserialize, Serialize};

/// The binary format version this crate writes. Readers accept every version up to this one.
pub const FORMAT_VERSION: u16 = 1;

/// Environment variables that change allocator behaviour; producers record them in
/// [`Header::env`] when set.
pub const ALLOCATOR_ENV_VARS: [&str; 6] = [
    "PYTORCH_CUDA_ALLOC_CONF",
    "PYTORCH_ALLOC_CONF",
    "PYTORCH_NO_CUDA_MEMORY_CACHING",
    "CUDA_VISIBLE_DEVICES",
    "CUDA_MODULE_LOADING",
    "CUBLAS_WORKSPACE_CONFIG",
];

/// What allocation events mean.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Encode, Decode)]
pub enum Level {
    /// Each allocation is a driver or runtime call; with PyTorch's cache on, these are segments.
    #[serde(rename = "device")]
    Device,
    /// Each allocation is a request to the framework's allocator (a tensor block). memsim replays
    /// these.
    #[serde(rename = "allocator")]
    Allocator,
}

/// The program that wrote the trace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Encode, Decode)]
pub struct Producer {
    /// e.g. `libmemtrace`, `memtrace_trainer.symtrace`, `memsim convert (snapshot)`.
    pub name: String,
    /// Its version.
    pub version: String,
}

/// Properties of one CUDA device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Encode, Decode)]
pub struct DeviceInfo {
    /// Device ordinal.
    pub index: u32,
    /// Device name, e.g. `NVIDIA A100-SXM4-40GB`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Total memory in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_memory: Option<u64>,
    /// Number of SMs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sm_count: Option<u32>,
    /// Compute capability (major, minor).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_capability: Option<(u32, u32)>,
}

/// The trace header. In JSON Lines it is the first line, with `"kind": "header"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Encode, Decode)]
pub struct Header {
    /// Format version of the file this header was read from (written as [`FORMAT_VERSION`]).
    pub format_version: u16,
    /// Who wrote the trace.
    pub producer: Producer,
    /// What allocation events mean.
    pub level: Level,
    /// True when the trace was taken with `PYTORCH_NO_CUDA_MEMORY_CACHING` set: a device-level
    /// trace that is allocator level in effect (one exact `cudaMalloc` per tensor).
    #[serde(default)]
    pub caching_disabled: bool,
    /// Process id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// Wall-clock time of the clock origin, ns since the Unix epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_wall_ns: Option<u64>,
    /// Monotonic clock reading (CLOCK_MONOTONIC, ns) that event timestamps are relative to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clock_origin_ns: Option<u64>,
    /// Command line.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command_line: Vec<String>,
    /// Host name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_name: Option<String>,
    /// Allocator-relevant environment variables that were set (see [`ALLOCATOR_ENV_VARS`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty", deserialize_with = "unique_keys")]
    pub env: BTreeMap<String, String>,
    /// CUDA driver version (e.g. 13000), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda_driver_version: Option<u32>,
    /// CUDA runtime version, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda_runtime_version: Option<u32>,
    /// Devices, when known.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<DeviceInfo>,
    /// Allocator settings as the framework reported them (a snapshot's `allocator_settings`, as
    /// JSON text), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocator_settings: Option<String>,
    /// True when allocation addresses are identifiers chosen by the producer (the symbolic
    /// tracer), not addresses a real device returned. Replay then never places segments at them.
    #[serde(default)]
    pub synthetic_addresses: bool,
    /// Producer metadata: the keys with a meaning are listed in [`crate::metadata`] and read
    /// through [`Header::meta`]; any other key is free-form, for people.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty", deserialize_with = "unique_keys")]
    pub metadata: BTreeMap<String, String>,
}

/// A map of strings whose keys are each given once: JSON allows a key twice, and a map keeps
/// one of them silently (a recorded `PYTORCH_CUDA_ALLOC_CONF` given twice replayed with the
/// last), while which one the writer meant is unknown. The error is read under the field's path.
fn unique_keys<'de, D: serde::Deserializer<'de>>(d: D) -> Result<BTreeMap<String, String>, D::Error> {
    struct Unique;
    impl<'de> serde::de::Visitor<'de> for Unique {
        type Value = BTreeMap<String, String>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("an object of strings, each key once")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, mut m: A) -> Result<Self::Value, A::Error> {
            let mut out = BTreeMap::new();
            while let Some((k, v)) = m.next_entry::<String, String>()? {
                if out.contains_key(&k) {
                    return Err(serde::de::Error::custom(format!(
                        "key `{k}` is given twice: expected each key once (which one the writer meant is unknown)"
                    )));
                }
                out.insert(k, v);
            }
            Ok(out)
        }
    }
    d.deserialize_map(Unique)
}

impl Header {
    /// A header with only the required fields set.
    pub fn new(producer: &str, version: &str, level: Level) -> Self {
        Header {
            format_version: FORMAT_VERSION,
            producer: Producer { name: producer.to_string(), version: version.to_string() },
            level,
            caching_disabled: false,
            pid: None,
            start_wall_ns: None,
            clock_origin_ns: None,
            command_line: Vec::new(),
            host_name: None,
            env: BTreeMap::new(),
            cuda_driver_version: None,
            cuda_runtime_version: None,
            devices: Vec::new(),
            allocator_settings: None,
            synthetic_addresses: false,
            metadata: BTreeMap::new(),
        }
    }

    /// The value of an environment variable recorded in the header.
    pub fn env_var(&self, key: &str) -> Option<&str> {
        self.env.get(key).map(String::as_str)
    }

    /// The allocator configuration string in force: `PYTORCH_ALLOC_CONF` wins over
    /// `PYTORCH_CUDA_ALLOC_CONF`, as in PyTorch 2.9+.
    pub fn alloc_conf(&self) -> Option<&str> {
        self.env_var("PYTORCH_ALLOC_CONF").or_else(|| self.env_var("PYTORCH_CUDA_ALLOC_CONF"))
    }

    /// Whether allocation events are allocator-level requests in effect.
    pub fn is_allocator_level(&self) -> bool {
        self.level == Level::Allocator || self.caching_disabled
    }
}
