//! The hand-written frame encoders (`trace/src/fastframe.rs`: launch, alloc, free) write exactly
//! the bytes of the generic bincode path, frame by frame, whatever the prefix state; and
//! `BinaryWriter::write_launch` writes what `write` does.

use proptest::collection::vec;
use proptest::prelude::*;
use trace::codec::{self, PrefixState};
use trace::*;

use crate::strategies::{header, record};

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn fast_frames_equal_the_generic_encoding(recs in vec(record(), 1..24)) {
        let (mut fast_state, mut generic_state) = (PrefixState::default(), PrefixState::default());
        let (mut fast, mut generic) = (Vec::new(), Vec::new());
        for r in &recs {
            codec::encode_frame(&mut fast_state, r, &mut fast).unwrap();
            codec::encode_frame_generic(&mut generic_state, r, &mut generic).unwrap();
            prop_assert_eq!(&fast, &generic, "after {:?}", r);
            prop_assert_eq!(&fast_state, &generic_state);
        }
    }

    #[test]
    fn write_launch_writes_what_write_does(h in header(), recs in vec(record(), 1..24)) {
        let (mut a, mut b) = (Vec::new(), Vec::new());
        let mut wa = BinaryWriter::new(&mut a, &h).unwrap();
        let mut wb = BinaryWriter::new(&mut b, &h).unwrap();
        for r in &recs {
            wa.write(r).unwrap();
            match &r.event {
                Event::KernelLaunch(l) => wb.write_launch(r.ts_ns, r.tid, r.device, l).unwrap(),
                _ => wb.write(r).unwrap(),
            }
        }
        wa.finish().unwrap();
        wb.finish().unwrap();
        prop_assert_eq!(a, b);
    }
}
