//! The JSON Lines form: line encoding and decoding, without I/O.
//!
//! Writing uses the serde derives on [`Record`] (a flattened, internally tagged object). Reading
//! does not go through the derived `Deserialize` of [`Record`]: serde's flatten buffers the object
//! and then loses the field path of any error. Instead a line is read twice from the same bytes,
//! once for the shared fields (`kind`, `ts_ns`, `tid`, `device`) and once straight into the
//! event's own struct (which ignores the shared fields as unknown keys), with
//! `serde_path_to_error` naming the failing field.

use serde::de::DeserializeOwned;
use serde::Deserialize;

use crate::error::TraceError;
use crate::event::*;
use crate::header::{Header, FORMAT_VERSION};
use crate::read::KeyName;

/// The `"kind"` of the header line.
pub const HEADER_KIND: &str = "header";

/// Appends the header line (with its newline). `format_version` is written as
/// [`FORMAT_VERSION`].
pub fn write_header_line(header: &Header, buf: &mut Vec<u8>) -> Result<(), TraceError> {
    let mut h = header.clone();
    h.format_version = FORMAT_VERSION;
    let body = serde_json::to_vec(&h)
        .map_err(|e| TraceError::Encode { what: "the JSON Lines header".into(), message: e.to_string() })?;
    // A serialized Header is an object with at least `format_version`, so it starts "{\"".
    buf.extend_from_slice(b"{\"kind\":\"header\",");
    buf.extend_from_slice(&body[1..]);
    buf.push(b'\n');
    Ok(())
}

/// Appends one record line (with its newline). On error `buf` is unchanged.
pub fn write_record_line(rec: &Record, buf: &mut Vec<u8>) -> Result<(), TraceError> {
    if let Event::Control(Control { op: ControlOp::SetMemoryFraction { fraction } }) = &rec.event {
        // serde_json would silently write `null`, which no reader accepts back.
        if !fraction.is_finite() {
            return Err(TraceError::Encode {
                what: "a control record".into(),
                message: format!("set_memory_fraction fraction {fraction} is not a finite number; JSON cannot hold it"),
            });
        }
    }
    let start = buf.len();
    if let Err(e) = serde_json::to_writer(&mut *buf, rec) {
        buf.truncate(start);
        return Err(TraceError::Encode { what: format!("a {} record", rec.event.kind()), message: e.to_string() });
    }
    buf.push(b'\n');
    Ok(())
}

#[derive(Deserialize)]
struct Common {
    #[serde(default)]
    kind: Option<String>,
    /// A control record's operation; a tag that is not a string is refused here (see
    /// [`tags_are_strings`]).
    #[serde(default)]
    op: Option<String>,
    #[serde(default)]
    ts_ns: Option<u64>,
    #[serde(default)]
    tid: Option<u32>,
    #[serde(default)]
    device: Option<u32>,
}

/// Whether every `"kind"` and `"op"` key of the line has a string value. serde's internally
/// tagged enums (`Event` by `kind`, `Control` by `op`) also take a variant's index, so
/// `"kind":1` read as a free: a line where this is false goes to [`parse_record_line`], which
/// refuses it naming the field. A key inside a string value is escaped (`\"kind\"`) and does
/// not match; a nested one with another value only sends its line the slower way.
pub(crate) fn tags_are_strings(line: &[u8]) -> bool {
    // One pass over the quotes: the line was parsed already, this only routes it.
    line.iter().enumerate().filter(|&(_, &b)| b == b'"').all(|(i, _)| {
        let rest = &line[i + 1..];
        let Some(after) = rest.strip_prefix(b"kind\"").or_else(|| rest.strip_prefix(b"op\"")) else { return true };
        let mut after = after.iter().copied().skip_while(u8::is_ascii_whitespace);
        match after.next() {
            Some(b':') => after.find(|b| !b.is_ascii_whitespace()) == Some(b'"'),
            _ => true,
        }
    })
}

