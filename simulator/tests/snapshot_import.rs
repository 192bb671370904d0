//! Import of every shared real snapshot: action counts equal the data README's table, and the
//! imported trace carries every entry, the final segments and the allocator settings.

use std::collections::BTreeMap;

use simulator::snapshot::{self, Action};
use trace::{Event, FreeStage, Origin, StateAt, VmmOp};

use crate::snapshot_support::{plain, shared_snapshot, SHARED_FILES};

/// Per-file action counts, copied from /work/shared/data/snapshots/README.md.
fn readme_counts(file: &str) -> Option<&'static str> {
    Some(match file {
        "Charran78--DocuBox--dump_snapshot.pickle" => "",
        "Constructor-Sun--code_location--memory_snapshot.pickle" => {
            "segment_map 293, alloc 3025, free_requested 2299, free_completed 2299, segment_unmap 6, oom 1"
        }
        "JasperSolt--EoR_NN--snapshot.pickle" => {
            "alloc 1935, segment_alloc 7, free_requested 1926, free_completed 1926, snapshot 9"
        }
        "MAGMA27--assignment2-systems--memory_snapshot.pickle" => {
            "alloc 1721, free_requested 1721, free_completed 1721"
        }
        "Maphsge4--select_n--snapshot.pickle" => {
            "alloc 3058, free_requested 3053, free_completed 3053, segment_alloc 584, segment_free 579"
        }
        "Wedsonlin--assignment2-systems--results_medium_128_inference_memory_snapshot.pickle" => {
            "alloc 1280, free_requested 1280, free_completed 1280"
        }
        "Wedsonlin--assignment2-systems--results_medium_512_training_memory_snapshot.pickle" => {
            "alloc 7591, free_requested 7370, free_completed 7370, segment_alloc 1"
        }
        "albi2--thesis-text-to-SQL--dump_snapshot.pickle" => "",
        "bcrafton--assignment2-systems--memory_snapshot.pickle" => {
            "alloc 2162, free_requested 2162, free_completed 2162"
        }
        "cranberrii--ftcourse--memory_snapshot.pickle" => {
            "alloc 3505, free_requested 3325, free_completed 3325, segment_alloc 152"
        }
        "kkaitlyn111--cs336-a2-systems--memory_2.7b_forward.pickle" => {
            "segment_free 742, alloc 3020, free_requested 2377, free_completed 2377, segment_alloc 178"
        }
        "kkaitlyn111--cs336-a2-systems--memory_ctx128_fullstep.pickle" => {
            "alloc 6770, free_requested 5894, free_completed 5894, segment_alloc 494"
        }
        "kkaitlyn111--cs336-a2-systems--memory_ctx256_forward.pickle" => {
            "segment_free 884, alloc 1301, free_requested 657, free_completed 657, segment_alloc 390"
        }
        "kkaitlyn111--cs336-a2-systems--memory_files_memory_ctx128_fullstep_.pickle" => {
            "segment_free 430, segment_alloc 782, alloc 6770, free_requested 5894, free_completed 5894"
        }
        "kkaitlyn111--cs336-a2-systems--memory_small_forward.pickle" => {
            "alloc 2998, free_requested 2753, free_completed 2753, segment_alloc 3"
        }
        "Muduard--LayoutEditing--memory_snapshot.pkl" => "",
        _ => return None,
    })
}

fn parse_counts(text: &str) -> BTreeMap<String, usize> {
    text.split(", ")
        .filter(|s| !s.is_empty())
        .map(|s| {
            let (k, v) = s.rsplit_once(' ').expect("README count is 'action N'");
            (k.to_string(), v.parse().expect("README count is a number"))
        })
        .collect()
}

#[test]
fn every_shared_snapshot_has_the_readme_action_counts() {
    assert_eq!(SHARED_FILES.len(), 16);
    for file in SHARED_FILES {
        let snap = shared_snapshot(file);
        let got: BTreeMap<String, usize> = snap
            .action_counts()
            .into_iter()
            .filter(|(_, n)| *n > 0)
            .map(|(a, n)| (a.as_str().to_string(), n))
            .collect();
        let expect = parse_counts(readme_counts(file).expect("file listed in the README"));
        assert_eq!(got, expect, "{file}");
        assert_eq!(snap.list_form, file.starts_with("Muduard"), "{file}");
    }
}

