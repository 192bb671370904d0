//! Rounding vectors (spec §2), divisions tables per version (§11), parse errors, snapshot settings.

use simulator::alloc::rounding::{get_allocation_size, round_size, roundup_power2_next_division};
use simulator::alloc::{AllocatorConfig, ConfigError, TorchVersion};

const MIB: u64 = 1 << 20;
const ALL_VERSIONS: [TorchVersion; 3] = [TorchVersion::V2_4, TorchVersion::V2_5, TorchVersion::V2_9];

fn check_round(request: u64, divisions: u64, rounded: u64, segment: u64) {
    let table = [divisions; 16];
    assert_eq!(round_size(request, &table), rounded, "round_size({request}) with {divisions} divisions");
    assert_eq!(get_allocation_size(rounded), segment, "get_allocation_size({rounded})");
}

#[test]
fn spec_rounding_table() {
    check_round(1, 0, 512, 2 * MIB);
    check_round(1_000, 0, 1_024, 2 * MIB);
    check_round(1_048_576, 4, 1_048_576, 2 * MIB);
    check_round(1_200_000, 0, 1_200_128, 20 * MIB);
    check_round(1_200_000, 4, 1_310_720, 20 * MIB);
    check_round(5_000_000, 8, 5_242_880, 20 * MIB);
    check_round(300_000_000, 4, 335_544_320, 335_544_320);
    check_round(33_554_433, 2, 50_331_648, 50_331_648);
}

#[test]
fn rounding_edges() {
    // Divisions apply only above 512·d; a power of two is returned unchanged.
    check_round(2_048, 4, 2_048, 2 * MIB);
    check_round(2_049, 4, 2_560, 2 * MIB);
    assert_eq!(roundup_power2_next_division(1 << 30, 8), 1 << 30);
    // 10 MiB exactly gets its own 2 MiB-rounded segment; just below gets 20 MiB.
    check_round(10 * MIB, 0, 10 * MIB, 10 * MIB);
    check_round(10 * MIB - 512, 0, 10 * MIB - 512, 20 * MIB);
    check_round(11 * MIB, 0, 11 * MIB, 12 * MIB);
    // No overflow at the top of the range.
    assert!(round_size(u64::MAX, &[0; 16]) >= u64::MAX - 511);
    assert!(get_allocation_size(u64::MAX) > 0);
}

fn check_divisions(conf: &str, version: TorchVersion, expect: [u64; 16]) {
    let cfg = AllocatorConfig::parse(conf, version).unwrap_or_else(|e| panic!("{conf} ({version}): {e}"));
    assert_eq!(cfg.roundup_power2_divisions, expect, "{conf} in {version}");
}

#[test]
fn divisions_list_worked_example() {
    let conf = "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]";
    let mut newer = [1; 16];
    newer[9] = 2;
    newer[10] = 4;
    newer[11..].fill(8);
    check_divisions(conf, TorchVersion::V2_9, newer);
    let mut older = newer;
    older[10] = 8; // `>` overwrites the last explicit interval before 2.9
    check_divisions(conf, TorchVersion::V2_4, older);
    check_divisions(conf, TorchVersion::V2_5, older);
    // The table drives rounding: 1.5 GiB + 1 rounds with 4 divisions in 2.9+, 8 before.
    let size = 1536 * MIB + 1;
    let new_cfg = AllocatorConfig::parse(conf, TorchVersion::V2_9).unwrap();
    let old_cfg = AllocatorConfig::parse(conf, TorchVersion::V2_4).unwrap();
    assert_eq!(round_size(size, &new_cfg.roundup_power2_divisions), 1792 * MIB);
    assert_eq!(round_size(size, &old_cfg.roundup_power2_divisions), 1664 * MIB);
}

#[test]
fn divisions_single_value_and_spaces() {
    for v in ALL_VERSIONS {
        check_divisions("roundup_power2_divisions:4", v, [4; 16]);
        check_divisions(" roundup_power2_divisions : [ 1:2 , >:0 ] ", v, {
            let mut t = [0; 16];
            t[0] = 2;
            if v < TorchVersion::V2_9 {
                t[0] = 0;
            }
            t
        });
    }
    // Keys above 32768 MiB clamp onto the last interval.
    check_divisions("roundup_power2_divisions:[65536:2]", TorchVersion::V2_9, [2; 16]);
}

/// Whether an error is of the kind expected.
type Kind = fn(&ConfigError) -> bool;

/// The [`Kind`] of one variant, any fields (`kind!(TooSmall)`) or some (`kind!(TooSmall { min: 20, .. })`).
macro_rules! kind {
    ($variant:ident) => {
        kind!($variant { .. })
    };
    ($variant:ident { $($fields:tt)* }) => {
        |e: &ConfigError| matches!(e, ConfigError::$variant { $($fields)* })
    };
}