/// serde_json appends " at line L column C"; the line is always 1 here, so keep the column only.
fn json_message(e: &serde_json::Error) -> String {
    let text = e.to_string();
    let suffix = format!(" at line {} column {}", e.line(), e.column());
    match text.strip_suffix(&suffix) {
        Some(msg) if e.column() > 0 => format!("{msg} (column {})", e.column()),
        Some(msg) => msg.to_string(),
        None => text,
    }
}

fn json_error(line: u64, e: serde_path_to_error::Error<serde_json::Error>) -> TraceError {
    let path = e.path().to_string();
    let inner = e.into_inner();
    let message = json_message(&inner);
    let field = if path != "." && !path.is_empty() {
        Some(path)
    } else {
        // A missing field is reported at the parent; its name is in the message.
        message.strip_prefix("missing field `").and_then(|m| m.split('`').next()).map(str::to_string)
    };
    TraceError::Json { line, field, message }
}

fn parse<T: DeserializeOwned>(bytes: &[u8], line: u64) -> Result<T, TraceError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let v = serde_path_to_error::deserialize(&mut de).map_err(|e| json_error(line, e))?;
    de.end().map_err(|e| TraceError::Json { line, field: None, message: json_message(&e) })?;
    Ok(v)
}

fn common(bytes: &[u8], line: u64) -> Result<Common, TraceError> {
    parse::<Common>(bytes, line).map_err(|e| match e {
        // `null`, `[]` or `5` as a line: serde names the private struct it wanted.
        TraceError::Json { line, field, message } => {
            TraceError::Json { line, field, message: message.replace("struct Common", "a JSON object") }
        }
        e => e,
    })
}

/// A control record, its fields read by `op`: serde reads an internally tagged enum through a
/// buffer that loses the field's name (`"fraction":"0.5"` said only "expected f64").
fn control(bytes: &[u8], line: u64, op: Option<&str>) -> Result<Control, TraceError> {
    #[derive(Deserialize)]
    struct Fraction {
        fraction: f64,
    }
    #[derive(Deserialize)]
    struct Stream {
        addr: u64,
        stream: i64,
    }
    let op = match op {
        Some("set_memory_fraction") => {
            ControlOp::SetMemoryFraction { fraction: parse::<Fraction>(bytes, line)?.fraction }
        }
        Some("record_stream") => {
            let Stream { addr, stream } = parse(bytes, line)?;
            ControlOp::RecordStream { addr, stream }
        }
        // The other operations have no fields; a missing or unknown `op` is refused, named.
        _ => {
            return parse(bytes, line).map_err(|e| match e {
                TraceError::Json { line, field: None, message } => {
                    TraceError::Json { line, field: Some("op".into()), message }
                }
                e => e,
            })
        }
    };
    Ok(Control { op })
}

/// The first bytes of a line for messages.
fn preview(bytes: &[u8]) -> String {
    let s = String::from_utf8_lossy(&bytes[..bytes.len().min(60)]).into_owned();
    if bytes.len() > 60 {
        format!("{s:?}...")
    } else {
        format!("{s:?}")
    }
}

/// Parses the header line (1-based `line`).
pub fn parse_header_line(bytes: &[u8], line: u64) -> Result<Header, TraceError> {
    let c = common(bytes, line).map_err(|e| match e {
        TraceError::Json { message, .. } => {
            TraceError::MissingHeader { line, found: format!("{} ({message})", preview(bytes)) }
        }
        e => e,
    })?;
    match c.kind.as_deref() {
        Some(HEADER_KIND) => {}
        Some(k) => return Err(TraceError::MissingHeader { line, found: format!("a {k:?} record") }),
        None => return Err(TraceError::MissingHeader { line, found: "an object without \"kind\"".into() }),
    }
    // The version first, as any number: a newer version's header may differ in its other
    // fields, and 99999 is a version too new, not a number too large for the field's type.
    #[derive(Deserialize)]
    struct Version {
        format_version: u64,
    }
    let version = parse::<Version>(bytes, line)?.format_version;
    if version == 0 || version > u64::from(FORMAT_VERSION) {
        return Err(TraceError::UnsupportedVersion { found: version, max: FORMAT_VERSION });
    }
    parse(bytes, line)
}

