//! A streaming unpickler for the subset of the pickle format that Python's pickler emits for
//! plain data (dicts, lists, tuples, str, int, float, bool, None), protocols 2 to 5.
//!
//! Why not serde-pickle: real snapshots share frame lists and strings through the pickle memo.
//! serde-pickle clones a memo entry on every reference (about 3 MB/s, see docs/validation.md) and
//! cannot tell a shared object from an equal copy. Here every object lives once in an arena and
//! a memo reference is just its [`ValueId`], so sharing survives (an interned stack per frame
//! list) and decoding is linear in the file size.

use std::fmt;

pub use super::pickle_writer::encode;

/// Index of a value in a [`Pickle`] arena. Two references to the same pickled object (through
/// the memo) have the same id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ValueId(pub u32);

/// One decoded object. Containers refer to their members by id.
#[derive(Debug, Clone, PartialEq)]
pub enum PickleValue {
    /// `None`.
    None,
    /// `True` / `False`.
    Bool(bool),
    /// An int. Pickled ints of up to 16 bytes fit.
    Int(i128),
    /// A float.
    Float(f64),
    /// A str.
    Str(Box<str>),
    /// A list.
    List(Vec<ValueId>),
    /// A tuple.
    Tuple(Vec<ValueId>),
    /// A dict, in insertion order.
    Dict(Vec<(ValueId, ValueId)>),
}

/// A decoded pickle: the arena and the top-level object.
#[derive(Debug, Clone)]
pub struct Pickle {
    values: Vec<PickleValue>,
    root: ValueId,
}

impl Pickle {
    /// The top-level object.
    pub fn root(&self) -> ValueId {
        self.root
    }

    /// The object with this id.
    pub fn get(&self, id: ValueId) -> &PickleValue {
        &self.values[id.0 as usize]
    }

    /// Number of distinct objects (shared ones count once).
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// Whether the arena is empty (never true for a decoded pickle).
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// The value under `key` when `id` is a dict with str keys.
    pub fn dict_get(&self, id: ValueId, key: &str) -> Option<ValueId> {
        match self.get(id) {
            PickleValue::Dict(items) => {
                items.iter().find(|(k, _)| matches!(self.get(*k), PickleValue::Str(s) if &**s == key)).map(|(_, v)| *v)
            }
            _ => None,
        }
    }

    /// Converts a value to JSON (for allocator settings and annotations). Dict keys that are
    /// not strings are written with their JSON text; ints beyond i64/u64 become floats. `None`
    /// when it nests deeper than [`Self::JSON_DEPTH`]: a pickle can hold a list that contains
    /// itself, and a deep one would overflow the stack here or in the value's drop.
    pub fn to_json(&self, id: ValueId) -> Option<serde_json::Value> {
        self.to_json_within(id, Self::JSON_DEPTH)
    }

    /// How deep [`Self::to_json`] follows containers: serde_json's own parsing limit.
    pub const JSON_DEPTH: usize = 128;

    fn to_json_within(&self, id: ValueId, depth: usize) -> Option<serde_json::Value> {
        use serde_json::Value;
        let inner = |v: ValueId| self.to_json_within(v, depth.checked_sub(1)?);
        Some(match self.get(id) {
            PickleValue::None => Value::Null,
            PickleValue::Bool(b) => Value::Bool(*b),
            PickleValue::Int(i) => {
                if let Ok(v) = i64::try_from(*i) {
                    Value::from(v)
                } else if let Ok(v) = u64::try_from(*i) {
                    Value::from(v)
                } else {
                    Value::from(*i as f64)
                }
            }
            PickleValue::Float(f) => Value::from(*f),
            PickleValue::Str(s) => Value::String(s.to_string()),
            PickleValue::List(items) | PickleValue::Tuple(items) => {
                Value::Array(items.iter().map(|v| inner(*v)).collect::<Option<_>>()?)
            }
            PickleValue::Dict(items) => Value::Object(
                items
                    .iter()
                    .map(|(k, v)| {
                        let key = match self.get(*k) {
                            PickleValue::Str(s) => s.to_string(),
                            _ => inner(*k)?.to_string(),
                        };
                        Some((key, inner(*v)?))
                    })
                    .collect::<Option<_>>()?,
            ),
        })
    }
}

