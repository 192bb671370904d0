//! A snapshot's allocator configuration as replayed, in `PYTORCH_CUDA_ALLOC_CONF` syntax: its
//! recorded string with the `allocator_settings` fields written in where they decide (a field
//! wins over the string, and a program may set one at run time that the string never names).
//! Printing the string alone showed a configuration the replay did not follow.

use super::rounding::ROUNDUP_INTERVALS;
use super::AllocatorConfig;

/// A field's value in the string's syntax; `None` where it is unset, which the syntax cannot say
/// (the key is then left out, and PyTorch's default is in force).
type Conf = fn(&AllocatorConfig) -> Option<String>;

/// A value as a warning says it.
type Show = fn(&AllocatorConfig) -> String;

fn flag(on: bool) -> Option<String> {
    Some(if on { "True" } else { "False" }.to_string())
}

/// The keys compared, as `PYTORCH_CUDA_ALLOC_CONF` names them: how a warning shows each value,
/// and, for those a snapshot's `allocator_settings` fields set, how the string writes it.
pub(super) const KEYS: &[(&str, Show, Option<Conf>)] = &[
    ("expandable_segments", |c| c.expandable_segments.to_string(), Some(|c| flag(c.expandable_segments))),
    (
        "max_split_size_mb",
        |c| match c.max_split_size {
            u64::MAX => "unset".into(),
            b => format!("{} MiB", b >> 20),
        },
        Some(|c| match c.max_split_size {
            u64::MAX => None,
            b if b % (1 << 20) == 0 => Some((b >> 20).to_string()),
            b => Some((b as f64 / (1u64 << 20) as f64).to_string()),
        }),
    ),
    (
        "garbage_collection_threshold",
        |c| c.garbage_collection_threshold.to_string(),
        Some(|c| (c.garbage_collection_threshold > 0.0).then(|| c.garbage_collection_threshold.to_string())),
    ),
    ("roundup_power2_divisions", |c| format!("{:?}", c.roundup_power2_divisions), Some(divisions)),
    ("max_non_split_rounding_mb", |c| format!("{} MiB", c.max_non_split_rounding >> 20), None),
    ("per_process_memory_fraction", |c| format!("{:?}", c.per_process_memory_fraction), None),
    ("backend", |c| format!("{:?}", c.backend), None),
    (
        "release_lock_on_cudamalloc",
        |c| c.release_lock_on_cudamalloc.to_string(),
        Some(|c| flag(c.release_lock_on_cudamalloc)),
    ),
    (
        "pinned_use_cuda_host_register",
        |c| c.pinned_use_cuda_host_register.to_string(),
        Some(|c| flag(c.pinned_use_cuda_host_register)),
    ),
    (
        "pinned_num_register_threads",
        |c| c.pinned_num_register_threads.to_string(),
        Some(|c| Some(c.pinned_num_register_threads.to_string())),
    ),
    (
        "graph_capture_record_stream_reuse",
        |c| c.graph_capture_record_stream_reuse.to_string(),
        Some(|c| flag(c.graph_capture_record_stream_reuse)),
    ),
];

fn divisions(c: &AllocatorConfig) -> Option<String> {
    let d = &c.roundup_power2_divisions;
    if d.iter().all(|&x| x == 0) {
        return None;
    }
    if d.iter().all(|&x| x == d[0]) {
        return Some(d[0].to_string());
    }
    // Index i is the interval starting at 2^i MiB, as the parser reads it.
    let each: Vec<String> = (0..ROUNDUP_INTERVALS).map(|i| format!("{}:{}", 1u64 << i, d[i])).collect();
    Some(format!("[{}]", each.join(",")))
}

/// The key of one `key:value` part, by the name the fields use (PyTorch's HIP spellings alike).
fn key_of(part: &str) -> &str {
    match part.split(':').next().unwrap_or("").trim() {
        "release_lock_on_hipmalloc" => "release_lock_on_cudamalloc",
        "pinned_use_hip_host_register" => "pinned_use_cuda_host_register",
        k => k,
    }
}

/// Whether a configuration string names `key` (by either spelling).
pub(super) fn names(conf: &str, key: &str) -> bool {
    parts(conf).iter().any(|p| key_of(p) == key)
}

