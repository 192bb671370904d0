//! Streaming conversion between the two forms (and re-encoding within one).

use std::path::Path;

use crate::error::TraceError;
use crate::read::{Reader, Summary};
use crate::write::TraceWriter;

/// Copies the trace at `input` (either form) to `output`, in the form its extension names,
/// record by record in constant memory. The output appears only when the copy is complete, and
/// `keep` accepts the input as read: refused, nothing is written and a file already at `output`
/// stays as it was.
///
/// Returns the input's [`Summary`] and whether `output` was written: a truncated input still
/// converts (its complete records are kept) and says so there; frames of unknown kinds are
/// dropped and counted.
pub fn convert(
    input: impl AsRef<Path>,
    output: impl AsRef<Path>,
    keep: impl FnOnce(&Summary) -> bool,
) -> Result<(Summary, bool), TraceError> {
    let mut reader = Reader::open(input.as_ref())?;
    let mut writer = TraceWriter::create(output.as_ref(), reader.header())?;
    while let Some(rec) = reader.next_record() {
        writer.write(&rec?)?;
    }
    let summary = reader.summary();
    // Dropped unfinished, the writer removes its temporary file.
    let kept = keep(&summary);
    if kept {
        writer.finish()?;
    }
    Ok((summary, kept))
}