/// Why a pickle could not be decoded. The offset is that of the opcode being decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("byte offset {offset}, opcode {opcode}: {message}")]
pub struct PickleError {
    /// Byte offset of the failing opcode.
    pub offset: u64,
    /// The opcode's name (or its hex value when unknown).
    pub opcode: String,
    /// What was wrong.
    pub message: String,
}

/// Decodes a whole pickle held in memory.
pub fn decode(bytes: &[u8]) -> Result<Pickle, PickleError> {
    Decoder { bytes, pos: 0, values: Vec::new(), stack: Vec::new(), marks: Vec::new(), memo: Vec::new() }.run()
}

struct Decoder<'a> {
    bytes: &'a [u8],
    pos: usize,
    values: Vec<PickleValue>,
    stack: Vec<ValueId>,
    marks: Vec<usize>,
    /// Memo slots; `None` for a slot never written (BINPUT may skip indices).
    memo: Vec<Option<ValueId>>,
}

/// Context for an error: where the opcode started and which it was.
#[derive(Clone, Copy)]
struct At {
    offset: usize,
    op: u8,
}

impl fmt::Display for At {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&opcode_name(self.op))
    }
}

fn opcode_name(op: u8) -> String {
    let name = match op {
        0x80 => "PROTO",
        0x95 => "FRAME",
        b'.' => "STOP",
        b'(' => "MARK",
        b'}' => "EMPTY_DICT",
        b']' => "EMPTY_LIST",
        b')' => "EMPTY_TUPLE",
        b't' => "TUPLE",
        0x85 => "TUPLE1",
        0x86 => "TUPLE2",
        0x87 => "TUPLE3",
        b's' => "SETITEM",
        b'u' => "SETITEMS",
        b'a' => "APPEND",
        b'e' => "APPENDS",
        b'd' => "DICT",
        b'l' => "LIST",
        b'J' => "BININT",
        b'K' => "BININT1",
        b'M' => "BININT2",
        0x8a => "LONG1",
        0x8b => "LONG4",
        b'G' => "BINFLOAT",
        b'N' => "NONE",
        0x88 => "NEWTRUE",
        0x89 => "NEWFALSE",
        0x8c => "SHORT_BINUNICODE",
        b'X' => "BINUNICODE",
        0x8d => "BINUNICODE8",
        0x94 => "MEMOIZE",
        b'q' => "BINPUT",
        b'r' => "LONG_BINPUT",
        b'h' => "BINGET",
        b'j' => "LONG_BINGET",
        b'0' => "POP",
        b'1' => "POP_MARK",
        b'2' => "DUP",
        b'c' => "GLOBAL",
        0x93 => "STACK_GLOBAL",
        b'R' => "REDUCE",
        0x81 => "NEWOBJ",
        b'b' => "BUILD",
        b'C' => "SHORT_BINBYTES",
        b'B' => "BINBYTES",
        0x8f => "EMPTY_SET",
        0x90 => "ADDITEMS",
        0x91 => "FROZENSET",
        _ => return format!("0x{op:02x}"),
    };
    name.to_string()
}

impl<'a> Decoder<'a> {
    fn err(&self, at: At, message: impl Into<String>) -> PickleError {
        PickleError { offset: at.offset as u64, opcode: at.to_string(), message: message.into() }
    }

