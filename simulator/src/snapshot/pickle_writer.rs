//! A protocol 3 pickle writer for plain data that shares repeated objects through the memo.
//!
//! Why not serde-pickle: it has no memo, so every block and trace entry repeats its whole frame
//! list; exported snapshots came out about 28 times larger than PyTorch's (107 MB for a 3.9 MB
//! file). This writer memoizes strings and frame lists, as Python's pickler does. It emits only
//! opcodes that both Python and MemoryViz.js's unpickler read: PROTO (3), EMPTY_DICT,
//! EMPTY_LIST, MARK, SETITEMS, APPENDS, TUPLE2, BININT1, BININT2, BININT, LONG1, BINUNICODE,
//! BINFLOAT, NONE, NEWTRUE, NEWFALSE, BINPUT, LONG_BINPUT, BINGET, LONG_BINGET and STOP. No bytes,
//! no sets.

use std::collections::HashMap;

/// `v` as a protocol 3 pickle, repeated strings shared through the memo: the inverse of
/// [`super::pickle::decode`] for plain data.
pub fn encode(v: &serde_json::Value) -> Vec<u8> {
    let mut w = PickleWriter::new();
    w.json(v);
    w.finish()
}

/// Builds one pickle in memory. Containers are written begin/end; the caller supplies items in
/// between (dict items as key, value, key, value, ...).
pub(super) struct PickleWriter {
    out: Vec<u8>,
    next_memo: u32,
    strings: HashMap<String, u32>,
}

impl PickleWriter {
    pub(super) fn new() -> Self {
        PickleWriter { out: vec![0x80, 3], next_memo: 0, strings: HashMap::new() }
    }

    pub(super) fn finish(mut self) -> Vec<u8> {
        self.out.push(b'.');
        self.out
    }

    /// Memoizes the object on top of the stack; returns its memo index.
    pub(super) fn put(&mut self) -> u32 {
        let idx = self.next_memo;
        self.next_memo += 1;
        if idx < 256 {
            self.out.extend_from_slice(&[b'q', idx as u8]);
        } else {
            self.out.push(b'r');
            self.out.extend_from_slice(&idx.to_le_bytes());
        }
        idx
    }

    /// Pushes a memoized object again.
    pub(super) fn get(&mut self, idx: u32) {
        if idx < 256 {
            self.out.extend_from_slice(&[b'h', idx as u8]);
        } else {
            self.out.push(b'j');
            self.out.extend_from_slice(&idx.to_le_bytes());
        }
    }

    pub(super) fn none(&mut self) {
        self.out.push(b'N');
    }

    pub(super) fn bool(&mut self, v: bool) {
        self.out.push(if v { 0x88 } else { 0x89 });
    }

    pub(super) fn float(&mut self, v: f64) {
        self.out.push(b'G');
        self.out.extend_from_slice(&v.to_be_bytes());
    }

    pub(super) fn int(&mut self, v: i128) {
        if (0..256).contains(&v) {
            self.out.extend_from_slice(&[b'K', v as u8]);
        } else if (0..65536).contains(&v) {
            self.out.push(b'M');
            self.out.extend_from_slice(&(v as u16).to_le_bytes());
        } else if i32::try_from(v).is_ok() {
            self.out.push(b'J');
            self.out.extend_from_slice(&(v as i32).to_le_bytes());
        } else {
            // LONG1: the shortest little-endian two's complement that keeps the sign.
            let bytes = v.to_le_bytes();
            let mut n = 16;
            while n > 1 {
                let top = bytes[n - 1];
                let next_sign = bytes[n - 2] & 0x80 != 0;
                if (top == 0 && !next_sign) || (top == 0xff && next_sign) {
                    n -= 1;
                } else {
                    break;
                }
            }
            self.out.extend_from_slice(&[0x8a, n as u8]);
            self.out.extend_from_slice(&bytes[..n]);
        }
    }

    /// Writes a str, or a memo reference to an equal one written before.
    pub(super) fn str(&mut self, s: &str) {
        if let Some(&idx) = self.strings.get(s) {
            self.get(idx);
            return;
        }
        self.out.push(b'X');
        self.out.extend_from_slice(&(s.len() as u32).to_le_bytes());
        self.out.extend_from_slice(s.as_bytes());
        let idx = self.put();
        self.strings.insert(s.to_string(), idx);
    }

    pub(super) fn dict_begin(&mut self) {
        self.out.extend_from_slice(b"}(");
    }

    pub(super) fn dict_end(&mut self) {
        self.out.push(b'u');
    }

    pub(super) fn list_begin(&mut self) {
        self.out.extend_from_slice(b"](");
    }

    pub(super) fn list_end(&mut self) {
        self.out.push(b'e');
    }

    /// A pair of ints as a tuple (`segment_pool_id`).
    pub(super) fn int_pair(&mut self, a: i64, b: i64) {
        self.int(a as i128);
        self.int(b as i128);
        self.out.push(0x86);
    }

    /// Any JSON value (allocator settings, annotations) as the equivalent Python object.
    pub(super) fn json(&mut self, v: &serde_json::Value) {
        use serde_json::Value;
        match v {
            Value::Null => self.none(),
            Value::Bool(b) => self.bool(*b),
            Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
                (Some(i), _, _) => self.int(i as i128),
                (None, Some(u), _) => self.int(u as i128),
                (None, None, Some(f)) => self.float(f),
                (None, None, None) => self.none(),
            },
            Value::String(s) => self.str(s),
            Value::Array(items) => {
                self.list_begin();
                for x in items {
                    self.json(x);
                }
                self.list_end();
            }
            Value::Object(m) => {
                self.dict_begin();
                for (k, x) in m {
                    self.str(k);
                    self.json(x);
                }
                self.dict_end();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::{encode, PickleWriter};
    use crate::snapshot::pickle;

    #[test]
    fn int_boundaries_and_shared_strings() {
        for v in [
            0i128,
            255,
            256,
            65535,
            65536,
            -1,
            i32::MIN as i128,
            i32::MAX as i128 + 1,
            i64::MIN as i128,
            u64::MAX as i128,
        ] {
            let mut w = PickleWriter::new();
            w.int(v);
            let p = pickle::decode(&w.finish()).expect("decodes");
            assert_eq!(*p.get(p.root()), pickle::PickleValue::Int(v));
        }
        let v = json!(["frames", "frames", {"frames": "frames"}]);
        let bytes = encode(&v);
        assert_eq!(bytes.windows(6).filter(|b| b == b"frames").count(), 1, "written once, then memo references");
        let p = pickle::decode(&bytes).expect("decodes what it wrote");
        assert_eq!(p.to_json(p.root()), Some(v));
    }
}
