use simulator::snapshot::{self, ValidateOptions};
use crate::snapshot_support::shared_snapshot;
#[test]
fn probe() {
    let snap = shared_snapshot("Constructor-Sun--code_location--memory_snapshot.pickle");
    for cap in [79u64 << 30, 76 << 30] {
        let r = snapshot::validate(&snap, &ValidateOptions { capacity: Some(cap), ..Default::default() }).unwrap();
        for d in &r.devices {
            println!("cap {cap} dev {} {:?} before {:?} ooms {} first {:?}", d.device, d.counts, d.before_first_unmap, d.recorded_ooms, d.first_mismatches.first());
        }
    }
}
