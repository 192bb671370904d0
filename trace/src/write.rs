//! Writers: binary, JSON Lines, and a file writer that picks the form from the extension.

use std::io::Write;
use std::path::{Path, PathBuf};

use tempfile::NamedTempFile;

use crate::codec::{self, PrefixState};
use crate::error::TraceError;
use crate::event::{KernelLaunch, Record};
use crate::header::{Header, FORMAT_VERSION};
use crate::jsonl;

/// Buffered bytes are handed to the sink once they pass this size: large enough that the sink
/// sees few calls, small enough to stay in L2.
const FLUSH_AT: usize = 64 * 1024;

/// The buffering both forms share: bytes collect in `buf` and reach the sink in batches, on
/// `flush`, and (errors ignored) on drop.
struct Buffered<W: Write> {
    out: Option<W>,
    buf: Vec<u8>,
    bytes: u64,
    events: u64,
    /// The form, for error messages ("writing binary trace").
    form: &'static str,
}

impl<W: Write> Buffered<W> {
    /// A buffer already holding `start` (preamble, header), which reaches the sink at once.
    fn new(
        out: W,
        start: impl FnOnce(&mut Vec<u8>) -> Result<(), TraceError>,
        form: &'static str,
    ) -> Result<Self, TraceError> {
        let mut buf = Vec::with_capacity(FLUSH_AT + 4096);
        start(&mut buf)?;
        let bytes = buf.len() as u64;
        let mut b = Buffered { out: Some(out), buf, bytes, events: 0, form };
        b.drain()?;
        Ok(b)
    }

    /// Counts the record appended after `before` and drains a full buffer.
    #[inline]
    fn appended(&mut self, before: usize) -> Result<(), TraceError> {
        self.bytes += (self.buf.len() - before) as u64;
        self.events += 1;
        if self.buf.len() >= FLUSH_AT {
            self.drain()?;
        }
        Ok(())
    }

    fn drain(&mut self) -> Result<(), TraceError> {
        if let Some(out) = self.out.as_mut() {
            if !self.buf.is_empty() {
                out.write_all(&self.buf).map_err(|e| TraceError::io(format!("writing {} trace", self.form), e))?;
                self.buf.clear();
            }
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), TraceError> {
        self.drain()?;
        if let Some(out) = self.out.as_mut() {
            out.flush().map_err(|e| TraceError::io(format!("flushing {} trace", self.form), e))?;
        }
        Ok(())
    }

    fn finish(mut self) -> Result<W, TraceError> {
        self.flush()?;
        Ok(self.out.take().expect("the sink is only taken by finish, which consumes the writer"))
    }

    fn get_ref(&self) -> &W {
        self.out.as_ref().expect("the sink is only taken by finish, which consumes the writer")
    }
}

impl<W: Write> Drop for Buffered<W> {
    fn drop(&mut self) {
        if let Some(out) = self.out.as_mut() {
            let _ = out.write_all(&self.buf);
            let _ = out.flush();
        }
    }
}

/// The methods both writers take from their [`Buffered`] sink: one definition for the two
/// forms.
macro_rules! buffered_methods {
    () => {
        /// Hands everything buffered to the sink and flushes it.
        pub fn flush(&mut self) -> Result<(), TraceError> {
            self.b.flush()
        }

        /// Flushes and returns the sink.
        pub fn finish(self) -> Result<W, TraceError> {
            self.b.finish()
        }

        /// Bytes of the trace so far (preamble and header included), buffered or not.
        pub fn bytes_written(&self) -> u64 {
            self.b.bytes
        }

        /// Records written so far.
        pub fn events_written(&self) -> u64 {
            self.b.events
        }
    };
}

/// Writes the binary form. Buffers internally; the preamble and header reach the sink at once
/// (so a process killed right after start still leaves a readable trace), events in 64 KiB
/// batches and on [`flush`](Self::flush). Dropping the writer flushes what is buffered, ignoring
/// errors; call [`finish`](Self::finish) to see them.
pub struct BinaryWriter<W: Write> {
    b: Buffered<W>,
    state: PrefixState,
}

impl<W: Write> BinaryWriter<W> {
    /// Writes the preamble and `header` (with `format_version` set to [`FORMAT_VERSION`]).
    pub fn new(out: W, header: &Header) -> Result<Self, TraceError> {
        let start = |buf: &mut Vec<u8>| {
            buf.extend_from_slice(&codec::preamble(FORMAT_VERSION, codec::native_flags()));
            codec::encode_header_frame(header, buf)
        };
        Ok(BinaryWriter { b: Buffered::new(out, start, "binary")?, state: PrefixState::default() })
    }

    /// Appends one record.
    #[inline]
    pub fn write(&mut self, rec: &Record) -> Result<(), TraceError> {
        let before = self.b.buf.len();
        codec::encode_frame(&mut self.state, rec, &mut self.b.buf)?;
        self.b.appended(before)
    }

    /// Appends a kernel launch: the same bytes as [`write`](Self::write) with a `Record` of
    /// `Event::KernelLaunch(launch)`, without building (and dropping) the record.
    #[inline(always)]
    pub fn write_launch(
        &mut self,
        ts_ns: Option<u64>,
        tid: Option<u32>,
        device: Option<u32>,
        launch: &KernelLaunch,
    ) -> Result<(), TraceError> {
        let before = self.b.buf.len();
        codec::encode_launch_frame(&mut self.state, ts_ns, tid, device, launch, &mut self.b.buf);
        self.b.appended(before)
    }

