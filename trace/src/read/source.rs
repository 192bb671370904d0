//! Where a reader's bytes come from (a mapped file or a buffered stream), and which form of
//! trace they hold.

use std::io::{self, BufRead, BufReader, ErrorKind, Read};

use crate::codec;
use crate::error::TraceError;
use crate::write::Format;

pub(super) const READ_BUFFER: usize = 256 * 1024;

/// Where a reader's bytes come from: a file mapped into memory (read in place, no copy and no
/// read call per buffer), or any byte stream through a buffer (pipes, stdin, sockets, files
/// that cannot be mapped).
pub(super) enum Source<R> {
    Stream(BufReader<R>),
    /// `released`: the bytes before it were read and handed back to the kernel, so that the
    /// reader's resident memory stays bounded however large the file.
    Mapped {
        map: memmap2::Mmap,
        pos: usize,
        released: usize,
    },
}

/// A mapped file's bytes are handed back (`MADV_DONTNEED`) in steps of this much once read.
const RELEASE_STEP: usize = 8 << 20;

impl<R: Read> Source<R> {
    /// The bytes available without reading: the rest of a mapped file, or the buffer.
    #[inline(always)]
    pub(super) fn buffer(&self) -> &[u8] {
        match self {
            Source::Stream(b) => b.buffer(),
            Source::Mapped { map, pos, .. } => &map[*pos..],
        }
    }
}

impl<R: Read> Read for Source<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Source::Stream(b) => b.read(buf),
            Source::Mapped { map, pos, .. } => {
                let n = (&map[*pos..]).read(buf)?;
                self.consume(n);
                Ok(n)
            }
        }
    }
}

impl<R: Read> BufRead for Source<R> {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        match self {
            Source::Stream(b) => b.fill_buf(),
            Source::Mapped { map, pos, .. } => Ok(&map[*pos..]),
        }
    }

    #[inline(always)]
    fn consume(&mut self, n: usize) {
        match self {
            Source::Stream(b) => b.consume(n),
            Source::Mapped { map, pos, released } => {
                *pos = (*pos + n).min(map.len());
                if *pos - *released >= RELEASE_STEP {
                    let end = *pos / RELEASE_STEP * RELEASE_STEP;
                    // Safety: a read-only shared file mapping: dropping its pages loses nothing
                    // (a later access would read them from the file again), and no slice of
                    // the range is borrowed: it lies before `pos`, and every record decoded
                    // from it owns its data.
                    let _ = unsafe {
                        map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, *released, end - *released)
                    };
                    *released = end;
                }
            }
        }
    }
}

/// Peeks at the first bytes. Returns the form, the leading blank bytes consumed (JSON Lines only)
/// and how many newlines they held.
pub(super) fn detect<R: Read>(src: &mut Source<R>) -> Result<(Format, u64, u64), TraceError> {
    let mut skipped = 0u64;
    let mut newlines = 0u64;
    loop {
        let buf = match src.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(TraceError::io("reading the start of the trace", e)),
        };
        if buf.is_empty() {
            return Err(TraceError::PartialHeader { offset: skipped, what: "the first bytes (the input is empty)" });
        }
        if skipped == 0 && buf[0] == codec::MAGIC[0] {
            return Ok((Format::Binary, 0, 0));
        }
        match buf.iter().position(|b| !b.is_ascii_whitespace()) {
            Some(i) if buf[i] == b'{' => {
                newlines += buf[..i].iter().filter(|&&b| b == b'\n').count() as u64;
                src.consume(i);
                return Ok((Format::Jsonl, skipped + i as u64, newlines));
            }
            Some(i) => {
                let end = (i + 16).min(buf.len());
                return Err(TraceError::BadMagic { found: buf[i..end].to_vec() });
            }
            None => {
                let n = buf.len();
                newlines += buf.iter().filter(|&&b| b == b'\n').count() as u64;
                src.consume(n);
                skipped += n as u64;
            }
        }
    }
}
