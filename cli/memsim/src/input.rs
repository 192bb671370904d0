//! Opening inputs: native and JSON Lines traces through the trace crate, snapshot pickles through
//! the snapshot importer; a progress bar on a terminal for long traces.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use simulator::alloc::TorchVersion;
use simulator::snapshot::Caveats;
use trace::{Header, MapRecord, Record};

/// Input kinds by extension.
pub enum Kind {
    /// `.mtrace` or `.jsonl`.
    Trace,
    /// `.pickle` / `.pkl` PyTorch memory snapshot.
    Snapshot,
}

/// Classify a path by extension; unknown extensions are an error naming them. Standard input
/// (`-`) and other streams (a pipe, `/dev/stdin`, a shell's `<(...)`) are traces whatever their
/// name: the trace reader tells the native form from JSON Lines by the first bytes, and a
/// snapshot pickle, read whole and by name, must be a file.
pub fn kind(path: &Path) -> Result<Kind> {
    match path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase).as_deref() {
        Some("mtrace") | Some("jsonl") => Ok(Kind::Trace),
        Some("pickle") | Some("pkl") => Ok(Kind::Snapshot),
        _ if streamed(path) => Ok(Kind::Trace),
        _ => bail!(
            "{}: unknown input format: expected .mtrace (native trace), .jsonl (JSON Lines trace), \
             .pickle/.pkl (PyTorch memory snapshot), or `-` for a trace on standard input",
            path.display()
        ),
    }
}

/// Standard input, `-` on the command line, is opened by this name.
const STDIN: &str = "/dev/stdin";

/// The path to open for an input named `path` on the command line.
pub fn source(path: &Path) -> &Path {
    if path == Path::new("-") {
        Path::new(STDIN)
    } else {
        path
    }
}

/// Standard input, or a path that is neither a file nor a folder (a pipe, a character device).
pub fn streamed(path: &Path) -> bool {
    path == Path::new("-") || std::fs::metadata(path).is_ok_and(|m| !m.is_file() && !m.is_dir())
}

/// How an error or warning names an input: `-` as standard input, not the path it is opened by.
pub fn shown(path: &Path) -> String {
    if path == Path::new("-") {
        "- (standard input)".into()
    } else {
        path.display().to_string()
    }
}

/// `e` with the path an input was opened by (`/dev/stdin`, a spooled copy) named as the user
/// named it. Only an error that says the opened path is rewritten, so one whose chain a caller
/// inspects (a closed pipe) keeps its causes.
pub fn renamed(e: anyhow::Error, opened: &Path, named: &Path) -> anyhow::Error {
    let text = crate::exit::chain_text(&e);
    match renamed_text(&text, opened, named) {
        Some(text) => anyhow::anyhow!(text),
        None => e,
    }
}

/// `text` (an error's chain, a warning) with the path an input was opened by named as the user
/// named it ([`shown`]); `None` where it does not say the opened path.
pub fn renamed_text(text: &str, opened: &Path, named: &Path) -> Option<String> {
    let opened = opened.display().to_string();
    if opened == named.display().to_string() || !text.contains(&opened) {
        return None;
    }
    Some(text.replace(&opened, &shown(named)))
}

/// How a spooled copy's name starts: an error found in the copy is about a stream, not a file
/// the user named (a pickle there is to be given as a file, not renamed).
const SPOOL_PREFIX: &str = ".memsim-stream-";

/// Whether `path` is a stream, or [`spooled`]'s copy of one.
fn from_stream(path: &Path) -> bool {
    streamed(path)
        || (path.parent() == Some(std::env::temp_dir().as_path())
            && path.file_name().is_some_and(|n| n.to_string_lossy().starts_with(SPOOL_PREFIX)))
}