fn check_err(conf: &str, version: TorchVersion, key: &str, expect: Kind) {
    match AllocatorConfig::parse(conf, version) {
        Ok(cfg) => panic!("{conf:?} ({version}) parsed to {cfg:?}, expected an error naming {key}"),
        Err(e) => {
            assert!(expect(&e), "{conf:?} ({version}): unexpected error kind {e:?}");
            assert!(e.to_string().contains(key), "{conf:?}: message {e} does not name {key}");
        }
    }
}

#[test]
fn parse_errors_name_the_key() {
    use TorchVersion::{V2_4, V2_5, V2_9};
    // (setting, the word its message names, the error's kind), the same in every release.
    let everywhere: [(&str, &str, Kind); 14] = [
        ("foo:1", "foo", kind!(UnknownKey)),
        ("expandable_segments:true", "expandable_segments", kind!(InvalidBool)),
        ("expandable_segments:1", "expandable_segments", kind!(InvalidBool)),
        ("release_lock_on_cudamalloc:yes", "release_lock_on_cudamalloc", kind!(InvalidBool)),
        ("max_split_size_mb:19", "max_split_size_mb", kind!(TooSmall)),
        ("max_split_size_mb:abc", "max_split_size_mb", kind!(InvalidNumber)),
        ("max_split_size_mb:", "max_split_size_mb", kind!(MissingValue)),
        ("roundup_power2_divisions:3", "roundup_power2_divisions", kind!(NotPowerOfTwo)),
        ("roundup_power2_divisions:[256:3]", "roundup_power2_divisions", kind!(NotPowerOfTwo)),
        ("roundup_power2_divisions:[300:2]", "roundup_power2_divisions", kind!(NotPowerOfTwo)),
        ("garbage_collection_threshold:1.0", "garbage_collection_threshold", kind!(OutOfRange)),
        ("garbage_collection_threshold:0", "garbage_collection_threshold", kind!(OutOfRange)),
        ("backend:foo", "foo", kind!(UnknownBackend)),
        ("pinned_num_register_threads:3", "pinned_num_register_threads", kind!(NotPowerOfTwo)),
    ];
    for v in ALL_VERSIONS {
        for (conf, key, expect) in everywhere {
            check_err(conf, v, key, expect);
        }
    }
    // (setting, release, the word its message names, the error's kind) where the release matters.
    let by_release: [(&str, TorchVersion, &str, Kind); 9] = [
        // 20 MiB is the boundary: rejected before 2.9 (must be > 20), accepted from 2.9 (>= 20).
        ("max_split_size_mb:20", V2_4, "max_split_size_mb", kind!(TooSmall { bound: ">", min: 20, .. })),
        ("max_split_size_mb:20", V2_5, "max_split_size_mb", kind!(TooSmall { bound: ">", .. })),
        // Keys that arrived later are unknown to older releases.
        ("max_non_split_rounding_mb:64", V2_4, "max_non_split_rounding_mb", kind!(UnknownKey)),
        ("per_process_memory_fraction:0.5", V2_5, "per_process_memory_fraction", kind!(UnknownKey)),
        ("max_non_split_rounding_mb:10", V2_9, "max_non_split_rounding_mb", kind!(TooSmall)),
        ("per_process_memory_fraction:1.5", V2_9, "per_process_memory_fraction", kind!(OutOfRange)),
        // Separators.
        ("max_split_size_mb 128", V2_9, "max_split_size_mb128", kind!(UnknownKey)),
        ("expandable_segments:True;max_split_size_mb:64", V2_9, "True;max_split_size_mb", kind!(InvalidBool)),
        ("roundup_power2_divisions:[256:2", V2_9, "]", kind!(Syntax)),
    ];
    for (conf, version, key, expect) in by_release {
        check_err(conf, version, key, expect);
    }
    assert_eq!(AllocatorConfig::parse("max_split_size_mb:20", V2_9).unwrap().max_split_size, 20 * MIB);
}