/// Counts imported records per trace-level kind and compares with the snapshot's actions.
fn check_import(file: &str) {
    let snap = shared_snapshot(file);
    let imp = snapshot::import(&snap, &plain());
    let counts: BTreeMap<Action, usize> = snap.action_counts().into_iter().collect();
    let mut got: BTreeMap<Action, usize> = BTreeMap::new();
    let (mut end_states, mut start_states, mut stacks, mut exits) = (0, 0, 0, 0);
    for r in &imp.records {
        let a = match &r.event {
            Event::Alloc(a) if a.origin == Origin::Request => Some(Action::Alloc),
            Event::Alloc(_) => Some(Action::SegmentAlloc),
            Event::Free(f) if f.origin == Origin::Outcome => Some(Action::SegmentFree),
            Event::Free(f) if f.stage == FreeStage::Requested => Some(Action::FreeRequested),
            Event::Free(f) if f.stage == FreeStage::Completed => Some(Action::FreeCompleted),
            Event::Vmm(v) if v.op == VmmOp::Map => Some(Action::SegmentMap),
            Event::Vmm(v) if v.op == VmmOp::Unmap => Some(Action::SegmentUnmap),
            Event::Oom(_) => Some(Action::Oom),
            Event::SnapshotPoint(_) => Some(Action::Snapshot),
            Event::SegmentState(s) if s.at == StateAt::End => {
                end_states += 1;
                None
            }
            Event::SegmentState(_) => {
                start_states += 1;
                None
            }
            Event::Stack(_) => {
                stacks += 1;
                None
            }
            Event::ProcessExit(_) => {
                exits += 1;
                None
            }
            other => panic!("{file}: unexpected imported event {other:?}"),
        };
        if let Some(a) = a {
            *got.entry(a).or_default() += 1;
        }
    }
    let expect: BTreeMap<Action, usize> = counts.into_iter().filter(|(_, n)| *n > 0).collect();
    assert_eq!(got, expect, "{file}");
    assert_eq!(end_states, snap.segments.len(), "{file}: one End state per final segment");
    // The end, so that a copy cut at a record is told from the whole.
    assert_eq!(exits, 1, "{file}");
    assert!(matches!(imp.records.last().map(|r| &r.event), Some(Event::ProcessExit(_))), "{file}: last");
    assert_eq!(imp.header.meta(&trace::metadata::ENDS_WITH_EXIT), Some("true"), "{file}");
    assert_eq!(start_states, imp.start.segments.len(), "{file}");
    assert!(stacks <= snap.stacks.len(), "{file}");
    assert_eq!(imp.header.allocator_settings.is_some(), snap.allocator_settings.is_some(), "{file}");
    assert_eq!(imp.header.producer.name, snapshot::PRODUCER);
}

#[test]
fn import_keeps_every_entry_and_state_of_every_shared_snapshot() {
    for file in SHARED_FILES {
        check_import(file);
    }
}

#[test]
fn import_times_are_relative_and_settings_reach_the_env() {
    let snap = shared_snapshot("Constructor-Sun--code_location--memory_snapshot.pickle");
    let imp = snapshot::import(&snap, &plain());
    let t0 = snap.device_traces.iter().flatten().filter_map(|e| e.time_us).min().expect("has times");
    assert_eq!(imp.header.start_wall_ns, Some(t0 * 1000));
    assert_eq!(imp.header.alloc_conf(), Some("expandable_segments:True"));
    let ts: Vec<u64> =
        imp.records.iter().filter(|r| !matches!(r.event, Event::Stack(_))).filter_map(|r| r.ts_ns).collect();
    assert!(ts.windows(2).all(|w| w[0] <= w[1]), "merged devices are in time order");
    let devices: std::collections::BTreeSet<u32> = imp.records.iter().filter_map(|r| r.device).collect();
    assert_eq!(devices.into_iter().collect::<Vec<_>>(), vec![0, 1, 2]);
    assert_eq!(imp.header.devices.len(), 4, "four device trace lists, the last empty");
    let oom = imp.records.iter().find_map(|r| match &r.event {
        Event::Oom(o) => Some((r.device, o.size, o.device_free)),
        _ => None,
    });
    assert_eq!(oom, Some((Some(1), 5_308_694_528, Some(95_682_560))));
}

#[test]
fn frames_shared_through_the_memo_are_interned_once() {
    let snap = shared_snapshot("JasperSolt--EoR_NN--snapshot.pickle");
    let refs: usize = snap.device_traces.iter().flatten().filter(|e| e.frames.is_some()).count();
    assert!(refs >= 5_000, "trace entries carry frames: {refs}");
    assert!(snap.stacks.len() < refs, "{} stacks for {refs} references", snap.stacks.len());
    let first = &snap.device_traces[0][0];
    let frames = &snap.stacks[first.frames.expect("first entry has frames") as usize];
    assert_eq!(frames.len(), 50);
}

/// The CUDA libraries a recorded run loaded, as its C++ frames name them: a transformer's GEMMs
/// (cuBLAS), a CNN's convolutions and batch norms (cuDNN). A run that recorded no C++ frame
/// cannot tell, and its header stays silent (memsim warns and counts the context only).
#[test]
fn import_reads_the_libraries_off_the_cpp_frames() {
    let check = |file: &str, expect: Option<(&str, &str)>| {
        let imp = snapshot::import(&shared_snapshot(file), &plain());
        let got = (imp.header.meta(&trace::metadata::USES_GEMM), imp.header.meta(&trace::metadata::USES_CONV));
        let got = match got {
            (Some(g), Some(c)) => Some((g, c)),
            (None, None) => None,
            other => panic!("{file}: one library key without the other: {other:?}"),
        };
        assert_eq!(got, expect, "{file}");
    };
    check("kkaitlyn111--cs336-a2-systems--memory_ctx128_fullstep.pickle", Some(("true", "false")));
    check("JasperSolt--EoR_NN--snapshot.pickle", Some(("true", "true")));
    check("MAGMA27--assignment2-systems--memory_snapshot.pickle", None);
}