/// A streamed input (`-`, a pipe) copied once into a temporary file, for a command that reads
/// its input more than once (`report`: the page, then each profile's verdict); `None` for a file.
pub fn spooled(path: &Path) -> Result<Option<tempfile::NamedTempFile>> {
    if !streamed(path) {
        return Ok(None);
    }
    // The reader tells the native form from JSON Lines by the first bytes, not the name.
    let mut tmp = tempfile::Builder::new()
        .prefix(SPOOL_PREFIX)
        .suffix(".mtrace")
        .tempfile()
        .context("creating a temporary file")?;
    let mut input = std::fs::File::open(source(path)).with_context(|| format!("{}: cannot open", shown(path)))?;
    std::io::copy(&mut input, tmp.as_file_mut()).with_context(|| format!("{}: reading it", shown(path)))?;
    Ok(Some(tmp))
}

/// Standard input can be read once: `-` named twice is an error.
pub fn stdin_once(paths: &[PathBuf]) -> Result<()> {
    if paths.iter().filter(|p| p.as_path() == Path::new("-")).count() > 1 {
        bail!("`-` (standard input) is named more than once: it can be read only once; save it to a file to read it twice");
    }
    Ok(())
}

/// An error naming `path` when there is nothing to read there.
pub fn exists(path: &Path) -> Result<()> {
    if !source(path).exists() {
        bail!("{}: no such file", path.display());
    }
    Ok(())
}

/// What [`for_each_record`] read.
pub struct Read<S> {
    /// The trace header.
    pub header: Header,
    /// The state built by the callbacks.
    pub state: S,
    /// What the trace reader saw (`None` for a snapshot, which is read whole or not at all).
    pub summary: Option<trace::Summary>,
}

impl<S> Read<S> {
    /// What the input did not give whole, as warning lines naming the file: an input that does
    /// not hold the whole run (truncated, cut short, stopped at the producer's byte limit, events
    /// the producer lost, a snapshot that records no allocator event) or with skipped records of
    /// unknown kinds (with `strict`, an error instead: exit 2), records naming APIs this version
    /// does not know (read: a warning only, strict or not), header metadata values outside their
    /// key's domain, which are ignored, and what a snapshot's replay cannot show (its caveats,
    /// which the trace a snapshot converts to carries in its header: [`Caveats`]).
    pub fn warnings(&self, path: &Path, strict: bool) -> Result<Vec<String>> {
        input_warnings(&self.header, self.summary.as_ref(), path, strict)
    }
}

/// [`Read::warnings`] of an input read elsewhere (memest's traces): the lines
/// [`simulator::snapshot::input_warnings`] says (the reader's, the header's metadata, a
/// snapshot's caveats), `strict` refusing what [`summary_warnings`] refuses and a state-only
/// snapshot as well. The one `--strict` rule of every command.
pub fn input_warnings(
    header: &Header,
    summary: Option<&trace::Summary>,
    path: &Path,
    strict: bool,
) -> Result<Vec<String>> {
    // Warnings name standard input as errors do.
    let named = PathBuf::from(shown(path));
    let path = named.as_path();
    summary_warnings(summary, path, strict)?;
    let caveats = Caveats::of(header);
    if strict && caveats.state_only {
        bail!(
            "{}: the snapshot records no allocator events, only its segments when it was dumped: it does not \
             hold the run, and its peaks are only the state at dump time (--strict)",
            path.display()
        );
    }
    if strict && caveats.unknown_actions > 0 {
        // The caveat lines name the actions and where the first is (the snapshot the input was
        // converted from, for a trace).
        bail!(
            "{}: trace entries of actions this version does not know ({}) were left out of the replay (--strict): {}",
            path.display(),
            caveats.unknown_actions,
            caveats.lines.join("; ")
        );
    }
    Ok(simulator::snapshot::input_warnings(header, summary, path))
}

