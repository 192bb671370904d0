//! The streaming unpickler: opcodes on hand-assembled bytes, memo sharing, errors that name the
//! offset and opcode, and agreement with serde-pickle on real snapshots and random values.

use proptest::prelude::*;
use serde_json::{json, Value};

use simulator::snapshot::pickle::{self, PickleValue};

use crate::snapshot_support::shared_path;

fn check(bytes: &[u8], expect: Value) {
    let p = pickle::decode(bytes).unwrap_or_else(|e| panic!("{bytes:?}: {e}"));
    assert_eq!(p.to_json(p.root()), Some(expect), "{bytes:?}");
}

fn check_err(bytes: &[u8], offset: u64, opcode: &str, message: &str) {
    let e = pickle::decode(bytes).expect_err("must fail");
    assert_eq!((e.offset, e.opcode.as_str()), (offset, opcode), "{e}");
    assert!(e.message.contains(message), "{e}");
}

#[test]
fn opcodes_python_emits_for_plain_data() {
    // Protocol 2 with BINPUT memo and a tuple.
    check(b"\x80\x02K\x05.", json!(5));
    check(
        b"\x80\x02}q\x00(X\x01\x00\x00\x00aq\x01K\x01X\x01\x00\x00\x00bq\x02J\xff\xff\xff\xffu.",
        json!({"a": 1, "b": -1}),
    );
    check(b"\x80\x02]q\x00(K\x01M\x00\x01\x88\x89Ne.", json!([1, 256, true, false, null]));
    check(b"\x80\x02K\x01K\x02\x86q\x00.", json!([1, 2]));
    // Protocol 4: FRAME, SHORT_BINUNICODE, MEMOIZE, LONG1, BINFLOAT, BINGET sharing.
    check(b"\x80\x04\x95\x10\x00\x00\x00\x00\x00\x00\x00\x8c\x01x\x94h\x00\x86\x94.", json!(["x", "x"]));
    check(b"\x80\x04\x8a\x06\x00\x00\x00\x00\x00\x01.", json!(1u64 << 40));
    check(b"\x80\x04\x8a\x01\xff.", json!(-1));
    check(b"\x80\x04\x8a\x09\xff\xff\xff\xff\xff\xff\xff\xff\x00.", json!(u64::MAX));
    check(b"\x80\x04G?\xf8\x00\x00\x00\x00\x00\x00.", json!(1.5));
    check(b"\x80\x04)\x85\x94.", json!([[]]));
    // Protocol 5 and the mark-based list/dict forms.
    check(b"\x80\x05(K\x01K\x02l.", json!([1, 2]));
    check(b"\x80\x05(\x8c\x01kK\x07d.", json!({"k": 7}));
}

#[test]
fn memo_references_share_one_object() {
    // [f, f] where f is a memoized list: both elements are the same arena value.
    let p = pickle::decode(b"\x80\x04]\x94(]\x94K\x01ah\x01e.").expect("decodes");
    let PickleValue::List(items) = p.get(p.root()) else { panic!("root is a list") };
    assert_eq!(items.len(), 2);
    assert_eq!(items[0], items[1], "same object, not a copy");
}

#[test]
fn errors_name_offset_and_opcode() {
    check_err(b"\x80\x04\x8c\x05ab", 2, "SHORT_BINUNICODE", "truncated");
    check_err(b"\x80\x04c__main__\nX\n.", 2, "GLOBAL", "unsupported opcode");
    check_err(b"\x80\x04C\x01a.", 2, "SHORT_BINBYTES", "unsupported");
    check_err(b"\x80\x04h\x03.", 2, "BINGET", "memo index 3 was never stored");
    check_err(b"\x80\x04K\x01K\x02.", 6, "STOP", "left on the stack");
    check_err(b"\x80\x04K\x01", 4, "STOP", "file ends before STOP");
    check_err(b"\x80\x09K\x01.", 0, "PROTO", "protocol 9");
    check_err(b"\x80\x04(K\x01u.", 5, "SETITEMS", "stack empty");
    check_err(b"\x80\x04K\x01(K\x02u.", 7, "SETITEMS", "odd number of items");
    check_err(b"\x80\x04K\x01(K\x02K\x03u.", 9, "SETITEMS", "target is not a dict");
}

#[test]
fn a_bad_snapshot_field_names_file_and_field() {
    // {'segments': [{'device': 0}]}: the segment lacks segment_type.
    let bytes = b"\x80\x04}(\x8c\x08segments]}\x8c\x06deviceK\x00sau.";
    let e = simulator::snapshot::parse_snapshot(bytes, "x.pickle").expect_err("incomplete segment");
    let text = e.to_string();
    assert!(text.starts_with("x.pickle: field segments[0].segment_type: expected a str"), "{text}");
    let e = simulator::snapshot::parse_snapshot(b"\x80\x04K\x01.", "y.pickle").expect_err("not a dict");
    assert!(e.to_string().contains("y.pickle: field (top level)"), "{e}");
}

