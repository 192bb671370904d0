//! A program's own memory fraction (`set_per_process_memory_fraction`): the need is what the
//! run reserves over the fraction (the device total whose share holds the whole run), and every
//! command's verdict agrees with the replay at the budget beside it.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::support::{json, memsim, no_huge_numbers};

const MIB: u64 = 1 << 20;

/// A real run's records: a 1 MiB tensor (a 2 MiB small segment), a 2 MiB one (a 20 MiB large
/// segment), the first freed, then 512 KiB in the cached small segment: 22 MiB reserved.
const RUN: &str = r#"{"kind":"header","format_version":1,"producer":{"name":"probe","version":"1"},"level":"allocator","caching_disabled":false,"devices":[{"index":0}],"synthetic_addresses":false}
{"ts_ns":0,"device":0,"kind":"control","op":"set_memory_fraction","fraction":FRACTION}
{"ts_ns":1,"device":0,"kind":"alloc","addr":4096,"size":1048576,"stream":0,"mem":"device","api":"allocator","result":0,"origin":"request"}
{"ts_ns":2,"device":0,"kind":"alloc","addr":1052672,"size":2097152,"stream":0,"mem":"device","api":"allocator","result":0,"origin":"request"}
{"ts_ns":3,"device":0,"kind":"free","addr":4096,"stream":0,"mem":"device","api":"allocator","result":0,"origin":"request","stage":"immediate"}
{"ts_ns":4,"device":0,"kind":"alloc","addr":8192000,"size":524288,"stream":0,"mem":"device","api":"allocator","result":0,"origin":"request"}
{"ts_ns":5,"kind":"process_exit","lost_events":0}
"#;

/// What the run reserves with no limit.
const RESERVED: u64 = 22 * MIB;

fn write(dir: &Path, fraction: &str) -> PathBuf {
    let p = dir.join(format!("frac-{fraction}.jsonl"));
    std::fs::write(&p, RUN.replace("FRACTION", fraction)).unwrap();
    p
}

/// The device total under which a fraction `f` lets the allocator reserve `RESERVED` (at a
/// fraction of 0 no device does: see [`need_json`]).
fn need_of(f: f64) -> u64 {
    assert!(f > 0.0);
    (RESERVED as f64 / f).ceil() as u64
}

/// [`need_of`] as the JSON says it: at a fraction of 0 no device holds the run, and the need is
/// `null` (not 2^64 - 1, past 2^53, where JavaScript and jq round it), with `need_unbounded`
/// saying why, in memest's words.
fn need_json(f: f64) -> Value {
    if f > 0.0 {
        need_of(f).into()
    } else {
        Value::Null
    }
}

/// `need_unbounded` as the JSON says it for a fraction `f`.
fn unbounded_json(f: f64) -> Value {
    if f > 0.0 {
        Value::Null
    } else {
        "memory_fraction".into()
    }
}

/// The fields these tests read, for a failure's message.
fn brief(v: &Value) -> String {
    let keys = ["oom", "peaks_of", "peak_reserved_bytes", "fraction_need_bytes", "peak_device_bytes", "verdict"];
    keys.iter().map(|k| format!("{k}={}", v[k])).collect::<Vec<_>>().join(" ")
}

