//! `PYTORCH_CUDA_ALLOC_CONF` / `PYTORCH_ALLOC_CONF` parsing (spec §11) and snapshot settings (§14).

use thiserror::Error;

use super::rounding::{K_LARGE_BUFFER, K_MIN_BLOCK_SIZE, K_SMALL_SIZE, ROUNDUP_INTERVALS};
use super::version::TorchVersion;

const MB: u64 = 1 << 20;

/// Which device allocator the configuration selects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Backend {
    /// The native caching allocator, the one this crate models.
    #[default]
    Native,
    /// `cudaMallocAsync`: the driver's stream-ordered allocator; native options are ignored.
    CudaMallocAsync,
}

/// The allocator options that influence placement, plus the ones that are only validated.
#[derive(Debug, Clone, PartialEq)]
pub struct AllocatorConfig {
    /// `max_split_size_mb` in bytes; `u64::MAX` when unset (snapshots show −1).
    pub max_split_size: u64,
    /// `max_non_split_rounding_mb` in bytes (2.5+; default 20 MiB).
    pub max_non_split_rounding: u64,
    /// Divisions per power-of-two interval, index 0 = sizes below 2 MiB.
    pub roundup_power2_divisions: [u64; ROUNDUP_INTERVALS],
    /// `garbage_collection_threshold`, 0 when unset.
    pub garbage_collection_threshold: f64,
    /// `expandable_segments`.
    pub expandable_segments: bool,
    /// `per_process_memory_fraction` (2.9+ key), or a fraction recorded elsewhere.
    pub per_process_memory_fraction: Option<f64>,
    /// `backend`.
    pub backend: Backend,
    /// `release_lock_on_cudamalloc` (locking only; no placement effect).
    pub release_lock_on_cudamalloc: bool,
    /// `pinned_use_cuda_host_register` (host allocator only).
    pub pinned_use_cuda_host_register: bool,
    /// `pinned_num_register_threads` (host allocator only).
    pub pinned_num_register_threads: u64,
    /// `pinned_use_background_threads` (host allocator only).
    pub pinned_use_background_threads: bool,
    /// `pinned_reserve_segment_size_mb` (host allocator only), in MiB.
    pub pinned_reserve_segment_size_mb: u64,
    /// `graph_capture_record_stream_reuse` (graph capture only).
    pub graph_capture_record_stream_reuse: bool,
}

impl AllocatorConfig {
    /// What the configuration asks for that the model does not follow, as a warning: the
    /// `cudaMallocAsync` backend, whose blocks the driver's stream-ordered pool places. `None`
    /// when the model follows all of it.
    pub fn unmodelled(&self) -> Option<String> {
        (self.backend == Backend::CudaMallocAsync).then(|| {
            "backend:cudaMallocAsync is not modelled: the replay follows the native caching allocator's \
             rules, while under cudaMallocAsync the driver's pool places the blocks, so reserved memory \
             and the verdict may differ from such a run"
                .to_string()
        })
    }
}

impl Default for AllocatorConfig {
    fn default() -> Self {
        AllocatorConfig {
            max_split_size: u64::MAX,
            max_non_split_rounding: K_LARGE_BUFFER,
            roundup_power2_divisions: [0; ROUNDUP_INTERVALS],
            garbage_collection_threshold: 0.0,
            expandable_segments: false,
            per_process_memory_fraction: None,
            backend: Backend::Native,
            release_lock_on_cudamalloc: false,
            pinned_use_cuda_host_register: false,
            pinned_num_register_threads: 1,
            pinned_use_background_threads: false,
            pinned_reserve_segment_size_mb: 0,
            graph_capture_record_stream_reuse: false,
        }
    }
}

