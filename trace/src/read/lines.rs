//! The JSON Lines form's reading: a line at a time into the reader's scratch buffer, the
//! header line, then records, each through serde's derived reader when it takes the line, else
//! the line reader, which knows unknown kinds and names the failing field.

use std::io::{BufRead, Read};

use super::{Form, Reader};
use crate::codec::MAX_FRAME_LEN;
use crate::error::TraceError;
use crate::event::{Event, Record};
use crate::header::Header;
use crate::jsonl;

impl<R: Read> Reader<R> {
    /// Reads one line into `scratch`; `Ok(None)` at the end. Returns whether it ended in '\n'.
    fn read_line(&mut self) -> Result<Option<bool>, TraceError> {
        self.scratch.clear();
        let n = (&mut self.src)
            .take(MAX_FRAME_LEN + 1)
            .read_until(b'\n', &mut self.scratch)
            .map_err(|e| TraceError::io(format!("reading a line at byte {}", self.summary.bytes_read), e))?;
        if n == 0 {
            return Ok(None);
        }
        self.summary.bytes_read += n as u64;
        let Form::Jsonl { line } = &mut self.form else { unreachable!("read_line on a binary reader") };
        *line += 1;
        if n as u64 > MAX_FRAME_LEN {
            return Err(TraceError::Json {
                line: *line,
                field: None,
                message: format!("line longer than {MAX_FRAME_LEN} bytes: not a trace record"),
            });
        }
        Ok(Some(self.scratch.last() == Some(&b'\n')))
    }

    fn line_no(&self) -> u64 {
        match self.form {
            Form::Jsonl { line } => line,
            Form::Binary { .. } => 0,
        }
    }

    pub(super) fn read_jsonl_header(&mut self) -> Result<Header, TraceError> {
        loop {
            let Some(complete) = self.read_line()? else {
                return Err(TraceError::PartialHeader {
                    offset: self.summary.bytes_read,
                    what: "the JSON Lines header line",
                });
            };
            if self.scratch.trim_ascii().is_empty() {
                continue;
            }
            let line = self.line_no();
            let text = self.scratch.trim_ascii();
            self.summary.header_unread_key = jsonl::header_unread_key(text);
            self.summary.extended_header = self.summary.header_unread_key.is_some();
            return match jsonl::parse_header_line(text, line) {
                // Old Mac line endings: the whole input reads as one line that is no JSON.
                Err(_) if !complete && text.contains(&b'\r') => Err(TraceError::Json {
                    line,
                    field: None,
                    message: "its lines end with a bare carriage return (\\r): JSON Lines ends each line with \\n \
                              (or \\r\\n)"
                        .into(),
                }),
                // Only a line that is not even complete JSON was cut short.
                Err(_) if !complete && serde_json::from_slice::<serde::de::IgnoredAny>(text).is_err() => {
                    Err(TraceError::PartialHeader {
                        offset: self.summary.bytes_read,
                        what: "the JSON Lines header line",
                    })
                }
                r => r,
            };
        }
    }

    /// Counts the line just read if it holds a key `event` does not read, naming the first.
    fn note_unread_key(&mut self, event: &Event) {
        if let Some(key) = jsonl::unread_key(self.scratch.trim_ascii(), event) {
            let line = self.line_no();
            self.summary.note_extended(line, Some(key));
        }
    }

    pub(super) fn next_jsonl(&mut self) -> Result<Option<Record>, TraceError> {
        loop {
            let Some(complete) = self.read_line()? else { return Ok(None) };
            let text = self.scratch.trim_ascii();
            if text.is_empty() {
                continue;
            }
            // Fast path: one pass through the derived serde impl (property-tested to agree with
            // the line reader). Anything it rejects goes through the line reader, which knows
            // unknown kinds and names the failing field.
            if let Ok(r) = serde_json::from_slice::<Record>(text) {
                // Lines as the writers write them open with their string tag; a control line
                // has a second tag.
                let plain = text.starts_with(br#"{"kind":""#) && !matches!(r.event, Event::Control(_));
                if plain || jsonl::tags_are_strings(text) {
                    self.note_unread_key(&r.event);
                    return Ok(Some(r));
                }
            }
            match jsonl::parse_record_line(text, self.line_no()) {
                Ok(Some(r)) => {
                    self.note_unread_key(&r.event);
                    return Ok(Some(r));
                }
                Ok(None) => {
                    let line = self.line_no();
                    self.summary.note_unknown(line, None);
                }
                // A last line without its newline that does not parse: the writer was cut short.
                Err(_) if !complete && serde_json::from_slice::<serde::de::IgnoredAny>(text).is_err() => {
                    let start = self.summary.bytes_read - self.scratch.len() as u64;
                    return self.truncated(start);
                }
                Err(e) => return Err(e),
            }
        }
    }
}