/// `--strict`'s help, in every command that reads a trace (memsim's and `memest estimate`): the
/// inputs [`input_warnings`] refuses under it, in one place.
pub const STRICT_HELP: &str = "An input that does not hold the whole run is an error (exit 2, no output written) \
instead of a warning: truncated or cut short (no process_exit where its producer writes one), stopped at its \
producer's byte limit (MEMTRACE_MAX_BYTES) or for want of queue memory, with events its producer lost or CUPTI \
records it could not deliver, with records of kinds this version does not know or fields it does not read (a \
newer writer's), or a snapshot that records no allocator event or holds trace entries of actions this version does \
not know (converted to a trace or not). Records naming APIs \
this version does not know stay a warning.";

/// [`trace::Summary::warnings`], with `strict` turning an input that does not hold the whole run
/// ([`trace::Summary::incomplete`]: truncated, cut short, stopped at the producer's byte limit, or
/// with events the producer lost) or that holds records of kinds this version skips
/// ([`trace::Summary::unknown_skipped`]) or fields it does not read
/// ([`trace::Summary::unread_fields`]) into an error naming the first such reason.
pub fn summary_warnings(summary: Option<&trace::Summary>, path: &Path, strict: bool) -> Result<Vec<String>> {
    let Some(s) = summary else { return Ok(Vec::new()) };
    let lines = s.warnings(path);
    if strict && (s.incomplete() || s.unknown_skipped > 0 || s.unread_fields()) {
        bail!("{} (--strict)", lines[0]);
    }
    Ok(lines)
}

/// Print warning lines on stderr.
pub fn warn(lines: &[String]) {
    for l in lines {
        eprintln!("memsim: warning: {}", crate::exit::printable(l));
    }
}

/// Stream every record of an input through `f`, with state made from the header by `init`; a
/// progress bar on a terminal for large files.
pub fn for_each_record<S>(
    path: &Path,
    init: impl FnOnce(&Header) -> Result<S>,
    mut f: impl FnMut(&mut S, &Record) -> Result<()>,
) -> Result<Read<S>> {
    let each = move |s: &mut S, records: &[Record]| records.iter().try_for_each(|r| f(s, r));
    read(path, &SnapshotAs::default(), |h, _| init(h), |_| |r: Record| r, each, Drops::OnConsumer)
}

/// How a snapshot input is imported: under the allocator version and configuration the replay
/// follows (`--torch`, `--alloc-conf`), so that its start state is rebuilt under them, as
/// `memsim validate` rebuilds it. `version: None`: the release the snapshot was most likely
/// written with ([`simulator::snapshot::guess_version`]).
#[derive(Debug, Clone, Default)]
pub struct SnapshotAs {
    pub version: Option<TorchVersion>,
    pub alloc_conf: Option<String>,
}

/// [`for_each_record`], with each record first turned into an item by a mapper that `mapper`
/// makes from the state. For a large file the mapper runs on the decoding thread, so work that
/// needs only the record (sorting it for a replay) leaves the consuming thread.
/// A snapshot is imported as `snapshot` says; `init` gets the allocator version it was imported
/// under (`None` for a trace). `f` takes the items a run at a time (a decoded batch of a trace,
/// on either path; a snapshot's records one at a time), so that its per-item loop is its own and
/// a call per item does not save and restore the consumer's registers.
pub fn for_each_mapped<S, T: Send, M: MapRecord<T> + Send>(
    path: &Path,
    snapshot: &SnapshotAs,
    init: impl FnOnce(&Header, Option<TorchVersion>) -> Result<S>,
    mapper: impl FnOnce(&S) -> M,
    f: impl FnMut(&mut S, &[T]) -> Result<()>,
) -> Result<Read<S>> {
    read(path, snapshot, init, mapper, f, Drops::OnDecoder)
}

/// Which thread drops the items of a batch (dropping a batch of records walks every one) when
/// the input is decoded on a second thread: the one with less to do. A mapped read feeds a
/// replay, which takes longer than decoding; a plain read feeds counting, which takes less.
#[derive(Clone, Copy, PartialEq)]
enum Drops {
    OnDecoder,
    OnConsumer,
}

