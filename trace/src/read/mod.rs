//! The streaming reader: a record at a time or a batch, constant memory, either form.

mod hot;
mod lines;
mod source;
mod summary;

use std::fs::File;
use std::io::{BufRead, BufReader, ErrorKind, Read};
use std::path::{Path, PathBuf};

use crate::codec::{self, Decoded, PrefixState, VarintError, MAX_FRAME_LEN, PREAMBLE_LEN};
use crate::error::TraceError;
use crate::event::Record;
use crate::header::Header;
use crate::write::Format;
pub use hot::MapRecord;
use source::{detect, Source, READ_BUFFER};
use summary::{note, Stops};
pub use summary::{KeyName, Summary, PRODUCERS_ENDING_WITH_EXIT};

enum Form {
    Binary { state: PrefixState },
    Jsonl { line: u64 },
}

/// Reads a trace record by record. Also an [`Iterator`] of `Result<Record, TraceError>`; after
/// the first error it yields nothing more.
pub struct Reader<R: Read> {
    src: Source<R>,
    header: Header,
    form: Form,
    scratch: Vec<u8>,
    summary: Summary,
    path: Option<PathBuf>,
    done: bool,
}

/// Opens a trace from any byte source, detecting the form: the binary magic `MEMTRACE`, or a
/// first non-blank byte `{` for JSON Lines. Reads the header before returning.
pub fn open_reader<R: Read>(r: R) -> Result<Reader<R>, TraceError> {
    Reader::new(Source::Stream(BufReader::with_capacity(READ_BUFFER, r)), None)
}

impl Reader<File> {
    /// Opens a trace file; every error, now or while iterating, names the path. A regular file
    /// is mapped into memory and decoded in place; anything that cannot be mapped (a pipe, a
    /// character device) is streamed.
    pub fn open(path: impl AsRef<Path>) -> Result<Reader<File>, TraceError> {
        let path = path.as_ref();
        let f = File::open(path).map_err(|e| {
            // `-` is standard input only to a command that says so (memsim's).
            let what = if path == Path::new("-") && e.kind() == ErrorKind::NotFound {
                "cannot open trace (`-` is not standard input here: give a file, or /dev/stdin to stream one)"
            } else {
                "cannot open trace"
            };
            TraceError::io(what, e).in_file(path)
        })?;
        let regular = f.metadata().is_ok_and(|m| m.is_file() && m.len() > 0);
        // Safety: the mapping is read-only and owned by the reader, so no slice of it outlives
        // it. Its bytes must not shrink while mapped: memtrace's writers only append to a trace
        // (the shim, while its process runs) or rename a finished one into place, and bytes
        // appended after the mapping was made are not seen, as a stream opened then would not
        // see them. A trace truncated by someone else while it is read (a new run recreating
        // the same path) would fault; streaming it (`open_reader`) does not.
        let src = match regular.then(|| unsafe { memmap2::Mmap::map(&f) }) {
            Some(Ok(map)) => {
                // Sequential reads: let the kernel read ahead.
                let _ = map.advise(memmap2::Advice::Sequential);
                Source::Mapped { map, pos: 0, released: 0 }
            }
            _ => Source::Stream(BufReader::with_capacity(READ_BUFFER, f)),
        };
        Reader::new(src, Some(path.to_path_buf()))
    }
}

