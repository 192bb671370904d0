use std::time::Instant;
use simulator::snapshot::{self, pickle, ValidateOptions};
use crate::snapshot_support::{shared_path, SHARED_FILES};
#[test]
fn probe() {
    let (mut total, mut t_ours, mut t_parse, mut t_serde, mut t_val, mut t_imp, mut t_exp, mut out) = (0usize, 0f64, 0f64, 0f64, 0f64, 0f64, 0f64, 0usize);
    for f in SHARED_FILES {
        let bytes = std::fs::read(shared_path(f)).unwrap();
        total += bytes.len();
        let t = Instant::now(); let _p = pickle::decode(&bytes).unwrap(); t_ours += t.elapsed().as_secs_f64();
        let t = Instant::now(); let s = snapshot::parse_snapshot(&bytes, f).unwrap(); t_parse += t.elapsed().as_secs_f64();
        let t = Instant::now(); let v = serde_pickle::value_from_slice(&bytes, serde_pickle::DeOptions::new().replace_recursive_structures()).unwrap(); t_serde += t.elapsed().as_secs_f64(); drop(v);
        let t = Instant::now(); let imp = snapshot::import_snapshot(&s, None, None).unwrap(); t_imp += t.elapsed().as_secs_f64();
        let t = Instant::now(); let b = snapshot::export_snapshot(&imp.header, &imp.records).unwrap(); t_exp += t.elapsed().as_secs_f64(); out += b.len();
        let t = Instant::now(); let _r = snapshot::validate(&s, &ValidateOptions::default()).unwrap(); t_val += t.elapsed().as_secs_f64();
    }
    let mb = total as f64 / 1e6;
    println!("TOTAL {total} B -> exported {out} B: decode {t_ours:.3}s ({:.0} MB/s) parse {t_parse:.3}s ({:.0} MB/s) serde {t_serde:.3}s ({:.1} MB/s) import {t_imp:.3}s export {t_exp:.3}s validate {t_val:.3}s", mb/t_ours, mb/t_parse, mb/t_serde);
}