/// A warning for each key a configuration string (`source`: where it came from) gives more than
/// once (either spelling): PyTorch's parser sets the key again at each, so the last is in force,
/// as it is in the replay; the earlier ones say nothing, which was left unsaid. Divisions lists
/// merge instead, and a changed `backend` is refused by the parser before this is reached.
pub(super) fn repeated(conf: &str, source: &str) -> Vec<String> {
    let keys: Vec<&str> = parts(conf).iter().map(|p| key_of(p)).collect();
    let mut out: Vec<String> = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        let first_repeat = keys[..i].iter().filter(|k| *k == key).count() == 1;
        if first_repeat {
            let given: Vec<&str> = parts(conf).into_iter().filter(|p| key_of(p) == *key).collect();
            let last = given.last().copied().unwrap_or_default().trim();
            // A divisions list writes only the intervals it names (and, from its first entry, those
            // below), as c10's parseRoundUpPower2Divisions does, so an earlier list can stay in force.
            if *key == "roundup_power2_divisions" && given.iter().any(|p| p.contains('[')) {
                out.push(format!(
                    "the allocator configuration {source} (\"{conf}\") gives {key} more than once: PyTorch does not \
                     follow only the last; each sets the intervals it names (a list's first entry also those below \
                     it, a single number all of them) and a later one overrides just those, so intervals only an \
                     earlier one names keep its divisions, and so does the replay"
                ));
                continue;
            }
            out.push(format!(
                "the allocator configuration {source} (\"{conf}\") gives {key} more than once: PyTorch follows the \
                 last ({last}), and so does the replay; the earlier ones have no effect"
            ));
        }
    }
    out
}

/// The string's `key:value` parts (a comma inside `[...]` belongs to its part).
fn parts(conf: &str) -> Vec<&str> {
    let (mut out, mut depth, mut start) = (Vec::new(), 0i32, 0);
    for (i, ch) in conf.char_indices() {
        match ch {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth <= 0 => {
                out.push(&conf[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&conf[start..]);
    out.into_iter().filter(|p| !p.trim().is_empty()).collect()
}

/// The configuration replayed as a string, and which of its parts the fields decided (`None`
/// where the string alone says it all): `conf` is the recorded string, `by_string` what it
/// parses to, `cfg` what the fields make of it.
pub(super) fn with_fields(
    conf: Option<&str>,
    by_string: &AllocatorConfig,
    cfg: &AllocatorConfig,
) -> (Option<String>, Option<String>) {
    let decided: Vec<(&str, Conf)> =
        KEYS.iter().filter_map(|&(k, _, f)| f.map(|f| (k, f))).filter(|(_, f)| f(cfg) != f(by_string)).collect();
    if decided.is_empty() {
        return (conf.map(str::to_string), None);
    }
    let recorded = parts(conf.unwrap_or(""));
    let named = |key: &str| recorded.iter().any(|p| key_of(p) == key);
    let mut shown: Vec<String> =
        recorded.iter().filter(|p| !decided.iter().any(|(k, _)| key_of(p) == *k)).map(|p| p.to_string()).collect();
    shown.extend(decided.iter().filter_map(|(k, f)| f(cfg).map(|v| format!("{k}:{v}"))));
    let list = |keys: Vec<&str>| keys.join(", ");
    let over = list(decided.iter().map(|(k, _)| *k).filter(|k| named(k)).collect());
    let added = list(decided.iter().map(|(k, _)| *k).filter(|k| !named(k)).collect());
    let note = match conf {
        None => format!(
            "{added} from the snapshot's allocator_settings fields (it recorded no PYTORCH_CUDA_ALLOC_CONF string)"
        ),
        Some(s) => {
            let mut said = Vec::new();
            if !over.is_empty() {
                said.push(format!(
                    "{over} from the snapshot's allocator_settings fields, not its PYTORCH_CUDA_ALLOC_CONF string \
                     \"{s}\""
                ));
            }
            if !added.is_empty() && !over.is_empty() {
                said.push(format!("{added} from the fields too, which the string does not name"));
            } else if !added.is_empty() {
                said.push(format!(
                    "{added} from the snapshot's allocator_settings fields, which its PYTORCH_CUDA_ALLOC_CONF string \
                     \"{s}\" does not name"
                ));
            }
            said.join("; ")
        }
    };
    (Some(shown.join(",")), Some(note))
}
