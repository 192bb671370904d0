//! `memest render` words only a verdict its numbers agree with: on the safe number, the need is
//! the headline's `safe_mib`, and that is never below its point.

use crate::cli::inputs;
use crate::support::memest_code;

/// An estimate of the shared inputs as `--json` writes it, and where a test writes its edits.
fn estimate_of(dir: &std::path::Path) -> (serde_json::Value, std::path::PathBuf) {
    let (t, _, f) = inputs(dir);
    let json = memest_code(&["estimate", "--trace", &t, "--features", &f, "--json"]).1;
    (serde_json::from_str(&json).unwrap(), dir.join("est.json"))
}

#[test]
fn a_safe_number_not_the_need_or_below_the_point_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (v, est) = estimate_of(dir.path());
    assert_eq!(v["verdict"]["basis"], "estimates.symbolic.safe_mib", "the safe number is the basis");
    let point = v["estimates"]["symbolic"]["device_mib"].as_f64().unwrap();
    let render = |value: &serde_json::Value| {
        std::fs::write(&est, value.to_string()).unwrap();
        memest_code(&["render", est.to_str().unwrap()])
    };
    assert_eq!(render(&v).0, 0, "the estimate as written is worded");
    // A safe number below the point, the need left as it was: worded as though it held.
    let mut below = v.clone();
    below["estimates"]["symbolic"]["safe_mib"] = serde_json::json!(point - 100.0);
    let (code, _, err) = render(&below);
    assert!(
        code == 2
            && err.contains("field `verdict.need_mib` is")
            && err.contains("but the basis, `estimates.symbolic.safe_mib`, is"),
        "{code} {err}"
    );
    // The need set to it too (and the verdict's point to match): the safe number is below the point.
    below["verdict"]["need_mib"] = serde_json::json!(point - 100.0);
    let (code, _, err) = render(&below);
    assert!(
        code == 2
            && err.contains(&format!(
                "field `estimates.symbolic.safe_mib` is {:.1}, below `estimates.symbolic.device_mib`",
                point - 100.0
            )),
        "{code} {err}"
    );
    // The safe number the basis names, gone.
    let mut gone = v.clone();
    gone["estimates"]["symbolic"]["safe_mib"] = serde_json::Value::Null;
    let (code, _, err) = render(&gone);
    assert!(code == 2 && err.contains("field `estimates.symbolic.safe_mib` is missing or null"), "{code} {err}");
}

/// Numbers the writer derives from others are checked by its rules: the memory outside the
/// allocator is its terms' sum, no step's peak is above the headline's, and the safe number is
/// the point plus the margin's fraction of its scale (each was worded beside what it contradicts).
#[test]
fn parts_that_contradict_their_whole_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (v, est) = estimate_of(dir.path());
    let point = v["estimates"]["symbolic"]["device_mib"].as_f64().unwrap();
    let check = |edit: &dyn Fn(&mut serde_json::Value), expect: Option<&str>| {
        let mut e = v.clone();
        edit(&mut e);
        std::fs::write(&est, e.to_string()).unwrap();
        let (code, _, err) = memest_code(&["render", est.to_str().unwrap()]);
        match expect {
            None => assert_eq!(code, 0, "{err}"),
            Some(field) => assert!(code == 2 && err.contains("est.json: field") && err.contains(field), "{code} {err}"),
        }
    };
    check(&|_| {}, None);
    check(
        &|e| e["outside_allocator"]["total_mib"] = 99.0.into(),
        Some("`outside_allocator.total_mib` is 99.0 but its terms"),
    );
    let fraction = v["margin"]["fraction"].as_f64().unwrap();
    check(&|e| e["margin"]["fraction"] = (fraction + 0.5).into(), Some("`estimates.symbolic.safe_mib` is"));
    check(&|e| e["margin"]["fraction"] = (-0.5).into(), Some("`margin.fraction` is -0.5"));
    let steps = |steady: f64| {
        serde_json::json!({"count": 2, "first_step_device_mib": point, "first_step_reserved_mib": 1.0,
            "steady_device_mib": steady, "steady_reserved_mib": 1.0})
    };
    check(&|e| e["estimates"]["symbolic"]["steps"] = steps(point), None);
    check(
        &|e| e["estimates"]["symbolic"]["steps"] = steps(99999.0),
        Some("`estimates.symbolic.steps.steady_device_mib` is 99999.0, above"),
    );
}

/// A verdict's allocator budget is the capacity less the memory outside the allocator: an
/// edited one was worded as the budget replayed at.
#[test]
fn an_allocator_budget_that_is_not_capacity_less_outside_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (v, est) = estimate_of(dir.path());
    let budget = v["verdict"]["allocator_budget_mib"].as_f64().unwrap();
    // (the budget written, refused)
    for (b, refused) in [(budget, false), (budget + 0.04, false), (99999.0, true), (budget - 1.0, true), (-1.0, true)] {
        let mut edited = v.clone();
        edited["verdict"]["allocator_budget_mib"] = serde_json::json!(b);
        std::fs::write(&est, edited.to_string()).unwrap();
        let (code, _, err) = memest_code(&["render", est.to_str().unwrap()]);
        if refused {
            assert!(code == 2 && err.contains("field `verdict.allocator_budget_mib` is"), "{b}: {code} {err}");
            assert!(err.contains("less the memory outside the allocator"), "{b}: {err}");
        } else {
            assert_eq!(code, 0, "{b}: {err}");
        }
    }
}

/// `memest estimate --json` of a trace whose recorded outside-the-allocator memory passes 2^64
/// B (the all-kinds fixture) was refused by `render`: the budget check took `total_mib` less
/// `recorded_mib`, both saturated, for 0.
#[test]
fn an_estimate_with_a_saturated_recorded_outside_renders() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/trace-v1/all-kinds.mtrace");
    let (code, out, err) = memest_code(&["estimate", "--trace", fixture, "--json"]);
    assert_eq!(code, 1, "{err}"); // no device holds an unbounded need
    let est = dir.path().join("e.json");
    std::fs::write(&est, out).unwrap();
    let (code, _, err) = memest_code(&["render", est.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
}