/// The fraction is too small for the run on the device judged: the replay at the budget fails,
/// and the verdict said FITS beside it, on a need taken from the replay without a budget that
/// had itself stopped at the fraction (its peaks 2 MiB, or 0 B at a fraction of 0).
#[test]
fn a_fraction_too_small_for_the_run_does_not_fit_and_needs_what_it_reserves_over_the_fraction() {
    let dir = tempfile::tempdir().unwrap();
    for (fraction, flags) in [
        ("0.0004", &["--profile", "a100-40gb"][..]),
        ("0.0006", &["--capacity", "30000MiB"][..]),
        ("0", &["--capacity", "40GiB"][..]),
    ] {
        let f: f64 = fraction.parse().unwrap();
        let t = write(dir.path(), fraction);
        let t = t.to_str().unwrap();
        let case = format!("fraction {fraction} {flags:?}");

        let mut args = vec!["replay", t, "--json"];
        args.extend_from_slice(flags);
        let (code, out, err) = memsim(&args);
        let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{case}: {e}: {out}{err}"));
        let case = format!("{case}: {}", brief(&v));
        // The replay at the budget fails, and the verdict and exit status say so.
        assert_eq!(v["oom"], true, "{case}");
        assert_eq!(v["verdict"]["fits"], false, "{case}");
        assert_eq!(code, 1, "{case}: {err}");
        // The replay without a budget placed every request: its peak is what the run reserves.
        assert_eq!(v["peaks_of"], "unlimited", "{case}");
        assert_eq!(v["peak_reserved_bytes"], RESERVED, "{case}");
        assert_eq!(v["fraction_need_bytes"], need_json(f), "{case}");
        assert_eq!(v["peak_device_bytes"], need_json(f), "{case}");
        assert_eq!(v["need_unbounded"], unbounded_json(f), "{case}");
        assert_eq!(v["verdict"]["need_unbounded"], unbounded_json(f), "{case}");
        no_huge_numbers(&v, "replay");
        let need = v["verdict"]["need_bytes"].clone();
        if f > 0.0 {
            let n = need.as_u64().unwrap();
            assert!(n >= need_of(f) && n > v["verdict"]["capacity_bytes"].as_u64().unwrap(), "{case}");
        } else {
            assert_eq!((&need, &v["peak_device_safe_bytes"]), (&Value::Null, &Value::Null), "{case}");
        }

        // The text says the same: no FITS above the failure.
        args.retain(|a| *a != "--json");
        let (code, out, err) = memsim(&args);
        assert_eq!(code, 1, "{case}: {out}{err}");
        let verdict = out.lines().find(|l| l.starts_with("verdict:")).unwrap_or_else(|| panic!("{case}: {out}"));
        assert!(verdict.ends_with("DOES NOT FIT"), "{case}: {out}");
        assert!(out.contains("replayed at the budget, it fails at record"), "{case}: {out}");
        assert!(out.contains("peak reserved       22.00 MiB"), "{case}: {out}");
        if f > 0.0 {
            assert!(verdict.contains(&simulator::units::mib(need_of(f))), "{case}: {out}");
        } else {
            assert!(verdict.contains(simulator::units::UNBOUNDED), "{case}: {out}");
        }

        // colocate judges the job alone as replay does: its need beside it.
        let mut args = vec!["colocate", t, "--json"];
        args.extend_from_slice(flags);
        let (code, out, err) = memsim(&args);
        let c: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{case}: {e}: {out}{err}"));
        assert_eq!(
            (code, &c["verdict"]["fits"], &c["jobs"][0]["fits_alone"]),
            (1, &false.into(), &false.into()),
            "{case}"
        );
        assert_eq!(c["verdict"]["need_bytes"], need, "{case}: {}", brief(&c["jobs"][0]));
        assert_eq!(c["jobs"][0]["device_peak_bytes"], need_json(f), "{case}: {}", brief(&c["jobs"][0]));
        for u in [&c["need_unbounded"], &c["verdict"]["need_unbounded"], &c["jobs"][0]["need_unbounded"]] {
            assert_eq!(u, &unbounded_json(f), "{case}: {c}");
        }
        no_huge_numbers(&c, "colocate");
    }
}

/// On a device large enough for the fraction's share to hold the run, the replay at the budget
/// survives and the need is the same share of it: FITS, in every command.
#[test]
fn a_fraction_whose_share_holds_the_run_fits_with_the_same_need() {
    let dir = tempfile::tempdir().unwrap();
    let t = write(dir.path(), "0.0006");
    let t = t.to_str().unwrap();
    let v = json(&["replay", t, "--capacity", "40000MiB", "--json"]);
    assert_eq!((&v["oom"], &v["verdict"]["fits"]), (&false.into(), &true.into()), "{}", brief(&v));
    assert_eq!(v["peak_device_bytes"], need_of(0.0006), "{}", brief(&v));
    assert_eq!(v["verdict"]["need_bytes"], need_of(0.0006), "{}", brief(&v));
    let c = json(&["colocate", t, "--capacity", "40000MiB", "--json"]);
    assert_eq!(
        (&c["verdict"]["fits"], &c["verdict"]["need_bytes"]),
        (&true.into(), &need_of(0.0006).into()),
        "{}",
        c["verdict"]
    );
}