fn read<S, T: Send, M: MapRecord<T> + Send>(
    path: &Path,
    snapshot: &SnapshotAs,
    init: impl FnOnce(&Header, Option<TorchVersion>) -> Result<S>,
    mapper: impl FnOnce(&S) -> M,
    mut f: impl FnMut(&mut S, &[T]) -> Result<()>,
    drops: Drops,
) -> Result<Read<S>> {
    exists(path)?;
    let kind = kind(path)?;
    let named = path;
    let path = source(path);
    match kind {
        Kind::Snapshot => {
            let imported = import_snapshot_as(path, snapshot)?;
            let mut state = init(&imported.header, Some(imported.version))?;
            let mut map = mapper(&state);
            for r in imported.records {
                f(&mut state, std::slice::from_ref(&map.record(r)))?;
            }
            Ok(Read { header: imported.header, state, summary: None })
        }
        Kind::Trace => read_trace(named, path, init, mapper, f, drops).map_err(|e| renamed(e, path, named)),
    }
}

fn read_trace<S, T: Send, M: MapRecord<T> + Send>(
    named: &Path,
    path: &Path,
    init: impl FnOnce(&Header, Option<TorchVersion>) -> Result<S>,
    mapper: impl FnOnce(&S) -> M,
    mut f: impl FnMut(&mut S, &[T]) -> Result<()>,
    drops: Drops,
) -> Result<Read<S>> {
    let mut reader = trace::Reader::open(path).map_err(|e| {
        // A pickle's protocol byte: a snapshot, which is read by its name's extension.
        let pickle = matches!(e.innermost(), trace::TraceError::BadMagic { found } if found.first() == Some(&0x80));
        let e = anyhow::Error::from(e);
        if !pickle {
            e
        } else if from_stream(named) {
            e.context("this looks like a PyTorch snapshot pickle: give it as a .pickle/.pkl file, not a stream")
        } else {
            let ext = named.extension().map(|x| x.to_string_lossy()).unwrap_or_default();
            e.context(format!(
                "this looks like a PyTorch snapshot pickle named .{ext}: name it .pickle or .pkl (memsim reads \
                         a snapshot by its extension)"
            ))
        }
    })?;
    let header = reader.header().clone();
    let mut state = init(&header, None)?;
    // A stream's size is unknown: decoded on a second thread as a large file is.
    let size = std::fs::metadata(path).ok().filter(|m| m.is_file()).map(|m| m.len());
    let bar = progress(size.unwrap_or(0));
    {
        let mut map = mapper(&state);
        if BATCH.load(Ordering::Relaxed) || size.is_some_and(|s| s < PIPELINE_FROM) {
            // A batch at a time here too: the reader's buffered fast path and one call
            // of `f` per batch (a record at a time cost 28% more CPU time on the
            // benchmark trace, which `batch` pays on every core).
            let mut batch = Vec::with_capacity(BATCH_RECORDS);
            let mut n = 0u64;
            loop {
                batch.clear();
                let more = reader.next_records_with(&mut batch, BATCH_RECORDS, &mut map);
                f(&mut state, &batch)?;
                n += batch.len() as u64;
                // The reader's errors name the file and the line or byte already.
                if !more.with_context(|| format!("after {n} whole records"))? {
                    break;
                }
                if let Some(b) = &bar {
                    b.set_position(reader.summary().bytes_read);
                }
            }
        } else {
            pipelined(&mut reader, &mut state, map, &mut f, bar.as_ref(), drops)?;
        }
    }
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    Ok(Read { header, state, summary: Some(reader.summary()) })
}

/// Files from this size on are decoded on a second thread while the caller's thread consumes.
const PIPELINE_FROM: u64 = 1 << 20;
/// Records per batch handed from the decoding thread.
const BATCH_RECORDS: usize = 4096;