    buffered_methods!();

    /// The sink.
    pub fn get_ref(&self) -> &W {
        self.b.get_ref()
    }
}

/// Writes the JSON Lines form, with the same API and buffering as [`BinaryWriter`].
pub struct JsonlWriter<W: Write> {
    b: Buffered<W>,
}

impl<W: Write> JsonlWriter<W> {
    /// Writes the header line.
    pub fn new(out: W, header: &Header) -> Result<Self, TraceError> {
        Ok(JsonlWriter { b: Buffered::new(out, |buf| jsonl::write_header_line(header, buf), "JSON Lines")? })
    }

    /// Appends one record line.
    pub fn write(&mut self, rec: &Record) -> Result<(), TraceError> {
        let before = self.b.buf.len();
        jsonl::write_record_line(rec, &mut self.b.buf)?;
        self.b.appended(before)
    }

    buffered_methods!();
}

/// The two on-disk forms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `.mtrace`: the binary form.
    Binary,
    /// `.jsonl`: JSON Lines.
    Jsonl,
}

impl Format {
    /// The form named by a path's extension (`.mtrace` or `.jsonl`).
    pub fn from_path(path: &Path) -> Result<Format, TraceError> {
        // Case-insensitive, as the readers and `memsim convert`'s other outputs are.
        match path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase).as_deref() {
            Some("mtrace") => Ok(Format::Binary),
            Some("jsonl") => Ok(Format::Jsonl),
            _ => Err(TraceError::UnknownExtension { path: path.to_path_buf() }),
        }
    }

    /// The file extension, without the dot.
    pub fn extension(self) -> &'static str {
        match self {
            Format::Binary => "mtrace",
            Format::Jsonl => "jsonl",
        }
    }
}

enum Sink {
    Binary(BinaryWriter<NamedTempFile>),
    Jsonl(JsonlWriter<NamedTempFile>),
}

/// Writes a trace file in the form its extension names. Output goes to a temporary file in the
/// same directory, renamed over `path` by [`finish`](Self::finish); dropped without `finish`
/// (an error, a panic), it leaves no file behind.
pub struct TraceWriter {
    sink: Sink,
    path: PathBuf,
    /// Where the finished trace is renamed to: `path` through its links.
    target: PathBuf,
}

impl TraceWriter {
    /// Starts a trace at `path` (`.mtrace` or `.jsonl`).
    pub fn create(path: impl AsRef<Path>, header: &Header) -> Result<TraceWriter, TraceError> {
        let path = path.as_ref();
        let format = Format::from_path(path)?;
        Self::create_as(path, format, header)
    }

    /// Starts a trace at `path` in the given form, whatever the extension.
    pub fn create_as(path: impl AsRef<Path>, format: Format, header: &Header) -> Result<TraceWriter, TraceError> {
        let path = path.as_ref();
        let in_file = |e: TraceError| e.in_file(path);
        let target = crate::atomic::through_links(path);
        let tmp = crate::atomic::temp_beside(&target).map_err(|e| {
            let dir = path.parent().map_or_else(|| ".".into(), |d| d.display().to_string());
            in_file(TraceError::io(format!("creating a temporary file in {dir}"), e))
        })?;
        let sink = match format {
            Format::Binary => Sink::Binary(BinaryWriter::new(tmp, header).map_err(in_file)?),
            Format::Jsonl => Sink::Jsonl(JsonlWriter::new(tmp, header).map_err(in_file)?),
        };
        Ok(TraceWriter { sink, path: path.to_path_buf(), target })
    }

    /// Appends one record.
    pub fn write(&mut self, rec: &Record) -> Result<(), TraceError> {
        match &mut self.sink {
            Sink::Binary(w) => w.write(rec),
            Sink::Jsonl(w) => w.write(rec),
        }
        .map_err(|e| e.in_file(&self.path))
    }

    /// Flushes buffered records to the temporary file.
    pub fn flush(&mut self) -> Result<(), TraceError> {
        match &mut self.sink {
            Sink::Binary(w) => w.flush(),
            Sink::Jsonl(w) => w.flush(),
        }
        .map_err(|e| e.in_file(&self.path))
    }

    /// Flushes, syncs and renames the temporary file to the final path; returns that path.
    pub fn finish(self) -> Result<PathBuf, TraceError> {
        let (path, target) = (self.path, self.target);
        let tmp = match self.sink {
            Sink::Binary(w) => w.finish(),
            Sink::Jsonl(w) => w.finish(),
        }
        .map_err(|e| e.in_file(&path))?;
        tmp.as_file().sync_all().map_err(|e| TraceError::io("syncing the trace", e).in_file(&path))?;
        tmp.persist(&target)
            .map_err(|e| TraceError::io("renaming the finished trace into place", e.error).in_file(&path))?;
        Ok(path)
    }

    /// The final path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The form being written.
    pub fn format(&self) -> Format {
        match self.sink {
            Sink::Binary(_) => Format::Binary,
            Sink::Jsonl(_) => Format::Jsonl,
        }
    }

    /// Bytes of the trace so far.
    pub fn bytes_written(&self) -> u64 {
        match &self.sink {
            Sink::Binary(w) => w.bytes_written(),
            Sink::Jsonl(w) => w.bytes_written(),
        }
    }

    /// Records written so far.
    pub fn events_written(&self) -> u64 {
        match &self.sink {
            Sink::Binary(w) => w.events_written(),
            Sink::Jsonl(w) => w.events_written(),
        }
    }
}