/// Parses one record line (1-based `line`). `Ok(None)`: a kind this version does not know.
pub fn parse_record_line(bytes: &[u8], line: u64) -> Result<Option<Record>, TraceError> {
    let c = common(bytes, line)?;
    let Some(kind) = c.kind else {
        return Err(TraceError::Json {
            line,
            field: Some("kind".into()),
            message: format!("missing field `kind`: expected one of {}", Event::KINDS.join(", ")),
        });
    };
    let event = match kind.as_str() {
        "alloc" => Event::Alloc(parse(bytes, line)?),
        "free" => Event::Free(parse(bytes, line)?),
        "vmm" => Event::Vmm(parse(bytes, line)?),
        "launch" => Event::KernelLaunch(parse(bytes, line)?),
        "kernel_exec" => Event::KernelExec(parse(bytes, line)?),
        "mem_info" => Event::MemInfo(parse(bytes, line)?),
        "marker" => Event::Marker(parse(bytes, line)?),
        "name" => Event::Name(parse(bytes, line)?),
        "stack" => Event::Stack(parse(bytes, line)?),
        "oom" => Event::Oom(parse(bytes, line)?),
        "control" => Event::Control(control(bytes, line, c.op.as_deref())?),
        "pool_trim" => Event::PoolTrim(parse(bytes, line)?),
        "segment_state" => Event::SegmentState(parse(bytes, line)?),
        "snapshot_point" => Event::SnapshotPoint(parse(bytes, line)?),
        "process_exit" => Event::ProcessExit(parse(bytes, line)?),
        "mem_activity" => Event::MemActivity(parse(bytes, line)?),
        HEADER_KIND => {
            return Err(TraceError::Json {
                line,
                field: Some("kind".into()),
                message: "a second header line: only the first line may be a header".into(),
            })
        }
        _ => return Ok(None),
    };
    Ok(Some(Record { ts_ns: c.ts_ns, tid: c.tid, device: c.device, event }))
}

/// The keys every record line may have beside its event's fields.
const SHARED_KEYS: &[&str] = &["kind", "ts_ns", "tid", "device"];

/// The first top-level key of a record line that neither the shared fields nor `event`'s struct
/// have: a field a newer writer added (or a misspelt one), which the derived and the line reader
/// both ignore (FORMAT.md §2), so the reader counts and names it. One more pass over a line
/// already parsed; the JSON Lines form is not the one read by the million.
pub(crate) fn unread_key(line: &[u8], event: &Event) -> Option<KeyName> {
    // Found once: a probe makes an error, which allocates.
    static FIELDS: std::sync::OnceLock<[&[&str]; 15]> = std::sync::OnceLock::new();
    let f = FIELDS.get_or_init(|| {
        [
            fields_of::<Alloc>(),
            fields_of::<Free>(),
            fields_of::<Vmm>(),
            fields_of::<KernelLaunch>(),
            fields_of::<KernelExec>(),
            fields_of::<MemInfo>(),
            fields_of::<Marker>(),
            fields_of::<NameDef>(),
            fields_of::<StackDef>(),
            fields_of::<Oom>(),
            fields_of::<PoolTrim>(),
            fields_of::<SegmentState>(),
            fields_of::<SnapshotPoint>(),
            fields_of::<ProcessExit>(),
            fields_of::<MemActivity>(),
        ]
    });
    let (control_owned, control_keys);
    let fields: &[&str] = match event {
        Event::Alloc(_) => f[0],
        Event::Free(_) => f[1],
        Event::Vmm(_) => f[2],
        Event::KernelLaunch(_) => f[3],
        Event::KernelExec(_) => f[4],
        Event::MemInfo(_) => f[5],
        Event::Marker(_) => f[6],
        Event::Name(_) => f[7],
        Event::Stack(_) => f[8],
        Event::Oom(_) => f[9],
        Event::PoolTrim(_) => f[10],
        Event::SegmentState(_) => f[11],
        Event::SnapshotPoint(_) => f[12],
        Event::ProcessExit(_) => f[13],
        Event::MemActivity(_) => f[14],
        // `op` names the operation, whose own fields follow (flattened). serde reads an internally
        // tagged enum's variants with no field list to probe, so the keys are the ones it writes
        // (no operation skips a field; control records are rare, so the allocation is cheap).
        Event::Control(Control { op }) => {
            control_owned = keys_written(op);
            control_keys = control_owned.iter().map(String::as_str).collect::<Vec<_>>();
            &control_keys
        }
    };
    unread_keys(line, SHARED_KEYS, fields)
}