/// Decoding (and `map`) on one thread, `f` on this one: batches of items go through a bounded
/// channel and come back empty to be refilled, so nothing is allocated per batch after the
/// first few. The items reach `f` in file order; the first error (decoding or `f`'s) stops both.
fn pipelined<S, T: Send>(
    reader: &mut trace::Reader<std::fs::File>,
    state: &mut S,
    mut map: impl MapRecord<T> + Send,
    f: &mut impl FnMut(&mut S, &[T]) -> Result<()>,
    bar: Option<&ProgressBar>,
    drops: Drops,
) -> Result<()> {
    type Batch<T> = (Vec<T>, Option<trace::TraceError>, u64);
    let (full_tx, full_rx) = std::sync::mpsc::sync_channel::<Batch<T>>(4);
    let (empty_tx, empty_rx) = std::sync::mpsc::channel::<Vec<T>>();
    std::thread::scope(|scope| -> Result<()> {
        scope.spawn(move || loop {
            let mut batch = empty_rx.try_recv().unwrap_or_else(|_| Vec::with_capacity(BATCH_RECORDS));
            // Empty already when the consumer drops (see `Drops`).
            batch.clear();
            let error = reader.next_records_with(&mut batch, BATCH_RECORDS, &mut map).err();
            let last = batch.len() < BATCH_RECORDS || error.is_some();
            // The consumer hung up (an error in `f`): stop.
            if full_tx.send((batch, error, reader.summary().bytes_read)).is_err() || last {
                return;
            }
        });
        let mut n = 0u64;
        for (mut batch, error, bytes) in full_rx {
            f(state, &batch)?;
            n += batch.len() as u64;
            if let Some(e) = error {
                return Err(anyhow::Error::new(e).context(format!("after {n} whole records")));
            }
            if let Some(b) = bar {
                b.set_position(bytes);
            }
            if drops == Drops::OnConsumer {
                batch.clear();
            }
            let _ = empty_tx.send(batch);
        }
        Ok(())
    })
}

/// Whether many inputs are read at once (`batch`): then one thread per input (rayon's) and no
/// per-input progress bar.
static BATCH: AtomicBool = AtomicBool::new(false);

/// Marks the command as reading many inputs at once.
pub fn set_batch(on: bool) {
    BATCH.store(on, Ordering::Relaxed);
}

fn progress(size: u64) -> Option<ProgressBar> {
    // Only for large inputs (a batch has its own bar).
    if size < 64 << 20 || BATCH.load(Ordering::Relaxed) {
        return None;
    }
    bar(size, "{spinner} {bytes}/{total_bytes} {wide_bar} {eta}")
}

/// A progress bar of `len` steps drawn by `template` on stderr, only when a person is watching.
pub fn bar(len: u64, template: &str) -> Option<ProgressBar> {
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let b = ProgressBar::new(len);
    b.set_style(ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar()));
    Some(b)
}

/// A snapshot pickle imported as an allocator-level trace (with its rebuilt start state); its
/// header carries its caveats.
struct Imported {
    header: Header,
    records: Vec<Record>,
    /// The allocator release whose rules it was imported under.
    version: TorchVersion,
}

/// Read a snapshot pickle and import it under the version and configuration `how` gives (by
/// default the release it was most likely written with).
fn import_snapshot_as(path: &Path, how: &SnapshotAs) -> Result<Imported> {
    let snap = simulator::snapshot::read_snapshot(path)?;
    let version = how.version.unwrap_or_else(|| simulator::snapshot::guess_version(&snap));
    let imported = simulator::snapshot::import_snapshot(&snap, Some(version), how.alloc_conf.as_deref())
        .with_context(|| format!("{}: cannot import snapshot", path.display()))?;
    Ok(Imported { header: imported.header, records: imported.records, version })
}

/// Refuses an output that is the input file.
pub fn distinct_output(input: &Path, output: &Path) -> Result<()> {
    if trace::same_file(input, output) {
        bail!(
            "{}: the output is the input file {}: give another path (writing it would destroy the input)",
            output.display(),
            input.display()
        );
    }
    Ok(())
}