impl<R: Read> Reader<R> {
    fn new(mut src: Source<R>, path: Option<PathBuf>) -> Result<Self, TraceError> {
        let attach = |e: TraceError| match &path {
            Some(p) => e.in_file(p),
            None => e,
        };
        let (format, skipped, newlines) = detect(&mut src).map_err(attach)?;
        let mut reader = Reader {
            src,
            header: Header::new("", "", crate::header::Level::Device),
            form: match format {
                Format::Binary => Form::Binary { state: PrefixState::default() },
                Format::Jsonl => Form::Jsonl { line: newlines },
            },
            scratch: Vec::new(),
            summary: Summary {
                format,
                truncated: false,
                unknown_skipped: 0,
                first_unknown_at: None,
                first_unknown_tag: None,
                extended_records: 0,
                first_extended_at: None,
                first_unread_key: None,
                extended_header: false,
                header_unread_key: None,
                zero_tail: 0,
                bytes_read: skipped,
                complete_bytes: skipped,
                records: 0,
                ends_with_exit: false,
                expects_exit: false,
                lost_events: 0,
                byte_limit: None,
                queue_unallocated: false,
                cupti_undelivered: false,
                unknown_apis: 0,
                unknown_api_names: 0,
                first_unknown_api: None,
            },
            path: path.clone(),
            done: false,
        };
        reader.header = match format {
            Format::Binary => reader.read_binary_header(),
            Format::Jsonl => reader.read_jsonl_header(),
        }
        .map_err(attach)?;
        reader.summary.expects_exit = PRODUCERS_ENDING_WITH_EXIT.contains(&reader.header.producer.name.as_str())
            || reader.header.meta(&crate::metadata::ENDS_WITH_EXIT) == Some("true");
        Ok(reader)
    }

    /// The trace header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// Counters so far; final once [`next_record`](Self::next_record) has returned `None`.
    pub fn summary(&self) -> Summary {
        let mut s = self.summary;
        if !s.truncated && s.zero_tail == 0 {
            s.complete_bytes = s.bytes_read;
        }
        s
    }

    /// The next record; `None` at the end of the input (or of its last complete record, when
    /// truncated: see [`Summary::truncated`]).
    #[inline]
    pub fn next_record(&mut self) -> Option<Result<Record, TraceError>> {
        if self.done {
            return None;
        }
        // The common case first: a whole binary frame already in the buffer (always, for a
        // mapped file), decoded in place.
        let mut buffered = None;
        match self.decode_buffered(1, &mut |r| r, |r| buffered = Some(r)) {
            Ok(_) => {
                if let Some(r) = buffered {
                    return Some(Ok(r));
                }
            }
            Err(e) => return Some(Err(e)),
        }
        let r = match self.form {
            Form::Binary { .. } => self.next_binary(),
            Form::Jsonl { .. } => self.next_jsonl(),
        };
        match r {
            Ok(Some(rec)) => {
                self.summary.records += 1;
                let s = &mut self.summary;
                let mut stops = Stops::default();
                s.ends_with_exit = note(&rec.event, &mut s.lost_events, &mut stops);
                s.add_stops(stops);
                Some(Ok(rec))
            }
            Ok(None) => {
                self.done = true;
                None
            }
            Err(e) => {
                self.done = true;
                Some(Err(self.in_file(e)))
            }
        }
    }

    /// Up to `max` more records, each turned into an item by `map` and pushed onto `out`; the
    /// same records, in the same order and with the same errors, as that many calls of
    /// [`next_record`](Self::next_record). `Ok(false)` once the input has ended (after pushing
    /// what was left), `Ok(true)` when `max` were pushed.
    ///
    /// Why: a consumer that reads in batches (a decoding thread) spends a large share of its
    /// time returning 112-byte records one at a time. Here the whole frames already buffered (all
    /// of a mapped file) are decoded in one loop with the frame decoder and `map` inlined into
    /// it, and the reader's counters are updated once a batch: a quarter fewer instructions on
    /// `memsim`'s decoding thread than a loop of `next_record` (docs/benchmarks.md).
    #[inline]
    pub fn next_records<T>(
        &mut self,
        out: &mut Vec<T>,
        max: usize,
        map: &mut impl FnMut(Record) -> T,
    ) -> Result<bool, TraceError> {
        self.next_records_with(out, max, map)
    }