/// A list that holds itself (`a = []; a.append(a)`), or one nested 100,000 deep, in a snapshot's
/// free-form fields overflowed the stack: memsim aborted. Refused, naming the file and field.
#[test]
fn a_cyclic_or_too_deep_annotation_is_refused() {
    // {'segments': [], 'external_annotations': a} with a = [a].
    let cyclic = b"\x80\x02}q\x00(X\x08\x00\x00\x00segments]q\x01X\x14\x00\x00\x00external_annotations]q\x02h\x02au.";
    let p = pickle::decode(cyclic).expect("decodes");
    let annotations = p.dict_get(p.root(), "external_annotations").expect("present");
    assert_eq!(p.to_json(annotations), None);
    let e = simulator::snapshot::parse_snapshot(cyclic, "c.pickle").expect_err("cyclic");
    assert!(
        e.to_string().starts_with("c.pickle: field external_annotations: expected plain data nested at most 128 deep"),
        "{e}"
    );

    // {'segments': [], 'allocator_settings': [[[...]]]}, 100,000 deep.
    let mut deep = b"\x80\x02}(X\x08\x00\x00\x00segments]X\x12\x00\x00\x00allocator_settings".to_vec();
    deep.extend(std::iter::repeat_n(b'(', 100_000));
    deep.extend(std::iter::repeat_n(b'l', 100_000));
    deep.extend(b"u.");
    let e = simulator::snapshot::parse_snapshot(&deep, "d.pickle").expect_err("too deep");
    assert!(e.to_string().contains("d.pickle: field allocator_settings: expected plain data nested"), "{e}");

    // 128 deep is still read.
    let mut fine = b"\x80\x02".to_vec();
    fine.extend(std::iter::repeat_n(b'(', 128));
    fine.extend(std::iter::repeat_n(b'l', 128));
    fine.push(b'.');
    let p = pickle::decode(&fine).expect("decodes");
    assert!(p.to_json(p.root()).is_some());
}

/// Walks our value and serde-pickle's side by side. serde-pickle (with
/// `replace_recursive_structures`) writes None where it met a memo-shared object again (a dict
/// whose shared key strings were replaced collapses to one None key); those places are counted,
/// everything else must be equal.
fn agree(p: &pickle::Pickle, id: pickle::ValueId, theirs: &serde_pickle::Value, path: &str) -> Result<usize, String> {
    use serde_pickle::{HashableValue as H, Value as V};
    let ours = p.get(id);
    let mismatch = || Err(format!("{path}: ours {ours:?}, serde-pickle {theirs:?}"));
    match (ours, theirs) {
        (PickleValue::None, V::None) => Ok(0),
        (_, V::None) => Ok(1),
        (PickleValue::Bool(a), V::Bool(b)) if a == b => Ok(0),
        (PickleValue::Int(a), V::I64(b)) if *a == *b as i128 => Ok(0),
        (PickleValue::Int(a), V::Int(b)) if a.to_string() == b.to_string() => Ok(0),
        (PickleValue::Float(a), V::F64(b)) if a == b => Ok(0),
        (PickleValue::Str(a), V::String(b)) if **a == **b => Ok(0),
        (PickleValue::List(a), V::List(b)) | (PickleValue::Tuple(a), V::Tuple(b)) if a.len() == b.len() => {
            let mut n = 0;
            for (k, (x, y)) in a.iter().zip(b).enumerate() {
                n += agree(p, *x, y, &format!("{path}[{k}]"))?;
            }
            Ok(n)
        }
        // Replaced shared key strings collapse into one None key: the dict is lost.
        (PickleValue::Dict(_), V::Dict(b)) if b.contains_key(&H::None) => Ok(1),
        (PickleValue::Dict(a), V::Dict(b)) if a.len() == b.len() => {
            let mut n = 0;
            for (k, v) in a {
                let PickleValue::Str(key) = p.get(*k) else { return mismatch() };
                let Some(y) = b.get(&H::String(key.to_string())) else { return mismatch() };
                n += agree(p, *v, y, &format!("{path}.{key}"))?;
            }
            Ok(n)
        }
        _ => mismatch(),
    }
}

/// Our unpickler and serde-pickle decode small real snapshots to the same values, except where
/// serde-pickle replaced a shared object (which is why this unpickler exists).
#[test]
fn agrees_with_serde_pickle_on_real_snapshots() {
    for (file, shared) in [
        ("Muduard--LayoutEditing--memory_snapshot.pkl", true),
        ("albi2--thesis-text-to-SQL--dump_snapshot.pickle", false),
        ("Charran78--DocuBox--dump_snapshot.pickle", false),
        ("MAGMA27--assignment2-systems--memory_snapshot.pickle", true),
    ] {
        let bytes = std::fs::read(shared_path(file)).expect("readable");
        let ours = pickle::decode(&bytes).unwrap_or_else(|e| panic!("{file}: {e}"));
        let opts = serde_pickle::DeOptions::new().replace_recursive_structures();
        let theirs = serde_pickle::value_from_slice(&bytes, opts).expect("serde-pickle reads it");
        let replaced = agree(&ours, ours.root(), &theirs, file).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(replaced > 0, shared, "{file}: {replaced} values replaced by serde-pickle");
    }
}

fn value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        (-1e12f64..1e12).prop_map(Value::from),
        "[a-z_/.é]{0,12}".prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map("[a-z]{1,6}", inner, 0..6).prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    /// Whatever serde-pickle writes (protocol 3, as export does), the unpickler reads back.
    #[test]
    fn reads_what_serde_pickle_writes(v in value()) {
        let bytes = serde_pickle::to_vec(&v, serde_pickle::SerOptions::new()).expect("encodes");
        let p = pickle::decode(&bytes).expect("decodes");
        prop_assert_eq!(p.to_json(p.root()), Some(v));
    }

    /// What our writer writes (repeated strings shared through the memo), the unpickler reads
    /// back.
    #[test]
    fn reads_back_what_the_writer_writes(v in value()) {
        let p = pickle::decode(&pickle::encode(&v)).expect("decodes what it wrote");
        prop_assert_eq!(p.to_json(p.root()), Some(v));
    }
}

#[test]
fn a_missing_file_names_the_path() {
    let e = simulator::snapshot::read_snapshot(std::path::Path::new("/nonexistent/x.pickle")).expect_err("missing");
    assert!(e.to_string().starts_with("cannot read /nonexistent/x.pickle:"), "{e}");
}