/// An invalid allocator configuration. Messages follow PyTorch's wording and name the key.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum ConfigError {
    /// A separator was missing or misplaced (`expected ':'` after a key, `,` between options).
    #[error("Error parsing CachingAllocator settings at token {position}: expected '{expected}' but got '{found}'")]
    Syntax {
        /// Token index.
        position: usize,
        /// The separator PyTorch requires there.
        expected: char,
        /// What was there instead ("EOF" at the end).
        found: String,
    },
    /// A key this release does not know.
    #[error("Unrecognized key '{key}' in CUDA allocator config (PyTorch {version})")]
    UnknownKey {
        /// The key.
        key: String,
        /// The release whose key set was used.
        version: TorchVersion,
    },
    /// A key with nothing after its ':'.
    #[error("Error, expecting {key} value")]
    MissingValue {
        /// The key.
        key: String,
    },
    /// A value that is not a number of the expected kind.
    #[error("{key}: expected {expected} but got '{value}'")]
    InvalidNumber {
        /// The key.
        key: String,
        /// The text given.
        value: String,
        /// What was expected ("a non-negative integer", "a number").
        expected: &'static str,
    },
    /// A boolean given as anything but exactly `True` or `False`.
    #[error("Expected a single True/False argument for {key} but got '{value}'")]
    InvalidBool {
        /// The key.
        key: String,
        /// The text given.
        value: String,
    },
    /// A size below the release's minimum.
    #[error("CachingAllocator option {key} too small, must be {bound} {min}")]
    TooSmall {
        /// The key.
        key: String,
        /// `>` (2.4-era) or `>=` (2.9+).
        bound: &'static str,
        /// The minimum in MiB.
        min: u64,
    },
    /// A number outside its allowed range.
    #[error("{key} is invalid ({value}), set it in {range}")]
    OutOfRange {
        /// The key.
        key: String,
        /// The value given.
        value: f64,
        /// The allowed range, e.g. "(0.0, 1.0)".
        range: &'static str,
    },
    /// A value that must be a power of two.
    #[error("For roundups, the {what} has to be power of 2{extra} (key {key}, got {value})")]
    NotPowerOfTwo {
        /// The key.
        key: String,
        /// "divisions" or "intervals".
        what: &'static str,
        /// " or 0 to disable roundup" where 0 is allowed.
        extra: &'static str,
        /// The value given.
        value: u64,
    },
    /// `backend` with an unknown value.
    #[error("Unknown allocator backend '{value}', options should be native or cudaMallocAsync")]
    UnknownBackend {
        /// The value given.
        value: String,
    },
    /// A second `backend` naming another backend than the first (2.4 to 2.8).
    #[error(
        "backend is given as '{first}' and then as '{then}': PyTorch {version} picks the backend at load time from \
         the first and its runtime parse fails on a later one that differs; give backend once"
    )]
    BackendChanged {
        /// The first value, the one in force.
        first: String,
        /// The later value that differs.
        then: String,
        /// The version whose rule applies.
        version: TorchVersion,
    },
    /// A snapshot `allocator_settings` field of the wrong type or value.
    #[error("allocator_settings field '{field}': expected {expected}")]
    Settings {
        /// The field.
        field: String,
        /// What was expected.
        expected: &'static str,
    },
}

impl ConfigError {
    fn not_power_of_two(key: &str, what: &'static str, extra: &'static str, value: u64) -> ConfigError {
        ConfigError::NotPowerOfTwo { key: key.to_string(), what, extra, value }
    }
}

/// Splits on `,` `:` `[` `]` (kept as tokens) and drops spaces, as both PyTorch lexers do.
fn tokenize(s: &str, version: TorchVersion) -> Vec<String> {
    let mut out = Vec::new();
    let mut buf = String::new();
    for ch in s.chars() {
        if matches!(ch, ',' | ':' | '[' | ']') {
            if !buf.is_empty() {
                out.push(std::mem::take(&mut buf));
            }
            out.push(ch.to_string());
        } else if ch == ' ' || (version >= TorchVersion::V2_9 && ch.is_ascii_whitespace()) {
            // 2.4-era lexArgs drops only ' '; ConfigTokenizer drops all whitespace.
        } else {
            buf.push(ch);
        }
    }
    if !buf.is_empty() {
        out.push(buf);
    }
    out
}

struct Parser<'a> {
    toks: &'a [String],
    version: TorchVersion,
}