    /// [`next_records`](Self::next_records) with a [`MapRecord`], which may take the hot kinds
    /// (allocations and frees) field by field, with no record built.
    #[inline]
    pub fn next_records_with<T>(
        &mut self,
        out: &mut Vec<T>,
        max: usize,
        map: &mut impl MapRecord<T>,
    ) -> Result<bool, TraceError> {
        let mut left = max;
        while left > 0 {
            if self.done {
                return Ok(false);
            }
            left -= self.decode_buffered(left, map, |item| out.push(item))?;
            if left == 0 {
                break;
            }
            // A frame split across buffer refills, a truncated end, JSON Lines: the general path.
            match self.next_record() {
                Some(Ok(r)) => {
                    out.push(map.record(r));
                    left -= 1;
                }
                Some(Err(e)) => return Err(e),
                None => return Ok(false),
            }
        }
        Ok(true)
    }

    /// Decodes the whole binary frames already buffered, up to `max` records, handing each as
    /// `map` maps it to `emit` and skipping (counting) unknown kinds; returns how many it handed
    /// over (the hot kinds reach `map` field by field: `hot.rs`). Stops at
    /// the first frame that is not whole (the general path reads it). An error ends the reader
    /// and names the file. The frame decoder is inlined here (`decode_frame` is not), so that a
    /// record is built where `emit` takes it, not returned through `decode_frame`'s result.
    #[inline(always)]
    fn decode_buffered<T>(
        &mut self,
        max: usize,
        map: &mut impl MapRecord<T>,
        mut emit: impl FnMut(T),
    ) -> Result<usize, TraceError> {
        let Form::Binary { state } = &mut self.form else { return Ok(0) };
        let buf = self.src.buffer();
        let (mut used, mut records, mut unknown, mut extended) = (0usize, 0usize, 0u64, 0u64);
        let (mut last_exit, mut first_unknown) = (None, None);
        let (mut lost, mut stops) = (0u64, Stops::default());
        let mut error = None;
        // Where the first record with appended fields is, is found again from here when the
        // batch has one (rare: a newer writer's trace), not looked for at every record.
        let start = state.clone();
        while records < max {
            let Some((tag, at, len)) = hot::whole_frame(&buf[used..]) else { break };
            if hot::map_hot(state, tag, &buf[used + at..], len, &mut extended, &mut stops, map, &mut emit) {
                used += at + len;
                last_exit = Some(false);
                records += 1;
                continue;
            }
            let offset = self.summary.bytes_read + used as u64;
            let d = codec::decode_frame_with(state, tag, &buf[used + at..], len, true, offset, &mut extended);
            used += at + len;
            match d {
                Ok(Decoded::Record(r)) => {
                    last_exit = Some(note(&r.event, &mut lost, &mut stops));
                    emit(map.record(r));
                    records += 1;
                }
                Ok(Decoded::Unknown { tag }) => {
                    unknown += 1;
                    first_unknown = first_unknown.or(Some((offset, tag)));
                }
                Err(e) => {
                    error = Some(e);
                    break;
                }
            }
        }
        if extended > 0 && self.summary.first_extended_at.is_none() {
            let at = hot::first_extended(start, &buf[..used]);
            self.summary.first_extended_at = at.map(|at| self.summary.bytes_read + at as u64);
        }
        self.src.consume(used);
        self.summary.bytes_read += used as u64;
        self.summary.records += records as u64;
        self.summary.unknown_skipped += unknown;
        if let Some((at, tag)) = first_unknown {
            self.summary.first_unknown(at, Some(tag));
        }
        self.summary.extended_records += extended;
        self.summary.lost_events = self.summary.lost_events.saturating_add(lost);
        self.summary.add_stops(stops);
        if let Some(exit) = last_exit {
            self.summary.ends_with_exit = exit;
        }
        match error {
            Some(e) => {
                self.done = true;
                Err(self.in_file(e))
            }
            None => Ok(records),
        }
    }