    fn take(&mut self, at: At, n: usize) -> Result<&'a [u8], PickleError> {
        let end = self.pos.checked_add(n).filter(|e| *e <= self.bytes.len());
        match end {
            Some(end) => {
                let s = &self.bytes[self.pos..end];
                self.pos = end;
                Ok(s)
            }
            None => {
                Err(self.err(at, format!("truncated: needs {n} argument bytes, file ends at {}", self.bytes.len())))
            }
        }
    }

    fn u8(&mut self, at: At) -> Result<u8, PickleError> {
        Ok(self.take(at, 1)?[0])
    }

    fn u32le(&mut self, at: At) -> Result<u32, PickleError> {
        let b = self.take(at, 4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64le(&mut self, at: At) -> Result<u64, PickleError> {
        let b = self.take(at, 8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }

    fn push_new(&mut self, v: PickleValue) {
        let id = ValueId(self.values.len() as u32);
        self.values.push(v);
        self.stack.push(id);
    }

    fn pop(&mut self, at: At) -> Result<ValueId, PickleError> {
        if self.marks.last().is_some_and(|m| *m >= self.stack.len()) {
            return Err(self.err(at, "stack empty above the current MARK"));
        }
        self.stack.pop().ok_or_else(|| self.err(at, "stack empty"))
    }

    fn top(&self, at: At) -> Result<ValueId, PickleError> {
        self.stack.last().copied().ok_or_else(|| self.err(at, "stack empty"))
    }

    /// Pops everything above the innermost MARK, and the MARK.
    fn pop_mark(&mut self, at: At) -> Result<Vec<ValueId>, PickleError> {
        let m = self.marks.pop().ok_or_else(|| self.err(at, "no MARK on the stack"))?;
        Ok(self.stack.split_off(m))
    }

    fn str_arg(&mut self, at: At, n: usize) -> Result<(), PickleError> {
        let b = self.take(at, n)?;
        let s = std::str::from_utf8(b).map_err(|e| self.err(at, format!("invalid UTF-8: {e}")))?;
        self.push_new(PickleValue::Str(s.into()));
        Ok(())
    }

    fn memo_put(&mut self, at: At, idx: usize) -> Result<(), PickleError> {
        let top = self.top(at)?;
        if idx >= self.memo.len() {
            if idx > self.bytes.len() {
                return Err(self.err(at, format!("memo index {idx} is implausibly large")));
            }
            self.memo.resize(idx + 1, None);
        }
        self.memo[idx] = Some(top);
        Ok(())
    }

    fn memo_get(&mut self, at: At, idx: usize) -> Result<(), PickleError> {
        match self.memo.get(idx).copied().flatten() {
            Some(id) => {
                self.stack.push(id);
                Ok(())
            }
            None => Err(self.err(at, format!("memo index {idx} was never stored"))),
        }
    }

    fn extend_list(&mut self, at: At, list: ValueId, items: Vec<ValueId>) -> Result<(), PickleError> {
        match &mut self.values[list.0 as usize] {
            PickleValue::List(v) => {
                v.extend(items);
                Ok(())
            }
            _ => Err(self.err(at, "target is not a list")),
        }
    }

    fn extend_dict(&mut self, at: At, dict: ValueId, items: Vec<ValueId>) -> Result<(), PickleError> {
        if !items.len().is_multiple_of(2) {
            return Err(self.err(at, format!("odd number of items ({}) for key/value pairs", items.len())));
        }
        match &mut self.values[dict.0 as usize] {
            PickleValue::Dict(v) => {
                v.extend(items.chunks_exact(2).map(|kv| (kv[0], kv[1])));
                Ok(())
            }
            _ => Err(self.err(at, "target is not a dict")),
        }
    }

    fn long(&mut self, at: At, n: usize) -> Result<(), PickleError> {
        if n > 16 {
            return Err(self.err(at, format!("int of {n} bytes does not fit in 128 bits")));
        }
        let b = self.take(at, n)?;
        let mut v: i128 = 0;
        for (i, byte) in b.iter().enumerate() {
            v |= (*byte as i128) << (8 * i);
        }
        // Two's complement: sign-extend from the top byte.
        if n > 0 && n < 16 && b[n - 1] & 0x80 != 0 {
            v -= 1i128 << (8 * n);
        }
        self.push_new(PickleValue::Int(v));
        Ok(())
    }

    fn run(mut self) -> Result<Pickle, PickleError> {
        loop {
            let offset = self.pos;
            let Some(&op) = self.bytes.get(self.pos) else {
                let at = At { offset, op: b'.' };
                return Err(self.err(at, "file ends before STOP"));
            };
            self.pos += 1;
            let at = At { offset, op };
            match op {
                0x80 => {
                    let p = self.u8(at)?;
                    if !(2..=5).contains(&p) {
                        return Err(self.err(at, format!("protocol {p} (expected 2 to 5)")));
                    }
                }
                0x95 => {
                    self.u64le(at)?;
                }
                b'.' => {
                    let root = self.pop(at)?;
                    if !self.stack.is_empty() || !self.marks.is_empty() {
                        return Err(self.err(at, "objects left on the stack at STOP"));
                    }
                    return Ok(Pickle { values: self.values, root });
                }
                b'(' => self.marks.push(self.stack.len()),
                b'}' => self.push_new(PickleValue::Dict(Vec::new())),
                b']' => self.push_new(PickleValue::List(Vec::new())),
                b')' => self.push_new(PickleValue::Tuple(Vec::new())),
                b't' => {
                    let items = self.pop_mark(at)?;
                    self.push_new(PickleValue::Tuple(items));
                }
                0x85..=0x87 => {
                    let n = (op - 0x84) as usize;
                    let mut items = Vec::with_capacity(n);
                    for _ in 0..n {
                        items.push(self.pop(at)?);
                    }
                    items.reverse();
                    self.push_new(PickleValue::Tuple(items));
                }
                b'd' => {
                    let items = self.pop_mark(at)?;
                    self.push_new(PickleValue::Dict(Vec::new()));
                    let d = self.top(at)?;
                    self.extend_dict(at, d, items)?;
                }
                b'l' => {
                    let items = self.pop_mark(at)?;
                    self.push_new(PickleValue::List(items));
                }
                b's' => {
                    let v = self.pop(at)?;
                    let k = self.pop(at)?;
                    let d = self.top(at)?;
                    self.extend_dict(at, d, vec![k, v])?;
                }
                b'u' => {
                    let items = self.pop_mark(at)?;
                    let d = self.top(at)?;
                    self.extend_dict(at, d, items)?;
                }
                b'a' => {
                    let v = self.pop(at)?;
                    let l = self.top(at)?;
                    self.extend_list(at, l, vec![v])?;
                }
                b'e' => {
                    let items = self.pop_mark(at)?;
                    let l = self.top(at)?;
                    self.extend_list(at, l, items)?;
                }
                b'J' => {
                    let v = self.u32le(at)? as i32;
                    self.push_new(PickleValue::Int(v as i128));
                }
                b'K' => {
                    let v = self.u8(at)?;
                    self.push_new(PickleValue::Int(v as i128));
                }
                b'M' => {
                    let b = self.take(at, 2)?;
                    let v = u16::from_le_bytes([b[0], b[1]]);
                    self.push_new(PickleValue::Int(v as i128));
                }
                0x8a => {
                    let n = self.u8(at)? as usize;
                    self.long(at, n)?;
                }
                0x8b => {
                    let n = self.u32le(at)? as usize;
                    self.long(at, n)?;
                }
                b'G' => {
                    let b = self.take(at, 8)?;
                    let mut a = [0u8; 8];
                    a.copy_from_slice(b);
                    self.push_new(PickleValue::Float(f64::from_be_bytes(a)));
                }
                b'N' => self.push_new(PickleValue::None),
                0x88 => self.push_new(PickleValue::Bool(true)),
                0x89 => self.push_new(PickleValue::Bool(false)),
                0x8c => {
                    let n = self.u8(at)? as usize;
                    self.str_arg(at, n)?;
                }
                b'X' => {
                    let n = self.u32le(at)? as usize;
                    self.str_arg(at, n)?;
                }
                0x8d => {
                    let n = self.u64le(at)?;
                    let n = usize::try_from(n).map_err(|_| self.err(at, "length overflows"))?;
                    self.str_arg(at, n)?;
                }
                0x94 => {
                    let idx = self.memo.len();
                    self.memo_put(at, idx)?;
                }
                b'q' => {
                    let idx = self.u8(at)? as usize;
                    self.memo_put(at, idx)?;
                }
                b'r' => {
                    let idx = self.u32le(at)? as usize;
                    self.memo_put(at, idx)?;
                }
                b'h' => {
                    let idx = self.u8(at)? as usize;
                    self.memo_get(at, idx)?;
                }
                b'j' => {
                    let idx = self.u32le(at)? as usize;
                    self.memo_get(at, idx)?;
                }
                b'0' => {
                    self.pop(at)?;
                }
                b'1' => {
                    self.pop_mark(at)?;
                }
                b'2' => {
                    let t = self.top(at)?;
                    self.stack.push(t);
                }
                _ => {
                    return Err(self.err(
                        at,
                        "unsupported opcode: only plain data (dict, list, tuple, str, int, float, \
                         bool, None) is accepted",
                    ))
                }
            }
        }
    }
}