/// The header line's first top-level key that [`Header`] does not have.
pub(crate) fn header_unread_key(line: &[u8]) -> Option<KeyName> {
    unread_keys(line, &["kind"], fields_of::<Header>())
}

/// The first top-level key of the object `line` in neither `shared` nor `fields`. The line was
/// parsed already, so it is valid JSON: a walk from key to key that skips each value finds the
/// keys at a fraction of a second parse's cost.
fn unread_keys(line: &[u8], shared: &[&str], fields: &[&str]) -> Option<KeyName> {
    // Most names differ from a key in length or last byte: compared first, without a call.
    let is = |k: &&str, key: &[u8]| {
        let k = k.as_bytes();
        k.len() == key.len() && k.last() == key.last() && k == key
    };
    let known = |key: &[u8]| shared.iter().any(|k| is(k, key)) || fields.iter().any(|k| is(k, key));
    let open = line.iter().position(|&b| b == b'{')?;
    let mut i = open + 1;
    loop {
        i = skip_ws(line, i);
        if line.get(i) != Some(&b'"') {
            return None; // `}`: the end
        }
        let (end, escaped) = string_end(line, i + 1);
        let unread = if escaped {
            // An escaped key (`"\u0061ddr"`) is compared as the text it stands for.
            let text = serde_json::from_slice::<String>(&line[i..(end + 1).min(line.len())]);
            text.ok().filter(|t| !known(t.as_bytes())).map(|t| KeyName::new(&t))
        } else {
            let key = &line[i + 1..end.min(line.len())];
            // The line parsed as JSON, so an unescaped key is UTF-8.
            (!known(key)).then(|| KeyName::new(std::str::from_utf8(key).unwrap_or("?")))
        };
        if unread.is_some() {
            return unread;
        }
        i = skip_ws(line, end + 1) + 1; // past the `:`
        i = skip_value(line, skip_ws(line, i));
        i = skip_ws(line, i);
        if line.get(i) != Some(&b',') {
            return None;
        }
        i += 1;
    }
}

fn skip_ws(line: &[u8], i: usize) -> usize {
    i + line.get(i..).unwrap_or_default().iter().take_while(|b| b.is_ascii_whitespace()).count()
}

/// The index of the quote that ends the string whose text starts at `i`, and whether it holds
/// an escape.
fn string_end(line: &[u8], mut i: usize) -> (usize, bool) {
    let mut escaped = false;
    while let Some(&b) = line.get(i) {
        match b {
            b'"' => break,
            b'\\' => {
                escaped = true;
                i += 2;
            }
            _ => i += 1,
        }
    }
    (i, escaped)
}