    /// An error naming this reader's file, when it has one.
    fn in_file(&self, e: TraceError) -> TraceError {
        match &self.path {
            Some(p) => e.in_file(p),
            None => e,
        }
    }

    /// Reads up to `n` bytes into `scratch` (cleared first); false when the input ended first.
    fn fill_scratch(&mut self, n: usize, what: &str) -> Result<bool, TraceError> {
        self.scratch.clear();
        let got = (&mut self.src)
            .take(n as u64)
            .read_to_end(&mut self.scratch)
            .map_err(|e| TraceError::io(format!("reading {what} at byte {}", self.summary.bytes_read), e))?;
        self.summary.bytes_read += got as u64;
        Ok(got == n)
    }

    /// Reads an unsigned varint byte by byte; `Ok(None)` when the input ends inside it.
    fn read_varint(&mut self, what: &str) -> Result<Option<Result<u64, VarintError>>, TraceError> {
        let mut bytes = [0u8; 10];
        for i in 0..10 {
            let Some(b) = self.read_byte(what)? else { return Ok(None) };
            bytes[i] = b;
            if b & 0x80 == 0 {
                return Ok(Some(codec::get_uvarint(&bytes[..=i]).map(|(v, _)| v)));
            }
        }
        Ok(Some(Err(VarintError::Overflow)))
    }

