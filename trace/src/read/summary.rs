//! What a reader has seen of its input as a whole: its form, whether it was cut, and what its
//! producer said it left out (lost events, a recording stopped early).

use std::path::Path;

use crate::api::Api;
use crate::event::Event;
use crate::write::Format;

/// What a reader has seen so far; complete once iteration has ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    /// The form of the input.
    pub format: Format,
    /// The input ended inside a frame (or, in JSON Lines, inside a last line without a newline
    /// that does not parse): the producer was cut short. Everything before was read. Not an error.
    pub truncated: bool,
    /// Frames (binary) or lines (JSON Lines) of kinds this version does not know, skipped.
    pub unknown_skipped: u64,
    /// Where the first of them is: the byte offset of its frame (binary) or its 1-based line
    /// number (JSON Lines).
    pub first_unknown_at: Option<u64>,
    /// The first one's tag (binary).
    pub first_unknown_tag: Option<u8>,
    /// Records of known kinds that carried fields this version does not read (a newer writer's
    /// appended fields, FORMAT.md §1.9 rule 1; in JSON Lines, keys it does not know): read
    /// without them.
    pub extended_records: u64,
    /// Where the first of them is: the byte offset of its frame (binary) or its 1-based line
    /// number (JSON Lines).
    pub first_extended_at: Option<u64>,
    /// The first of them's first key this version does not read (JSON Lines).
    pub first_unread_key: Option<KeyName>,
    /// The header carried fields this version does not read, likewise.
    pub extended_header: bool,
    /// The header's first key this version does not read (JSON Lines).
    pub header_unread_key: Option<KeyName>,
    /// Zero bytes the input ends in, from `complete_bytes` on (binary; 0 when none): space a
    /// file system gave the file before its data reached it (a crash, a full disk). Read as the
    /// end of the input, and said.
    pub zero_tail: u64,
    /// Bytes consumed, header included.
    pub bytes_read: u64,
    /// Byte offset just past the last complete event (or the header): where a truncated input
    /// was cut short, or its zero tail starts. Equals `bytes_read` unless either.
    pub complete_bytes: u64,
    /// Records returned.
    pub records: u64,
    /// The last record returned was the producer's `process_exit`.
    pub ends_with_exit: bool,
    /// The producer ends every trace with `process_exit` ([`PRODUCERS_ENDING_WITH_EXIT`]).
    pub expects_exit: bool,
    /// Events the producer counted as lost (its queue was full), summed over the `process_exit`
    /// records read: they happened but are not in the trace.
    pub lost_events: u64,
    /// The byte limit at which the producer stopped recording, from its marker
    /// ([`crate::marker::byte_limit`]): the run went on, unrecorded, after it.
    pub byte_limit: Option<u64>,
    /// The producer stopped recording when it could not allocate its event queue
    /// ([`crate::marker::QUEUE_UNALLOCATED`]): the run went on, unrecorded, after it.
    pub queue_unallocated: bool,
    /// The producer could not deliver the CUPTI activity records it still held when a signal
    /// ended the process ([`crate::marker::CUPTI_UNDELIVERED`]): `kernel_exec` and `mem_activity`
    /// records may be missing.
    pub cupti_undelivered: bool,
    /// Records whose API this version does not know (a newer writer's), read with it kept as
    /// [`crate::Api::Unknown`]: not incomplete, but said ([`Summary::warnings`]).
    pub unknown_apis: u64,
    /// Of those, records of code 0, which no API has: in JSON Lines, a name this version does
    /// not know ([`crate::Api::UNKNOWN_NAME`]), whose name is not kept.
    pub unknown_api_names: u64,
    /// The first unknown code other than 0, to name one.
    pub first_unknown_api: Option<u16>,
}

/// A key of a JSON Lines line, its first [`KeyName::MAX`] bytes kept (in a summary that is
/// `Copy`): enough to name a misspelt or newer key in a warning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyName {
    bytes: [u8; KeyName::MAX],
    len: u8,
    cut: bool,
}

impl KeyName {
    /// Bytes kept of a name.
    pub const MAX: usize = 40;