/// The index just past the value that starts at `i`.
fn skip_value(line: &[u8], i: usize) -> usize {
    match line.get(i) {
        Some(b'"') => string_end(line, i + 1).0 + 1,
        Some(b'{' | b'[') => {
            let (mut depth, mut j) = (0u32, i);
            while let Some(&b) = line.get(j) {
                match b {
                    b'"' => j = string_end(line, j + 1).0,
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return j + 1;
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
            j
        }
        // A number, `true`, `false` or `null`: up to the next separator.
        _ => i + line.get(i..).unwrap_or_default().iter().take_while(|&&b| !matches!(b, b',' | b'}')).count(),
    }
}

/// The field names of a struct with derived `Deserialize`, which it hands its deserializer: a
/// deserializer that only takes them and declines.
fn fields_of<T: DeserializeOwned>() -> &'static [&'static str] {
    use serde::de::{Error as _, Visitor};
    use serde::forward_to_deserialize_any;

    struct Probe<'a>(&'a mut &'static [&'static str]);

    impl<'de> serde::Deserializer<'de> for Probe<'_> {
        type Error = serde::de::value::Error;
        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
            Err(Self::Error::custom("a probe"))
        }
        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Self::Error> {
            *self.0 = fields;
            Err(Self::Error::custom("a probe"))
        }
        forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf option unit
            unit_struct newtype_struct seq tuple tuple_struct map enum identifier ignored_any
        }
    }

    let mut fields: &'static [&'static str] = &[];
    let _ = T::deserialize(Probe(&mut fields));
    fields
}

/// The keys serde writes for `value`, in no set order: for an internally tagged enum's variant,
/// its tag and its fields.
fn keys_written<T: serde::Serialize>(value: &T) -> Vec<String> {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::Object(map)) => map.into_iter().map(|(k, _)| k).collect(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::{keys_written, unread_key, unread_keys};
    use crate::event::{Control, ControlOp, Event};

    /// Every operation's keys, as serde writes them: the tag, then the operation's fields.
    #[test]
    fn control_keys_are_serdes() {
        let sorted = |mut v: Vec<String>| {
            v.sort();
            v
        };
        assert_eq!(keys_written(&ControlOp::EmptyCache), ["op"]);
        assert_eq!(keys_written(&ControlOp::ResetPeakStats), ["op"]);
        assert_eq!(sorted(keys_written(&ControlOp::SetMemoryFraction { fraction: 0.5 })), ["fraction", "op"]);
        assert_eq!(sorted(keys_written(&ControlOp::RecordStream { addr: 1, stream: 2 })), ["addr", "op", "stream"]);
        let stream = Event::Control(Control { op: ControlOp::RecordStream { addr: 1, stream: 2 } });
        assert_eq!(
            unread_key(br#"{"kind":"control","ts_ns":3,"op":"record_stream","addr":1,"stream":2}"#, &stream),
            None
        );
        let new = unread_key(br#"{"kind":"control","op":"record_stream","addr":1,"stream":2,"new":0}"#, &stream);
        assert_eq!(new.as_ref().map(|k| k.as_str()), Some("new"));
    }

    #[test]
    fn only_top_level_keys_outside_the_lists_count() {
        let check = |line: &str, unread: Option<&str>| {
            serde_json::from_str::<serde_json::Value>(line).expect("valid JSON");
            let key = unread_keys(line.as_bytes(), &["kind"], &["a", "b"]);
            assert_eq!(key.as_ref().map(|k| k.as_str()), unread, "{line}");
        };
        check(r#"{"kind":"x","a":1,"b":[1,{"c":2}]}"#, None);
        check(r#"{"kind":"x", "a" : {"new":1}, "b":"c\":d"}"#, None);
        check(r#"{"kind":"x","a":1,"new":null}"#, Some("new"));
        check(r#"{ "new" :1, "later": 2}"#, Some("new"));
        // Escapes in a key are read as the text they stand for; in a value, they end nothing.
        check(r#"{"\u0061":1,"b":"\\"}"#, None);
        check(r#"{"\u0063":1}"#, Some("c"));
        check(r#"{"b":"{\"new\":1}"}"#, None);
    }
}