impl Parser<'_> {
    fn expect(&self, i: usize, c: char) -> Result<(), ConfigError> {
        match self.toks.get(i) {
            Some(t) if t.len() == 1 && t.starts_with(c) => Ok(()),
            other => Err(ConfigError::Syntax {
                position: i,
                expected: c,
                found: other.cloned().unwrap_or_else(|| "EOF".to_string()),
            }),
        }
    }

    fn value<'b>(&'b self, i: usize, key: &str) -> Result<&'b str, ConfigError> {
        match self.toks.get(i) {
            Some(t) if !matches!(t.as_str(), "," | ":" | "[" | "]") => Ok(t),
            _ => Err(ConfigError::MissingValue { key: key.to_string() }),
        }
    }

    fn uint(&self, i: usize, key: &str) -> Result<u64, ConfigError> {
        let v = self.value(i, key)?;
        v.parse::<u64>().map_err(|_| ConfigError::InvalidNumber {
            key: key.to_string(),
            value: v.to_string(),
            expected: "a non-negative integer",
        })
    }

    fn float(&self, i: usize, key: &str) -> Result<f64, ConfigError> {
        let v = self.value(i, key)?;
        v.parse::<f64>().ok().filter(|f| f.is_finite()).ok_or_else(|| ConfigError::InvalidNumber {
            key: key.to_string(),
            value: v.to_string(),
            expected: "a number",
        })
    }

    fn boolean(&self, i: usize, key: &str) -> Result<bool, ConfigError> {
        match self.value(i, key)? {
            "True" => Ok(true),
            "False" => Ok(false),
            other => Err(ConfigError::InvalidBool { key: key.to_string(), value: other.to_string() }),
        }
    }

    /// `max_split_size_mb` and `max_non_split_rounding_mb`: > 20 in older parsers, >= 20 in 2.9+.
    fn split_size(&self, i: usize, key: &str) -> Result<u64, ConfigError> {
        let v = self.uint(i, key)?;
        let min = K_LARGE_BUFFER / MB;
        let (ok, bound) = if self.version >= TorchVersion::V2_9 { (v >= min, ">=") } else { (v > min, ">") };
        if !ok {
            return Err(ConfigError::TooSmall { key: key.to_string(), bound, min });
        }
        Ok(v.min(u64::MAX / MB) * MB)
    }

    /// Returns the index of the last token consumed.
    fn divisions(&self, mut i: usize, key: &str, out: &mut [u64; ROUNDUP_INTERVALS]) -> Result<usize, ConfigError> {
        self.expect(i + 1, ':')?;
        i += 2;
        if self.toks.get(i).map(String::as_str) != Some("[") {
            let d = self.uint(i, key)?;
            if !d.is_power_of_two() {
                return Err(ConfigError::not_power_of_two(key, "divisions", "", d));
            }
            out.fill(d);
            return Ok(i);
        }
        let mut first = true;
        let mut last_index = 0usize;
        loop {
            i += 1;
            match self.toks.get(i).map(String::as_str) {
                None => return Err(ConfigError::Syntax { position: i, expected: ']', found: "EOF".into() }),
                Some("]") => return Ok(i),
                Some(_) => {}
            }
            let interval = self.value(i, key)?.to_string();
            self.expect(i + 1, ':')?;
            i += 2;
            let d = self.uint(i, key)?;
            if d != 0 && !d.is_power_of_two() {
                return Err(ConfigError::not_power_of_two(key, "divisions", " or 0 to disable roundup", d));
            }
            if interval == ">" {
                // 2.4/2.5 fill from the last explicit interval, overwriting it; 2.9+ from the next.
                let start = if self.version >= TorchVersion::V2_9 { last_index + 1 } else { last_index };
                for slot in out.iter_mut().skip(start) {
                    *slot = d;
                }
            } else {
                let k = interval.parse::<u64>().map_err(|_| ConfigError::InvalidNumber {
                    key: key.to_string(),
                    value: interval.clone(),
                    expected: "an interval start in MiB or '>'",
                })?;
                if !k.is_power_of_two() {
                    return Err(ConfigError::not_power_of_two(key, "intervals", "", k));
                }
                let index = ((63 - k.leading_zeros()) as usize).min(ROUNDUP_INTERVALS - 1);
                if first {
                    out[..index].fill(d);
                    first = false;
                }
                out[index] = d;
                last_index = index;
            }
            match self.toks.get(i + 1).map(String::as_str) {
                Some("]") => {}
                None => return Err(ConfigError::Syntax { position: i + 1, expected: ']', found: "EOF".into() }),
                Some(_) => {
                    self.expect(i + 1, ',')?;
                    i += 1;
                }
            }
        }
    }

    fn known(&self, key: &str) -> bool {
        let v = self.version;
        match key {
            "max_split_size_mb"
            | "garbage_collection_threshold"
            | "roundup_power2_divisions"
            | "backend"
            | "expandable_segments"
            | "release_lock_on_cudamalloc"
            | "release_lock_on_hipmalloc"
            | "pinned_use_cuda_host_register"
            | "pinned_use_hip_host_register"
            | "pinned_num_register_threads" => true,
            "max_non_split_rounding_mb" | "pinned_use_background_threads" => v >= TorchVersion::V2_5,
            "pinned_reserve_segment_size_mb" | "graph_capture_record_stream_reuse" | "per_process_memory_fraction" => {
                v >= TorchVersion::V2_9
            }
            _ => false,
        }
    }

    fn run(&self, cfg: &mut AllocatorConfig) -> Result<(), ConfigError> {
        let mut i = 0;
        let mut first_backend: Option<&str> = None;
        while i < self.toks.len() {
            let key = self.toks[i].as_str();
            if !self.known(key) {
                return Err(ConfigError::UnknownKey { key: key.to_string(), version: self.version });
            }
            if key != "roundup_power2_divisions" {
                self.expect(i + 1, ':')?;
                i += 2;
            }
            match key {
                "max_split_size_mb" => cfg.max_split_size = self.split_size(i, key)?,
                "max_non_split_rounding_mb" => cfg.max_non_split_rounding = self.split_size(i, key)?,
                "garbage_collection_threshold" => {
                    let t = self.float(i, key)?;
                    if !(t > 0.0 && t < 1.0) {
                        return Err(ConfigError::OutOfRange { key: key.into(), value: t, range: "(0.0, 1.0)" });
                    }
                    cfg.garbage_collection_threshold = t;
                }
                "roundup_power2_divisions" => i = self.divisions(i, key, &mut cfg.roundup_power2_divisions)?,
                "backend" => {
                    let value = self.value(i, key)?;
                    // Before 2.9 the load-time scan returns at the first `backend:` and the runtime
                    // parse asserts each later one agrees, so a change is PyTorch's error, not a choice.
                    match first_backend {
                        Some(first) if first != value && self.version < TorchVersion::V2_9 => {
                            return Err(ConfigError::BackendChanged {
                                first: first.to_string(),
                                then: value.to_string(),
                                version: self.version,
                            });
                        }
                        Some(_) => {}
                        None => first_backend = Some(value),
                    }
                    cfg.backend = match value {
                        "native" => Backend::Native,
                        "cudaMallocAsync" => Backend::CudaMallocAsync,
                        other => return Err(ConfigError::UnknownBackend { value: other.to_string() }),
                    }
                }
                "expandable_segments" => cfg.expandable_segments = self.boolean(i, key)?,
                "release_lock_on_cudamalloc" | "release_lock_on_hipmalloc" => {
                    cfg.release_lock_on_cudamalloc = self.boolean(i, key)?
                }
                "pinned_use_cuda_host_register" | "pinned_use_hip_host_register" => {
                    cfg.pinned_use_cuda_host_register = self.boolean(i, key)?
                }
                "pinned_num_register_threads" => {
                    let n = self.uint(i, key)?;
                    if !n.is_power_of_two() || n > 128 {
                        return Err(ConfigError::not_power_of_two(
                            key,
                            "number of register threads",
                            " and at most 128",
                            n,
                        ));
                    }
                    cfg.pinned_num_register_threads = n;
                }
                "pinned_use_background_threads" => cfg.pinned_use_background_threads = self.boolean(i, key)?,
                "pinned_reserve_segment_size_mb" => cfg.pinned_reserve_segment_size_mb = self.uint(i, key)?,
                "graph_capture_record_stream_reuse" => cfg.graph_capture_record_stream_reuse = self.boolean(i, key)?,
                "per_process_memory_fraction" => {
                    let f = self.float(i, key)?;
                    if !(0.0..=1.0).contains(&f) {
                        return Err(ConfigError::OutOfRange { key: key.into(), value: f, range: "[0.0, 1.0]" });
                    }
                    cfg.per_process_memory_fraction = Some(f);
                }
                _ => return Err(ConfigError::UnknownKey { key: key.to_string(), version: self.version }),
            }
            if i + 1 < self.toks.len() {
                self.expect(i + 1, ',')?;
                i += 1;
            }
            i += 1;
        }
        Ok(())
    }
}