/// Two jobs capped at half the device, each reserving 22 MiB, fit 60 MiB together (30 MiB each).
/// Without timestamps colocate summed the device totals their fractions ask for (44 MiB each):
/// "DOES NOT FIT, combined need 88 MiB", beside 44 MiB for the same jobs with timestamps, and
/// each job's line gave a device peak its parts did not add up to, without saying why.
#[test]
fn colocated_fractions_are_a_floor_under_what_the_jobs_hold_not_summed() {
    let dir = tempfile::tempdir().unwrap();
    let timed = write(dir.path(), "0.5");
    let untimed = dir.path().join("untimed.jsonl");
    let text = std::fs::read_to_string(&timed).unwrap();
    std::fs::write(&untimed, text.lines().map(|l| l.replace(r#""ts_ns":"#, r#""ts":"#) + "\n").collect::<String>())
        .unwrap();
    for (t, mode) in [(&untimed, "sum-of-peaks"), (&timed, "timestamps")] {
        let t = t.to_str().unwrap();
        let c = json(&["colocate", t, t, "--capacity", "60MiB", "--point", "--json"]);
        assert_eq!(c["mode"], mode);
        assert_eq!((&c["verdict"]["fits"], &c["combined_need_bytes"]), (&true.into(), &(44 * MIB).into()), "{mode}");
        assert_eq!(c["jobs"][0]["fraction_need_bytes"], 44 * MIB, "{mode}");
        let (code, out, err) = memsim(&["colocate", t, t, "--capacity", "60MiB", "--point"]);
        assert_eq!(code, 0, "{mode}: {out}{err}");
        assert!(out.contains("needs 44.00 MiB of 60.00 MiB (--capacity): FITS"), "{mode}: {out}");
        assert!(
            out.contains(
                "device peak    44.00 MiB (the device total its memory fraction asks for; it holds reserved 22.00 \
                 MiB + outside the allocator 0.00 MiB)"
            ),
            "{mode}: {out}"
        );
    }
    // A fraction too small for either: the device it asks for, once, and said so.
    let small = write(dir.path(), "0.0006");
    let small = small.to_str().unwrap();
    let (code, out, _) = memsim(&["colocate", small, small, "--capacity", "60MiB", "--align", "sum", "--point"]);
    assert_eq!(code, 1, "{out}");
    let need = simulator::units::mib(need_of(0.0006));
    assert!(
        out.contains(&format!("combined need        {need} (the device total {small}'s memory fraction asks for")),
        "{out}"
    );
    assert!(out.contains(&format!("smallest capacity    {need}\n")), "{out}");
}

/// The run reserves 100 MiB and frees them, then lowers its fraction to 0.01, then asks for
/// `MIB` MiB.
fn lowered(dir: &Path, mib: u64) -> PathBuf {
    let header = RUN.lines().next().unwrap();
    let p = dir.join(format!("lowered-{mib}.jsonl"));
    let body = format!(
        r#"{header}
{{"ts_ns":1,"device":0,"kind":"alloc","addr":4096,"size":104857600,"stream":0,"mem":"device","api":"allocator","result":0,"origin":"request"}}
{{"ts_ns":2,"device":0,"kind":"free","addr":4096,"stream":0,"mem":"device","api":"allocator","result":0,"origin":"request","stage":"immediate"}}
{{"ts_ns":3,"device":0,"kind":"control","op":"set_memory_fraction","fraction":0.01}}
{{"ts_ns":4,"device":0,"kind":"alloc","addr":4096,"size":{},"stream":0,"mem":"device","api":"allocator","result":0,"origin":"request"}}
{{"ts_ns":99,"kind":"process_exit","lost_events":0}}
"#,
        mib * MIB
    );
    std::fs::write(&p, body).unwrap();
    p
}

/// PyTorch checks a fraction only when its allocator reserves: 10 MiB served from the 100 MiB
/// cached before the fraction was lowered to 0.01 are never refused. The need counted the cached
/// 100 MiB over 0.01 (10000 MiB): DOES NOT FIT, exit 1, beside a replay at the budget that
/// survived. 200 MiB, which the cache cannot serve, reserve under the fraction: 300 MiB over
/// 0.01 on the replay without a budget; on 20000 MiB the limit frees the cache and they fit.
#[test]
fn a_request_served_from_the_cache_asks_nothing_of_a_lowered_fraction() {
    let dir = tempfile::tempdir().unwrap();
    let cached = lowered(dir.path(), 10);
    let v = json(&["replay", cached.to_str().unwrap(), "--capacity", "1000MiB", "--json"]);
    assert_eq!((&v["oom"], &v["peaks_of"], &v["verdict"]["fits"]), (&false.into(), &"budget".into(), &true.into()));
    assert_eq!(
        (&v["fraction_need_bytes"], &v["verdict"]["need_bytes"]),
        (&0.into(), &(100 * MIB).into()),
        "{}",
        brief(&v)
    );
    let c = json(&["colocate", cached.to_str().unwrap(), "--capacity", "1000MiB", "--json"]);
    assert_eq!((&c["verdict"]["fits"], &c["combined_need_bytes"]), (&true.into(), &(100 * MIB).into()));

    let uncached = lowered(dir.path(), 200);
    let t = uncached.to_str().unwrap();
    for (capacity, fits, need) in
        [("1000MiB", false, 30_000 * MIB), ("19999MiB", false, 30_000 * MIB), ("20000MiB", true, 20_000 * MIB)]
    {
        let (code, out, err) = memsim(&["replay", t, "--capacity", capacity, "--json"]);
        let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{capacity}: {e}: {out}{err}"));
        let case = format!("{capacity}: {}", brief(&v));
        assert_eq!((&v["oom"], &v["verdict"]["fits"]), (&(!fits).into(), &fits.into()), "{case}");
        assert_eq!((code, &v["verdict"]["need_bytes"]), (if fits { 0 } else { 1 }, &need.into()), "{case}");
    }
}

/// The page's table wrote a need no device holds as 2^64 B in MiB: "17592186044416.0 MiB" in its
/// point cell, beside "more than any device holds" in its need cell; `--json` wrote both numbers.
#[test]
fn the_page_says_a_fraction_of_0_needs_more_than_any_device_holds() {
    let dir = tempfile::tempdir().unwrap();
    let t = write(dir.path(), "0");
    let page = dir.path().join("page.html");
    let (t, p) = (t.to_str().unwrap(), page.to_str().unwrap());
    let (code, out, err) = memsim(&["report", t, "--html", p, "--profile", "a100-40gb", "--json"]);
    assert_eq!(code, 0, "{out}{err}");
    let html = std::fs::read_to_string(&page).unwrap();
    let row = html.split("<h2>The verdict per GPU profile</h2>").nth(1).unwrap_or_else(|| panic!("{html}"));
    let unbounded = format!(r#"<td class="n">{}</td>"#, simulator::units::UNBOUNDED);
    assert_eq!(row.matches(&unbounded).count(), 2, "the need and the point: {row}");
    assert!(!html.contains("17592186044416"), "{row}");
    let v: Value = serde_json::from_str(&out).unwrap();
    let verdict = &v["verdicts"][0];
    assert_eq!(
        (&verdict["need_mib"], &verdict["point_mib"], &verdict["need_unbounded"], &verdict["reserved_mib"]),
        (&Value::Null, &Value::Null, &"memory_fraction".into(), &22.0.into()),
        "{verdict}"
    );
}
