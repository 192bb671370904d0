//! Streaming conversion between the two forms (and re-encoding within one).

use std::path::Path;

use crate::error::TraceError;
use crate::read::{Reader, Summary};
use crate::write::TraceWriter;

/// Copies the trace at `input` (either form) to `output`, in the form its extension names,
/// record by record in constant memory. The output appears only when the copy is complete.
///
/// Returns the input's [`Summary`]: a truncated input still converts (its complete records are
/// kept) and says so there; frames of unknown kinds are dropped and counted.
pub fn convert(input: impl AsRef<Path>, output: impl AsRef<Path>) -> Result<Summary, TraceError> {
    let mut reader = Reader::open(input.as_ref())?;
    let mut writer = TraceWriter::create(output.as_ref(), reader.header())?;
    while let Some(rec) = reader.next_record() {
        writer.write(&rec?)?;
    }
    writer.finish()?;
    Ok(reader.summary())
}