impl AllocatorConfig {
    /// Whether a block of the small pool (`small`) or of the large one splits off any remainder of
    /// at least a block: the small pool does, and with `expandable_segments` every pool does
    /// (PyTorch's `shouldSplit` reads the configuration, not the segment).
    #[inline]
    pub fn splits_any_remainder(&self, small: bool) -> bool {
        small || self.expandable_segments
    }

    /// `shouldSplit`: whether a free block serving a `size`-byte request is split, leaving
    /// `remaining` bytes free. Small remainders split off where [`Self::splits_any_remainder`];
    /// otherwise only requests under `max_split_size`, and only a remainder over 1 MiB (smaller
    /// ones are absorbed into the block). The one statement of the rule: the allocator applies
    /// it, the snapshot rebuild reads it backwards, the resync follows it.
    #[inline]
    pub fn should_split(&self, small: bool, size: u64, remaining: u64) -> bool {
        if self.splits_any_remainder(small) {
            remaining >= K_MIN_BLOCK_SIZE
        } else {
            size < self.max_split_size && remaining > K_SMALL_SIZE
        }
    }

    /// Parse a `PYTORCH_CUDA_ALLOC_CONF` / `PYTORCH_ALLOC_CONF` string with the syntax and
    /// validation rules of `version`. Errors name the key and what was expected.
    pub fn parse(s: &str, version: TorchVersion) -> Result<Self, ConfigError> {
        let toks = tokenize(s, version);
        let mut cfg = AllocatorConfig::default();
        Parser { toks: &toks, version }.run(&mut cfg)?;
        Ok(cfg)
    }