    /// `name`, cut at a character boundary if longer than [`KeyName::MAX`] bytes.
    pub fn new(name: &str) -> KeyName {
        let len = name.floor_char_boundary(Self::MAX);
        let mut bytes = [0; Self::MAX];
        bytes[..len].copy_from_slice(&name.as_bytes()[..len]);
        KeyName { bytes, len: len as u8, cut: len < name.len() }
    }

    /// The name kept (its start, if it was cut).
    pub fn as_str(&self) -> &str {
        // The bytes are a prefix of a `&str` cut at a character boundary.
        std::str::from_utf8(&self.bytes[..usize::from(self.len)]).unwrap_or_default()
    }
}

impl std::fmt::Display for KeyName {
    /// Quoted as JSON would write it, `…` inside the quotes where it was cut.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let cut = if self.cut { "…" } else { "" };
        let quoted = serde_json::to_string(self.as_str()).map_err(|_| std::fmt::Error)?;
        write!(f, "{}{cut}\"", &quoted[..quoted.len() - 1])
    }
}

/// The producers that end every trace they finish with a `process_exit` record (the shim at
/// the program's exit, the symbolic tracer at the end of its trace): one of theirs without it
/// was cut short, even at a record boundary (a killed run, a copy cut at a line). Any other
/// producer says the same of its trace with the header's `ends_with_exit`
/// ([`crate::metadata::ENDS_WITH_EXIT`]).
pub const PRODUCERS_ENDING_WITH_EXIT: &[&str] = &["libmemtrace", "memtrace_trainer.symtrace"];

impl Summary {
    /// Whole records, but not the end its producer always writes: see
    /// [`PRODUCERS_ENDING_WITH_EXIT`]. (A truncated input is said as such instead.)
    pub fn cut_short(&self) -> bool {
        self.expects_exit && !self.ends_with_exit && !self.truncated
    }

    /// The trace does not hold the whole run: truncated, cut short, stopped at the producer's
    /// byte limit, with events the producer lost, or with CUPTI records it could not deliver.
    /// What `--strict` refuses; the first line of [`Summary::warnings`] says why.
    pub fn incomplete(&self) -> bool {
        self.truncated
            // Zeros after the producer's last record are only unused space.
            || (self.zero_tail > 0 && !self.ends_with_exit)
            || self.cut_short()
            || self.byte_limit.is_some()
            || self.queue_unallocated
            || self.lost_events > 0
            || self.cupti_undelivered
    }

    /// What the input did not give whole, one line each, naming `path`: an end cut inside an
    /// event (truncation first), an end without the producer's `process_exit`, recording stopped
    /// at the producer's byte limit, events the producer lost, CUPTI records it could not deliver
    /// (what [`Summary::incomplete`] counts, in that order), records of unknown kinds that
    /// were skipped, and fields this version does not read ([`Summary::unread_fields`]).
    pub fn warnings(&self, path: &Path) -> Vec<String> {
        let mut w = Vec::new();
        if self.truncated {
            w.push(format!(
                "{}: truncated: the input ends inside an event; everything after byte {} (the end of the \
                 last complete event) was ignored, so peaks may be low",
                path.display(),
                self.complete_bytes
            ));
        }
        let zeros = (self.zero_tail > 0).then(|| {
            format!(
                "{}: ends in {} zero bytes after byte {} (space the file system gave the file before its data \
                 reached it: a crash or a full disk); they were read as the end of the trace",
                path.display(),
                self.zero_tail,
                self.complete_bytes
            )
        });
        // Said among the reasons the run is incomplete only where it is one (no process_exit
        // before it): `--strict` names the first line as its reason.
        let (zeros_first, zeros_after) = if self.ends_with_exit { (None, zeros) } else { (zeros, None) };
        w.extend(zeros_first);
        if self.cut_short() {
            w.push(format!(
                "{}: cut short: the trace ends without the process_exit record its producer writes at the end (a \
                 killed run, or a copy cut at a line), so what came after is missing and peaks may be low",
                path.display()
            ));
        }
        if let Some(limit) = self.byte_limit {
            w.push(format!(
                "{}: recording stopped at the producer's byte limit (MEMTRACE_MAX_BYTES={limit}): the run went on \
                 unrecorded after the trace reached it, so what came after is missing and peaks may be low",
                path.display()
            ));
        }
        if self.queue_unallocated {
            w.push(format!(
                "{}: recording stopped when the producer could not allocate its event queue (a memory limit): the \
                 run went on unrecorded after it, so what came after is missing and peaks may be low",
                path.display()
            ));
        }
        if self.lost_events > 0 {
            w.push(format!(
                "{}: {} events were lost by the recorder (its queue was full; counted in its process_exit record): \
                 allocations and frees are missing, so peaks and placements may be wrong or low",
                path.display(),
                self.lost_events
            ));
        }
        if self.cupti_undelivered {
            w.push(format!(
                "{}: CUPTI activity records were still buffered when a signal ended the process and could not be \
                 delivered: kernel_exec and mem_activity records may be missing (CUPTI delivers them when its \
                 buffers fill or are flushed, so up to all of them)",
                path.display()
            ));
        }
        w.extend(zeros_after);
        if self.unknown_skipped > 0 {
            let first = if self.unknown_skipped > 1 { "the first is" } else { "it is" };
            let at = match (self.format, self.first_unknown_at, self.first_unknown_tag) {
                (Format::Binary, Some(at), Some(tag)) => format!("; {first} tag {tag} at byte {at}"),
                (Format::Jsonl, Some(line), _) => format!("; {first} at line {line}"),
                _ => String::new(),
            };
            w.push(format!(
                "{}: {} records of kinds this version does not know were skipped (written by a newer memtrace?){at}",
                path.display(),
                self.unknown_skipped
            ));
        }
        w.extend(self.unread_fields_warning(path));
        w.extend(self.unknown_apis_warning(path));
        w
    }

