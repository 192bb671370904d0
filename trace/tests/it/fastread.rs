//! The hand-written frame decoders (`trace/src/fastread.rs`: alloc, free, launch) read exactly
//! what the derived bincode decoders read: equal records and prefix states for generated
//! records, and, for arbitrary body bytes, the same value or an error where the derived decoder
//! errs (the fast path then declines and the derived decoder names the fault).

use proptest::collection::vec;
use proptest::prelude::*;
use trace::codec::{self, Decoded, PrefixState};

use crate::strategies::record;
use crate::support::binary;

/// A frame body decodes to the same value through both paths, or fails through both.
fn agree(tag: u8, bytes: &[u8]) -> Result<(), TestCaseError> {
    let fast = codec::decode_frame(&mut PrefixState::default(), tag, bytes, 0);
    let generic = codec::decode_frame_generic(&mut PrefixState::default(), tag, bytes, 0);
    match (&fast, &generic) {
        (Ok(a), Ok(b)) => prop_assert_eq!(a, b),
        (Err(_), Err(_)) => {}
        _ => prop_assert!(false, "fast {:?} but derived {:?}", fast, generic),
    }
    Ok(())
}

/// Field bytes of every varint width, and the markers bincode refuses, which random bytes rarely
/// produce.
fn varint_fields() -> impl Strategy<Value = Vec<u8>> {
    vec(
        prop_oneof![
            (0u8..251).prop_map(|b| vec![b]),
            any::<u16>().prop_map(|v| [vec![251], v.to_le_bytes().to_vec()].concat()),
            any::<u32>().prop_map(|v| [vec![252], v.to_le_bytes().to_vec()].concat()),
            any::<u64>().prop_map(|v| [vec![253], v.to_le_bytes().to_vec()].concat()),
            Just(vec![254]),
            Just(vec![1]),
            Just(vec![0]),
        ],
        0..14,
    )
    .prop_map(|f| f.concat())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn fast_decoding_equals_the_derived_decoding(recs in vec(record(), 1..24)) {
        let mut buf = Vec::new();
        let mut enc = PrefixState::default();
        for r in &recs {
            codec::encode_frame_generic(&mut enc, r, &mut buf).unwrap();
        }
        let (mut fast_state, mut generic_state) = (PrefixState::default(), PrefixState::default());
        let mut at = 0;
        for r in &recs {
            let tag = buf[at];
            let (len, n) = codec::get_uvarint(&buf[at + 1..]).unwrap();
            let body = &buf[at + 1 + n..at + 1 + n + len as usize];
            let fast = codec::decode_frame(&mut fast_state, tag, body, at as u64).unwrap();
            let generic = codec::decode_frame_generic(&mut generic_state, tag, body, at as u64).unwrap();
            prop_assert_eq!(&fast, &generic);
            prop_assert_eq!(&fast, &Decoded::Record(r.clone()));
            prop_assert_eq!(&fast_state, &generic_state);
            at += 1 + n + len as usize;
        }
    }

    #[test]
    fn fast_decoding_of_any_bytes_agrees(tag in prop::sample::select(vec![1u8, 2, 4]), body in vec(any::<u8>(), 0..64)) {
        // A prefix byte with nothing set, then the body as the hot kind's fields.
        let mut bytes = vec![0u8];
        bytes.extend_from_slice(&body);
        agree(tag, &bytes)?;
    }

    #[test]
    fn fast_decoding_of_small_varint_forms_agrees(tag in prop::sample::select(vec![1u8, 2, 4]), fields in varint_fields()) {
        let mut bytes = vec![0u8];
        bytes.extend(fields);
        agree(tag, &bytes)?;
    }

    /// Inside a trace, the fast path reads a body through a window that runs on into the next
    /// frames: a body cut short, or ended by a field that runs past it, must still decode (or
    /// fail) as the body alone does, whatever the bytes after it.
    #[test]
    fn fast_decoding_ignores_the_bytes_after_the_body(
        tag in prop::sample::select(vec![1u8, 2, 4]),
        fields in varint_fields(),
        cut in any::<prop::sample::Index>(),
        after in prop_oneof![varint_fields(), vec(any::<u8>(), 0..100)],
    ) {
        // A prefix byte with nothing set, then the fields, cut anywhere.
        let mut body = vec![0u8];
        body.extend(&fields[..cut.index(fields.len() + 1)]);
        let mut bytes = binary(&trace::Header::new("tests", "1", trace::Level::Allocator), &[]);
        let at = bytes.len() as u64;
        bytes.push(tag);
        codec::put_uvarint(&mut bytes, body.len() as u64);
        bytes.extend(&body);
        bytes.extend(&after);
        let read = trace::open_reader(&bytes[..]).expect("header").next_record().expect("one frame at least");
        let alone = codec::decode_frame_generic(&mut PrefixState::default(), tag, &body, at);
        match (read, alone) {
            (Ok(a), Ok(Decoded::Record(b))) => prop_assert_eq!(a, b),
            (Err(_), Err(_)) => {}
            (read, alone) => prop_assert!(false, "in a trace {:?}, alone {:?}", read, alone),
        }
    }
}