#[test]
fn parse_every_option() {
    let cfg = AllocatorConfig::parse(
        "max_split_size_mb:128,max_non_split_rounding_mb:64,garbage_collection_threshold:0.6,\
         expandable_segments:True,roundup_power2_divisions:2,backend:native,release_lock_on_cudamalloc:True,\
         pinned_use_cuda_host_register:True,pinned_num_register_threads:8,pinned_use_background_threads:True,\
         pinned_reserve_segment_size_mb:64,graph_capture_record_stream_reuse:True,per_process_memory_fraction:0.5",
        TorchVersion::V2_9,
    )
    .unwrap();
    assert_eq!(cfg.max_split_size, 128 * MIB);
    assert_eq!(cfg.max_non_split_rounding, 64 * MIB);
    assert_eq!(cfg.garbage_collection_threshold, 0.6);
    assert!(cfg.expandable_segments && cfg.release_lock_on_cudamalloc && cfg.pinned_use_cuda_host_register);
    assert!(cfg.pinned_use_background_threads && cfg.graph_capture_record_stream_reuse);
    assert_eq!(cfg.roundup_power2_divisions, [2; 16]);
    assert_eq!(cfg.pinned_num_register_threads, 8);
    assert_eq!(cfg.pinned_reserve_segment_size_mb, 64);
    assert_eq!(cfg.per_process_memory_fraction, Some(0.5));
    let empty = AllocatorConfig::parse("", TorchVersion::V2_4).unwrap();
    assert_eq!(empty, AllocatorConfig::default());
    assert_eq!(empty.max_split_size, u64::MAX);
    let async_cfg = AllocatorConfig::parse("backend:cudaMallocAsync", TorchVersion::V2_4).unwrap();
    assert_eq!(async_cfg.backend, simulator::alloc::Backend::CudaMallocAsync);
}

#[test]
fn versions_parse() {
    let check = |s: &str, v: Option<TorchVersion>| assert_eq!(s.parse::<TorchVersion>().ok(), v, "{s}");
    check("2.4", Some(TorchVersion::V2_4));
    check("2.4.1+cu121", Some(TorchVersion::V2_4));
    check("2.5", Some(TorchVersion::V2_5));
    check("2.6.0", Some(TorchVersion::V2_5));
    check("2.8.0", Some(TorchVersion::V2_5));
    check("2.9", Some(TorchVersion::V2_9));
    check("2.15", Some(TorchVersion::V2_9));
    check("3.0", Some(TorchVersion::V2_9));
    check("2.3", None);
    check("two", None);
    check("2", None);
    assert_eq!(TorchVersion::default(), TorchVersion::V2_9);
}

#[test]
fn snapshot_settings() {
    let v = serde_json::json!({
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True,max_split_size_mb:128,max_non_split_rounding_mb:40",
        "max_split_size": 134217728, "garbage_collection_threshold": 0.0, "expandable_segments": true,
        "pinned_num_register_threads": 1, "release_lock_on_cudamalloc": false,
        "pinned_use_cuda_host_register": false,
        "roundup_power2_divisions": {"1": 0, "2": 0, "4": 0, "8": 0, "16": 0, "32": 0, "64": 0, "128": 0,
            "256": 4, "512": 0, "1024": 0, "2048": 0, "4096": 0, "8192": 0, "16384": 0, "32768": 0}
    });
    let cfg = AllocatorConfig::from_snapshot_settings(&v, TorchVersion::V2_9).unwrap();
    assert!(cfg.expandable_segments);
    assert_eq!(cfg.max_split_size, 128 * MIB);
    assert_eq!(cfg.max_non_split_rounding, 40 * MIB);
    assert_eq!(cfg.roundup_power2_divisions[8], 4);
    assert_eq!(cfg.roundup_power2_divisions[7], 0);
    let unlimited = serde_json::json!({"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1});
    assert_eq!(
        AllocatorConfig::from_snapshot_settings(&unlimited, TorchVersion::V2_4).unwrap().max_split_size,
        u64::MAX
    );
    let bad = |v: serde_json::Value, field: &str| {
        let e = AllocatorConfig::from_snapshot_settings(&v, TorchVersion::V2_9).unwrap_err();
        assert!(e.to_string().contains(field), "{e} should name {field}");
    };
    bad(serde_json::json!({"expandable_segments": "yes"}), "expandable_segments");
    bad(serde_json::json!({"max_split_size": "big"}), "max_split_size");
    bad(serde_json::json!({"roundup_power2_divisions": {"3": 1}}), "roundup_power2_divisions");
    bad(serde_json::json!([1, 2]), "allocator_settings");
    bad(serde_json::json!({"PYTORCH_CUDA_ALLOC_CONF": "bogus:1"}), "bogus");
}

/// `backend:native,backend:cudaMallocAsync` was taken as the last, cudaMallocAsync. Before 2.9,
/// PyTorch picks the backend at load time from the first `backend:` and its runtime parse fails on
/// a later one that differs; the same value again is accepted.
#[test]
fn a_changed_backend_is_refused_before_2_9() {
    for v in [TorchVersion::V2_4, TorchVersion::V2_5] {
        let err = AllocatorConfig::parse("backend:native,max_split_size_mb:300,backend:cudaMallocAsync", v)
            .expect_err("a changed backend is PyTorch's error");
        assert!(
            matches!(&err, ConfigError::BackendChanged { first, then, .. } if first == "native" && then == "cudaMallocAsync"),
            "{v}: {err}"
        );
        assert!(err.to_string().contains("first"), "{err}");
        let same = AllocatorConfig::parse("backend:native,backend:native", v).unwrap();
        assert!(same.unmodelled().is_none(), "{v}");
    }
}