    fn read_byte(&mut self, what: &str) -> Result<Option<u8>, TraceError> {
        loop {
            match self.src.fill_buf() {
                Ok([]) => return Ok(None),
                Ok(buf) => {
                    let b = buf[0];
                    self.src.consume(1);
                    self.summary.bytes_read += 1;
                    return Ok(Some(b));
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return Err(TraceError::io(format!("reading {what} at byte {}", self.summary.bytes_read), e)),
            }
        }
    }

    fn read_binary_header(&mut self) -> Result<Header, TraceError> {
        if !self.fill_scratch(PREAMBLE_LEN, "the preamble")? {
            let seen = &self.scratch;
            if codec::MAGIC.starts_with(seen) || seen.starts_with(&codec::MAGIC) {
                return Err(TraceError::PartialHeader {
                    offset: self.summary.bytes_read,
                    what: "the preamble (magic, version, flags)",
                });
            }
            return Err(TraceError::BadMagic { found: seen.clone() });
        }
        let mut pre = [0u8; PREAMBLE_LEN];
        pre.copy_from_slice(&self.scratch);
        let (version, _flags) = codec::check_preamble(&pre)?;
        let offset = self.summary.bytes_read;
        let len = match self.read_varint("the header frame length")? {
            None => {
                return Err(TraceError::PartialHeader {
                    offset: self.summary.bytes_read,
                    what: "the header frame length",
                })
            }
            Some(Err(_)) => {
                return Err(TraceError::CorruptFrame { offset, reason: "header length varint exceeds 64 bits".into() })
            }
            Some(Ok(len)) if len > MAX_FRAME_LEN => {
                return Err(TraceError::CorruptFrame {
                    offset,
                    reason: format!("header length {len} exceeds the {MAX_FRAME_LEN}-byte frame limit"),
                })
            }
            Some(Ok(len)) => len as usize,
        };
        if !self.fill_scratch(len, "the header frame")? {
            return Err(TraceError::PartialHeader { offset: self.summary.bytes_read, what: "the header frame body" });
        }
        let (mut header, extended) = codec::decode_header_extended(&self.scratch, offset)?;
        self.summary.extended_header = extended;
        header.format_version = version;
        Ok(header)
    }

    fn next_binary(&mut self) -> Result<Option<Record>, TraceError> {
        loop {
            let offset = self.summary.bytes_read;
            // Fast path: tag and a complete length varint are buffered.
            let buffered = self.src.buffer();
            if buffered.len() > 11 && buffered[0] != 0 {
                if let Ok((len, n)) = codec::get_uvarint(&buffered[1..]) {
                    if len <= MAX_FRAME_LEN && buffered.len() >= 1 + n + len as usize {
                        let (tag, len) = (buffered[0], len as usize);
                        let Form::Binary { state } = &mut self.form else { unreachable!("binary reader") };
                        let body = &buffered[1 + n..1 + n + len];
                        let mut extended = 0;
                        let d = codec::decode_frame_with(state, tag, body, len, true, offset, &mut extended);
                        self.src.consume(1 + n + len);
                        self.summary.bytes_read += (1 + n + len) as u64;
                        if extended > 0 {
                            self.summary.note_extended(offset, None);
                        }
                        match d? {
                            Decoded::Record(r) => return Ok(Some(r)),
                            Decoded::Unknown { tag } => {
                                self.summary.note_unknown(offset, Some(tag));
                                continue;
                            }
                        }
                    }
                }
            }
            let Some(tag) = self.read_byte("an event frame")? else { return Ok(None) };
            if tag == 0 {
                if self.zeros_to_end()? {
                    self.summary.zero_tail = self.summary.bytes_read - offset;
                    self.summary.complete_bytes = offset;
                    return Ok(None);
                }
                return Err(TraceError::CorruptFrame { offset, reason: "tag 0 is invalid (tags start at 1)".into() });
            }
            let len = match self.read_varint("an event frame length")? {
                None => return self.truncated(offset),
                Some(Err(_)) => {
                    return Err(TraceError::CorruptFrame {
                        offset,
                        reason: "frame length varint exceeds 64 bits".into(),
                    })
                }
                Some(Ok(len)) if len > MAX_FRAME_LEN => {
                    return Err(TraceError::CorruptFrame {
                        offset,
                        reason: format!("frame length {len} exceeds the {MAX_FRAME_LEN}-byte limit (tag {tag})"),
                    })
                }
                Some(Ok(len)) => len as usize,
            };
            let Form::Binary { state } = &mut self.form else { unreachable!("next_binary on a JSON Lines reader") };
            // Fast path: the whole body is already buffered; decode it in place.
            let buffered = self.src.buffer();
            let mut extended = 0;
            let decoded = if buffered.len() >= len {
                let d = codec::decode_frame_with(state, tag, &buffered[..len], len, true, offset, &mut extended);
                self.src.consume(len);
                self.summary.bytes_read += len as u64;
                d?
            } else {
                if !self.fill_scratch(len, "an event frame body")? {
                    return self.truncated(offset);
                }
                let Form::Binary { state } = &mut self.form else { unreachable!("form does not change") };
                codec::decode_frame_with(state, tag, &self.scratch, len, true, offset, &mut extended)?
            };
            if extended > 0 {
                self.summary.note_extended(offset, None);
            }
            match decoded {
                Decoded::Record(r) => return Ok(Some(r)),
                Decoded::Unknown { tag } => self.summary.note_unknown(offset, Some(tag)),
            }
        }
    }

    /// Whether every byte left is zero (consumed as read): a file's unwritten tail, not a
    /// damaged frame ([`Summary::zero_tail`]).
    fn zeros_to_end(&mut self) -> Result<bool, TraceError> {
        loop {
            let buf = match self.src.fill_buf() {
                Ok([]) => return Ok(true),
                Ok(buf) => buf,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return Err(TraceError::io(format!("reading at byte {}", self.summary.bytes_read), e)),
            };
            if buf.iter().any(|&b| b != 0) {
                return Ok(false);
            }
            let n = buf.len();
            self.src.consume(n);
            self.summary.bytes_read += n as u64;
        }
    }

    fn truncated(&mut self, complete: u64) -> Result<Option<Record>, TraceError> {
        self.summary.truncated = true;
        self.summary.complete_bytes = complete;
        Ok(None)
    }
}

impl<R: Read> Iterator for Reader<R> {
    type Item = Result<Record, TraceError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_record()
    }
}