    /// Whether the header or any record carried fields this version does not read (and so
    /// ignored): what a newer writer appended.
    pub fn unread_fields(&self) -> bool {
        self.extended_header || self.extended_records > 0
    }

    /// Counts a record that carried fields this version does not read, at `at` (a frame's byte
    /// offset, or a line number), and names its first unread key (JSON Lines).
    pub(crate) fn note_extended(&mut self, at: u64, key: Option<KeyName>) {
        self.extended_records += 1;
        if self.first_extended_at.is_none() {
            self.first_extended_at = Some(at);
            self.first_unread_key = key;
        }
    }

    /// The warning of fields this version does not read, naming `path`, and where the first of
    /// them is: in JSON Lines, by its name (a misspelt key is read as this).
    fn unread_fields_warning(&self, path: &Path) -> Option<String> {
        let n = self.extended_records;
        let records = match n {
            0 => String::new(),
            1 => "1 record".to_string(),
            n => format!("{n} records"),
        };
        let who = match (self.extended_header, n) {
            (false, 0) => return None,
            (true, 0) => "the header".to_string(),
            (true, _) => format!("the header and {records}"),
            (false, _) => records,
        };
        let why = match self.format {
            Format::Binary => "written by a newer memtrace?",
            Format::Jsonl => "misspelt, or written by a newer memtrace?",
        };
        let mut at = String::new();
        if let Some(key) = self.header_unread_key {
            at += &format!("; the header's first is {key}");
        }
        let first = if n > 1 { "the first record is" } else { "the record is" };
        match (self.format, self.first_extended_at, self.first_unread_key) {
            (Format::Jsonl, Some(line), Some(key)) => at += &format!("; {first} at line {line}, key {key}"),
            (Format::Jsonl, Some(line), None) => at += &format!("; {first} at line {line}"),
            (Format::Binary, Some(byte), _) => at += &format!("; {first} at byte {byte}"),
            _ => {}
        }
        Some(format!(
            "{}: {who} carried fields this version does not read ({why}): those fields were ignored{at}",
            path.display()
        ))
    }