    /// Build from a snapshot's `allocator_settings` dict. The raw `PYTORCH_CUDA_ALLOC_CONF`
    /// string is parsed first (it alone carries `max_non_split_rounding_mb`); the structured
    /// fields then take precedence because they are what the allocator actually used.
    pub fn from_snapshot_settings(v: &serde_json::Value, version: TorchVersion) -> Result<Self, ConfigError> {
        let obj =
            v.as_object().ok_or(ConfigError::Settings { field: "allocator_settings".into(), expected: "a dict" })?;
        let mut cfg = match obj.get("PYTORCH_CUDA_ALLOC_CONF") {
            None | Some(serde_json::Value::Null) => AllocatorConfig::default(),
            Some(serde_json::Value::String(s)) => AllocatorConfig::parse(s, version)?,
            Some(_) => {
                return Err(ConfigError::Settings { field: "PYTORCH_CUDA_ALLOC_CONF".into(), expected: "a string" })
            }
        };
        let bad = |field: &str, expected: &'static str| ConfigError::Settings { field: field.to_string(), expected };
        if let Some(x) = obj.get("max_split_size") {
            let n = x.as_i64().ok_or_else(|| bad("max_split_size", "an integer (-1 for unlimited)"))?;
            cfg.max_split_size = match n {
                -1 => u64::MAX,
                n if n > 0 => n as u64,
                _ => return Err(bad("max_split_size", "a positive integer or -1")),
            };
        }
        if let Some(x) = obj.get("garbage_collection_threshold") {
            let t = x.as_f64().ok_or_else(|| bad("garbage_collection_threshold", "a number"))?;
            if !(0.0..1.0).contains(&t) {
                return Err(bad("garbage_collection_threshold", "a number in [0, 1)"));
            }
            cfg.garbage_collection_threshold = t;
        }
        let flag = |field: &str, dst: &mut bool| -> Result<(), ConfigError> {
            if let Some(x) = obj.get(field) {
                *dst = x.as_bool().ok_or_else(|| bad(field, "a bool"))?;
            }
            Ok(())
        };
        flag("expandable_segments", &mut cfg.expandable_segments)?;
        flag("release_lock_on_cudamalloc", &mut cfg.release_lock_on_cudamalloc)?;
        flag("pinned_use_cuda_host_register", &mut cfg.pinned_use_cuda_host_register)?;
        flag("graph_capture_record_stream_reuse", &mut cfg.graph_capture_record_stream_reuse)?;
        if let Some(x) = obj.get("pinned_num_register_threads") {
            cfg.pinned_num_register_threads =
                x.as_u64().ok_or_else(|| bad("pinned_num_register_threads", "a non-negative integer"))?;
        }
        if let Some(x) = obj.get("roundup_power2_divisions") {
            cfg.roundup_power2_divisions = settings_divisions(x)?;
        }
        Ok(cfg)
    }
}

/// The snapshot form: a dict keyed by interval start in MiB ('1' … '32768'), or a plain list.
fn settings_divisions(x: &serde_json::Value) -> Result<[u64; ROUNDUP_INTERVALS], ConfigError> {
    const FIELD: &str = "roundup_power2_divisions";
    let bad = |expected| ConfigError::Settings { field: FIELD.into(), expected };
    let mut out = [0u64; ROUNDUP_INTERVALS];
    match x {
        serde_json::Value::Object(m) => {
            for (k, v) in m {
                let mib: u64 = k.parse().map_err(|_| bad("keys that are interval starts in MiB"))?;
                if !mib.is_power_of_two() || mib.trailing_zeros() as usize >= ROUNDUP_INTERVALS {
                    return Err(bad("keys that are powers of two from 1 to 32768"));
                }
                out[mib.trailing_zeros() as usize] = v.as_u64().ok_or_else(|| bad("non-negative integer values"))?;
            }
        }
        serde_json::Value::Array(a) if a.len() == ROUNDUP_INTERVALS => {
            for (slot, v) in out.iter_mut().zip(a) {
                *slot = v.as_u64().ok_or_else(|| bad("non-negative integer values"))?;
            }
        }
        _ => return Err(bad("a dict keyed by interval start in MiB, or a list of 16 integers")),
    }
    Ok(out)
}
