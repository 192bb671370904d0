//! The memtrace trace format: the only code that knows the bytes on disk.
//!
//! A trace is a [`Header`] followed by a stream of [`Record`]s. Two encodings carry the same
//! information loss-free:
//! - the binary form (`.mtrace`), length-framed with pinned tag bytes; see `FORMAT.md`;
//! - JSON Lines (`.jsonl`), one object per line, the header first; see `schema/`.
//!
//! ```
//! use trace::{Header, Level, Record, Event, Alloc, Api, Origin, MemoryKind};
//! let mut out = Vec::new();
//! let mut w = trace::BinaryWriter::new(&mut out, &Header::new("doc", "0", Level::Allocator)).unwrap();
//! w.write(&Record::bare(Event::Alloc(Alloc {
//!     addr: 0x7f00_0000_0000, size: 4096, stream: 0, mem: MemoryKind::Device, api: Api::Allocator,
//!     result: 0, origin: Origin::Request, category: None, caller: None, stack: None,
//! }))).unwrap();
//! w.finish().unwrap();
//! let mut r = trace::open_reader(&out[..]).unwrap();
//! let rec = r.next_record().unwrap().unwrap();
//! assert!(matches!(rec.event, Event::Alloc(ref a) if a.size == 4096));
//! ```
#![warn(missing_docs)]

pub mod api;
pub mod atomic;
pub mod codec;
pub mod error;
pub mod event;
mod fastframe;
mod fastread;
pub mod header;
pub mod jsonl;
pub mod marker;
pub mod metadata;
mod prefix;
mod read;
pub mod small;
pub mod terminal;
pub mod units;
mod write;

pub use api::Api;
pub use atomic::{same_file, write_atomic, write_bytes_atomic};
pub use error::TraceError;
pub use event::*;
pub use header::{DeviceInfo, Header, Level, Producer, ALLOCATOR_ENV_VARS, FORMAT_VERSION};
pub use read::{open_reader, KeyName, MapRecord, Reader, Summary};
pub use small::{read_small, read_small_string};
pub use write::{BinaryWriter, Format, JsonlWriter, TraceWriter};
