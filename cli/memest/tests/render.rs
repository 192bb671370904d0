//! `memest render` words only a verdict its numbers agree with: on the safe number, the need is
//! the headline's `safe_mib`, and that is never below its point.

use crate::cli::inputs;
use crate::support::memest_code;

#[test]
fn a_safe_number_not_the_need_or_below_the_point_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (t, _, f) = inputs(dir.path());
    let json = memest_code(&["estimate", "--trace", &t, "--features", &f, "--json"]).1;
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["verdict"]["basis"], "estimates.symbolic.safe_mib", "the safe number is the basis");
    let point = v["estimates"]["symbolic"]["device_mib"].as_f64().unwrap();
    let est = dir.path().join("est.json");
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