    /// The warning of records naming APIs this version does not know, naming `path`.
    fn unknown_apis_warning(&self, path: &Path) -> Option<String> {
        let n = self.unknown_apis;
        if n == 0 {
            return None;
        }
        let records = if n == 1 { "1 record names an API".to_string() } else { format!("{n} records name APIs") };
        // In JSON Lines code 0 is a name; in the binary form, one a conversion wrote as unknown:0.
        let named = if self.format == Format::Jsonl { self.unknown_api_names } else { 0 };
        let mut what = Vec::new();
        if named > 0 {
            what.push(format!(
                "{named} by a name, which is not kept: read as unknown:0, and written as unknown:0 by a conversion"
            ));
        }
        if n > named {
            let code = self.first_unknown_api.unwrap_or(0);
            let e = if n - named > 1 { ", the first" } else { "" };
            what.push(format!("{} by code{e}: unknown:{code}", n - named));
        }
        Some(format!(
            "{}: {records} this version does not know (written by a newer memtrace?): the records are read, with \
             their API unknown (`unknown` in memsim stats' calls); {}",
            path.display(),
            what.join("; ")
        ))
    }
}

/// What a run of records said of the input as a whole: the producer's own markers that say
/// part of the run is missing (see [`crate::marker`]), and APIs this version does not know.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Stops {
    /// The byte limit it stopped recording at (the first such marker).
    pub(super) limit: Option<u64>,
    /// A stop for want of queue memory.
    pub(super) queue: bool,
    /// CUPTI records it could not deliver at a fatal signal.
    pub(super) cupti: bool,
    /// Records of unknown APIs, those of code 0, and the first other code.
    pub(super) unknown_apis: (u64, u64, Option<u16>),
}

impl Summary {
    /// Count a skipped record of a kind this version does not know, at `at` (a frame's byte
    /// offset, or a line number), keeping where the first was.
    #[cold]
    pub(super) fn note_unknown(&mut self, at: u64, tag: Option<u8>) {
        self.unknown_skipped += 1;
        self.first_unknown(at, tag);
    }

    /// Keep where a skipped record of an unknown kind is, when it is the first.
    pub(super) fn first_unknown(&mut self, at: u64, tag: Option<u8>) {
        if self.first_unknown_at.is_none() {
            self.first_unknown_at = Some(at);
            self.first_unknown_tag = tag;
        }
    }

    /// Add what a run of records said with the producer's markers and their APIs.
    pub(super) fn add_stops(&mut self, stops: Stops) {
        self.byte_limit = self.byte_limit.or(stops.limit);
        self.queue_unallocated |= stops.queue;
        self.cupti_undelivered |= stops.cupti;
        let (apis, names, first) = stops.unknown_apis;
        self.unknown_apis += apis;
        self.unknown_api_names += names;
        self.first_unknown_api = self.first_unknown_api.or(first);
    }
}

/// Count a record made by `api` when this version does not know it.
#[inline(always)]
pub(super) fn note_api(api: Api, stops: &mut Stops) {
    if let Api::Unknown(code) = api {
        note_unknown_api(code, stops);
    }
}

#[cold]
fn note_unknown_api(code: u16, stops: &mut Stops) {
    let (apis, names, first) = &mut stops.unknown_apis;
    *apis += 1;
    if code == Api::UNKNOWN_NAME.code() {
        *names += 1;
    } else {
        first.get_or_insert(code);
    }
}

/// What a record says of the input as a whole: events its producer lost (a `process_exit`'s
/// count, added to `lost`), one of its markers that say part of the run is missing, or an API
/// this version does not know (`stops`). Whether it is the producer's `process_exit`.
#[inline(always)]
pub(super) fn note(event: &Event, lost: &mut u64, stops: &mut Stops) -> bool {
    match event {
        Event::Alloc(a) => note_api(a.api, stops),
        Event::Free(f) => note_api(f.api, stops),
        Event::KernelLaunch(k) => note_api(k.api, stops),
        Event::Vmm(v) => note_api(v.api, stops),
        Event::PoolTrim(p) => note_api(p.api, stops),
        Event::ProcessExit(p) => {
            *lost = lost.saturating_add(p.lost_events);
            return true;
        }
        Event::Marker(m) => {
            if let Some(n) = crate::marker::parse_byte_limit(&m.text) {
                stops.limit.get_or_insert(n);
            } else if m.text == crate::marker::QUEUE_UNALLOCATED {
                stops.queue = true;
            } else if m.text == crate::marker::CUPTI_UNDELIVERED {
                stops.cupti = true;
            }
        }
        _ => {}
    }
    false
}
