//! Typed snapshot: the fields of `torch.cuda.memory._snapshot()` that memsim uses, read from a
//! decoded [`Pickle`]. Field names follow `torch/cuda/memory.py`.
//!
//! Frame lists are interned into [`Snapshot::stacks`] by pickle object identity, so a frame list
//! shared by many blocks and trace entries (through the memo) is stored once.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use trace::{BlockState, Frame, SegmentPool};

use super::pickle::{self, Pickle, PickleValue, ValueId};
use super::SnapshotError;

/// Index into [`Snapshot::stacks`].
pub type StackRef = u32;

/// The snapshot key under which memsim keeps a trace header's metadata on export.
pub const MEMTRACE_HEADER: &str = "memtrace_header";

/// A whole snapshot.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    /// Segments at dump time, as listed (sorted by address in real files).
    pub segments: Vec<Segment>,
    /// Per-device trace entries, indexed by device.
    pub device_traces: Vec<Vec<TraceEntry>>,
    /// `allocator_settings`, when present.
    pub allocator_settings: Option<serde_json::Value>,
    /// `external_annotations`, when present (kept for export only).
    pub external_annotations: Option<serde_json::Value>,
    /// `memtrace_header`: what a snapshot memsim exported from a trace keeps of its header (the
    /// metadata, whether its addresses were synthetic), so that a symbolic trace does not come
    /// back as a real run's. PyTorch's readers ignore the key.
    pub memtrace_header: Option<serde_json::Value>,
    /// Interned frame lists; [`StackRef`] indexes this. An empty list is a stack too: PyTorch
    /// writes `[]` where it has no frames, and leaves the key out (or writes None) elsewhere.
    pub stacks: Vec<Vec<Frame>>,
    /// True for the old `torch.cuda.memory_snapshot()` form: a bare list of segments.
    pub list_form: bool,
    /// Trace entries a replay leaves out, by their `action`: PyTorch's `annotate` (metadata
    /// attached to a live allocation, no memory change) and actions this version does not know
    /// (a newer PyTorch's). They stay in `device_traces` as [`Action::Annotate`] and
    /// [`Action::Unknown`]; said as caveats ([`super::Caveats`]), never in silence.
    pub skipped: BTreeMap<String, Skipped>,
    /// Replayed entries the allocator's internals tagged (`internal_metadata`, PyTorch 2.15 on),
    /// by tag: `mallocWithAddress` marks a block placed where its caller chose, which memsim's
    /// best fit does not follow. Said as caveats, like [`Snapshot::skipped`].
    pub tagged: BTreeMap<String, Skipped>,
}

/// The last component of a file's path, as a caveat names the snapshot it comes from.
fn file_name(path: &str) -> &str {
    Path::new(path).file_name().and_then(|n| n.to_str()).unwrap_or(path)
}

/// Trace entries of one action (or tag) that a replay left out (or cannot follow).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    /// How many.
    pub count: usize,
    /// Where the first one is (`device_traces[D][I] of FILE`).
    pub first: String,
}

/// The action of `torch.cuda.memory._annotate_tensor` (PyTorch 2.15 on): metadata only.
pub const ANNOTATE: &str = "annotate";

/// The `internal_metadata` of an entry PyTorch's `allocateWithAddress` placed, and of the
/// synthetic prefix block's malloc/free pair recorded beside it (PyTorch 2.15 on).
pub const MALLOC_WITH_ADDRESS: &str = "mallocWithAddress";

/// One segment.
#[derive(Debug, Clone, PartialEq)]
pub struct Segment {
    /// Device ordinal.
    pub device: u32,
    /// Base address.
    pub address: u64,
    /// Size.
    pub total_size: u64,
    /// Bytes in allocated blocks.
    pub allocated_size: u64,
    /// Bytes in active blocks (allocated or pending free).
    pub active_size: u64,
    /// Requested bytes of allocated blocks.
    pub requested_size: u64,
    /// Stream.
    pub stream: i64,
    /// Pool (`segment_type`).
    pub pool: SegmentPool,
    /// `segment_pool_id`.
    pub pool_id: (i64, i64),
    /// `is_expandable`.
    pub is_expandable: bool,
    /// Frames of the allocation that created it.
    pub frames: Option<StackRef>,
    /// Blocks, in address order.
    pub blocks: Vec<Block>,
}

/// One block.
#[derive(Debug, Clone, PartialEq)]
pub struct Block {
    /// Address.
    pub address: u64,
    /// Size (rounded).
    pub size: u64,
    /// Requested size.
    pub requested_size: u64,
    /// State.
    pub state: BlockState,
    /// Frames of the allocation.
    pub frames: Option<StackRef>,
}

/// A trace entry's `action`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Action {
    /// `alloc`.
    Alloc,
    /// `free_requested`.
    FreeRequested,
    /// `free_completed`.
    FreeCompleted,
    /// `segment_alloc`.
    SegmentAlloc,
    /// `segment_free`.
    SegmentFree,
    /// `segment_map`.
    SegmentMap,
    /// `segment_unmap`.
    SegmentUnmap,
    /// `oom`.
    Oom,
    /// `snapshot`.
    Snapshot,
    /// `annotate`: metadata attached to a live allocation (PyTorch 2.15 on); no memory change.
    /// Kept in place, so that every entry keeps its index, and left out of every replay.
    Annotate,
    /// An action this version does not know (its name is in [`Snapshot::skipped`]); likewise.
    Unknown,
}

impl Action {
    /// Every action, in the order memsim reports counts.
    pub const ALL: [Action; 9] = [
        Action::Alloc,
        Action::FreeRequested,
        Action::FreeCompleted,
        Action::SegmentAlloc,
        Action::SegmentFree,
        Action::SegmentMap,
        Action::SegmentUnmap,
        Action::Oom,
        Action::Snapshot,
    ];

    /// The spelling in the pickle.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Alloc => "alloc",
            Action::FreeRequested => "free_requested",
            Action::FreeCompleted => "free_completed",
            Action::SegmentAlloc => "segment_alloc",
            Action::SegmentFree => "segment_free",
            Action::SegmentMap => "segment_map",
            Action::SegmentUnmap => "segment_unmap",
            Action::Oom => "oom",
            Action::Snapshot => "snapshot",
            Action::Annotate => ANNOTATE,
            Action::Unknown => "(unknown)",
        }
    }

    /// Whether a replay leaves entries of this action out ([`Snapshot::skipped`]).
    pub fn left_out(self) -> bool {
        matches!(self, Action::Annotate | Action::Unknown)
    }

    /// The action spelled `s`, of those a replay reads.
    pub fn parse(s: &str) -> Option<Action> {
        Action::ALL.into_iter().find(|a| a.as_str() == s)
    }
}

/// One trace entry.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceEntry {
    /// What happened.
    pub action: Action,
    /// Address (0 for `oom` and `snapshot`).
    pub addr: u64,
    /// Size; see the table in the allocator reference §14 for its meaning per action.
    pub size: u64,
    /// Stream.
    pub stream: i64,
    /// Wall-clock µs since the epoch; absent in old files.
    pub time_us: Option<u64>,
    /// `device_free` of an `oom` entry.
    pub device_free: Option<u64>,
    /// Frames.
    pub frames: Option<StackRef>,
}

impl TraceEntry {
    /// An entry memsim leaves out, kept in place with none of its fields read.
    fn left_out(action: Action) -> TraceEntry {
        TraceEntry { action, addr: 0, size: 0, stream: 0, time_us: None, device_free: None, frames: None }
    }
}

impl Snapshot {
    /// Number of devices mentioned by traces or segments.
    pub fn device_count(&self) -> usize {
        let from_segments = self.segments.iter().map(|s| s.device as usize + 1).max().unwrap_or(0);
        from_segments.max(self.device_traces.len())
    }

    /// Segments of one device.
    pub fn device_segments(&self, device: u32) -> impl Iterator<Item = &Segment> {
        self.segments.iter().filter(move |s| s.device == device)
    }

    /// Count of each action over all devices, in [`Action::ALL`] order.
    pub fn action_counts(&self) -> Vec<(Action, usize)> {
        Action::ALL
            .into_iter()
            .map(|a| (a, self.device_traces.iter().flatten().filter(|e| e.action == a).count()))
            .collect()
    }
}

/// Reads a snapshot pickle from a file.
pub fn read_snapshot(path: &Path) -> Result<Snapshot, SnapshotError> {
    // Snapshots reach GiBs: no size bound, only a regular file (`/dev/zero` was read forever).
    let bytes =
        trace::read_small(path, u64::MAX).map_err(|source| SnapshotError::Io { path: path.to_path_buf(), source })?;
    parse_snapshot(&bytes, &path.display().to_string())
}

/// Decodes snapshot pickle bytes; `name` (usually the file path) goes into error messages.
pub fn parse_snapshot(bytes: &[u8], name: &str) -> Result<Snapshot, SnapshotError> {
    let p = pickle::decode(bytes).map_err(|source| SnapshotError::Pickle { file: name.to_string(), source })?;
    Reader {
        p: &p,
        file: name,
        stacks: Vec::new(),
        interned: HashMap::new(),
        by_content: HashMap::new(),
        skipped: BTreeMap::new(),
        tagged: BTreeMap::new(),
    }
    .snapshot()
}

struct Reader<'a> {
    p: &'a Pickle,
    file: &'a str,
    stacks: Vec<Vec<Frame>>,
    interned: HashMap<ValueId, Option<StackRef>>,
    by_content: HashMap<Vec<ValueId>, StackRef>,
    skipped: BTreeMap<String, Skipped>,
    tagged: BTreeMap<String, Skipped>,
}

fn kind(v: &PickleValue) -> &'static str {
    match v {
        PickleValue::None => "None",
        PickleValue::Bool(_) => "bool",
        PickleValue::Int(_) => "int",
        PickleValue::Float(_) => "float",
        PickleValue::Str(_) => "str",
        PickleValue::List(_) => "list",
        PickleValue::Tuple(_) => "tuple",
        PickleValue::Dict(_) => "dict",
    }
}

impl<'a> Reader<'a> {
    fn bad(&self, field: &str, expected: &str, got: ValueId) -> SnapshotError {
        self.bad_value(field.to_string(), format!("{expected}, found {}", kind(self.p.get(got))))
    }

    /// A field of this file whose value is not what was `expected` (which says what was found).
    fn bad_value(&self, field: String, expected: String) -> SnapshotError {
        SnapshotError::Field { file: self.file.to_string(), field, expected }
    }

    /// The value under `key` of the snapshot's top-level dict, as JSON.
    fn plain_data(&self, root: ValueId, key: &str) -> Result<Option<serde_json::Value>, SnapshotError> {
        let Some(v) = self.p.dict_get(root, key) else { return Ok(None) };
        let depth = Pickle::JSON_DEPTH;
        let expected = format!("plain data nested at most {depth} deep (a container that holds itself never ends)");
        self.p.to_json(v).map(Some).ok_or_else(|| self.bad(key, &expected, v))
    }

    fn missing(&self, field: &str, expected: &str) -> SnapshotError {
        self.bad_value(field.to_string(), format!("{expected}, but the key is missing"))
    }

    fn req(&self, obj: ValueId, path: &str, key: &str, expected: &str) -> Result<ValueId, SnapshotError> {
        self.p.dict_get(obj, key).ok_or_else(|| self.missing(&format!("{path}.{key}"), expected))
    }

    fn list(&self, id: ValueId, field: &str) -> Result<&'a [ValueId], SnapshotError> {
        match self.p.get(id) {
            PickleValue::List(v) | PickleValue::Tuple(v) => Ok(v),
            _ => Err(self.bad(field, "a list", id)),
        }
    }

    fn int(&self, id: ValueId, field: &str) -> Result<i128, SnapshotError> {
        match self.p.get(id) {
            PickleValue::Int(i) => Ok(*i),
            PickleValue::Bool(b) => Ok(*b as i128),
            _ => Err(self.bad(field, "an int", id)),
        }
    }

    // Field paths are formatted only on error: building them eagerly dominated parse time.
    fn int_of(&self, v: ValueId, path: &str, key: &str) -> Result<i128, SnapshotError> {
        match self.p.get(v) {
            PickleValue::Int(i) => Ok(*i),
            PickleValue::Bool(b) => Ok(*b as i128),
            _ => Err(self.bad(&format!("{path}.{key}"), "an int", v)),
        }
    }

    fn u64_field(&self, obj: ValueId, path: &str, key: &str) -> Result<u64, SnapshotError> {
        let v = self.req(obj, path, key, "a non-negative int")?;
        u64::try_from(self.int_of(v, path, key)?)
            .map_err(|_| self.bad(&format!("{path}.{key}"), "a non-negative int below 2^64", v))
    }

    fn i64_field(&self, obj: ValueId, path: &str, key: &str) -> Result<i64, SnapshotError> {
        let v = self.req(obj, path, key, "an int")?;
        i64::try_from(self.int_of(v, path, key)?)
            .map_err(|_| self.bad(&format!("{path}.{key}"), "an int in the i64 range", v))
    }

    fn opt_u64(&self, obj: ValueId, path: &str, key: &str) -> Result<Option<u64>, SnapshotError> {
        match self.p.dict_get(obj, key) {
            None => Ok(None),
            Some(v) if matches!(self.p.get(v), PickleValue::None) => Ok(None),
            Some(_) => self.u64_field(obj, path, key).map(Some),
        }
    }

    fn str_field(&self, obj: ValueId, path: &str, key: &str) -> Result<&'a str, SnapshotError> {
        let v = self.req(obj, path, key, "a str")?;
        match self.p.get(v) {
            PickleValue::Str(s) => Ok(s),
            _ => Err(self.bad(&format!("{path}.{key}"), "a str", v)),
        }
    }

    fn snapshot(mut self) -> Result<Snapshot, SnapshotError> {
        let root = self.p.root();
        let mut snap = Snapshot::default();
        match self.p.get(root) {
            PickleValue::List(_) => {
                snap.list_form = true;
                snap.segments = self.segments(root, "segments")?;
            }
            PickleValue::Dict(_) => {
                let segs = self.req(root, "", "segments", "a list of segments")?;
                snap.segments = self.segments(segs, "segments")?;
                if let Some(traces) = self.p.dict_get(root, "device_traces") {
                    for (d, t) in self.list(traces, "device_traces")?.iter().enumerate() {
                        let path = format!("device_traces[{d}]");
                        let entries = self.list(*t, &path)?;
                        let mut out = Vec::with_capacity(entries.len());
                        for (i, e) in entries.iter().enumerate() {
                            out.push(self.entry(*e, &format!("{path}[{i}]"))?);
                        }
                        snap.device_traces.push(out);
                    }
                }
                snap.allocator_settings = self.plain_data(root, "allocator_settings")?;
                snap.external_annotations = self.plain_data(root, "external_annotations")?;
                snap.memtrace_header = self.plain_data(root, MEMTRACE_HEADER)?;
            }
            _ => return Err(self.bad("(top level)", "a dict (snapshot) or a list (old segment list)", root)),
        }
        super::check::segments(&snap.segments, self.file)?;
        snap.stacks = self.stacks;
        snap.skipped = self.skipped;
        snap.tagged = self.tagged;
        Ok(snap)
    }

    fn segments(&mut self, id: ValueId, path: &str) -> Result<Vec<Segment>, SnapshotError> {
        let items = self.list(id, path)?;
        let mut out = Vec::with_capacity(items.len());
        for (i, s) in items.iter().enumerate() {
            out.push(self.segment(*s, &format!("{path}[{i}]"))?);
        }
        Ok(out)
    }

    fn segment(&mut self, s: ValueId, path: &str) -> Result<Segment, SnapshotError> {
        if !matches!(self.p.get(s), PickleValue::Dict(_)) {
            return Err(self.bad(path, "a dict (segment)", s));
        }
        let pool = match self.str_field(s, path, "segment_type")? {
            "small" => SegmentPool::Small,
            "large" => SegmentPool::Large,
            other => {
                return Err(
                    self.bad_value(format!("{path}.segment_type"), format!("'small' or 'large', found {other:?}"))
                )
            }
        };
        let pool_id = match self.p.dict_get(s, "segment_pool_id") {
            None => (0, 0),
            Some(v) => {
                let field = format!("{path}.segment_pool_id");
                match self.list(v, &field)? {
                    [a, b] => {
                        let a = i64::try_from(self.int(*a, &field)?).map_err(|_| self.bad(&field, "an i64 pair", v))?;
                        let b = i64::try_from(self.int(*b, &field)?).map_err(|_| self.bad(&field, "an i64 pair", v))?;
                        (a, b)
                    }
                    _ => return Err(self.bad(&field, "a pair of ints", v)),
                }
            }
        };
        let is_expandable = match self.p.dict_get(s, "is_expandable") {
            None => false,
            Some(v) => match self.p.get(v) {
                PickleValue::Bool(b) => *b,
                _ => return Err(self.bad(&format!("{path}.is_expandable"), "a bool", v)),
            },
        };
        let device = self.u64_field(s, path, "device")?;
        let device = u32::try_from(device).map_err(|_| {
            self.bad_value(format!("{path}.device"), format!("a device ordinal below 2^32, found {device}"))
        })?;
        let blocks_id = self.req(s, path, "blocks", "a list of blocks")?;
        let mut blocks = Vec::new();
        for (i, b) in self.list(blocks_id, &format!("{path}.blocks"))?.iter().enumerate() {
            blocks.push(self.block(*b, &format!("{path}.blocks[{i}]"))?);
        }
        Ok(Segment {
            device,
            address: self.u64_field(s, path, "address")?,
            total_size: self.u64_field(s, path, "total_size")?,
            allocated_size: self.u64_field(s, path, "allocated_size")?,
            active_size: self.u64_field(s, path, "active_size")?,
            requested_size: self.opt_u64(s, path, "requested_size")?.unwrap_or(0),
            stream: self.i64_field(s, path, "stream")?,
            pool,
            pool_id,
            is_expandable,
            frames: self.frames(s, path)?,
            blocks,
        })
    }

    fn block(&mut self, b: ValueId, path: &str) -> Result<Block, SnapshotError> {
        if !matches!(self.p.get(b), PickleValue::Dict(_)) {
            return Err(self.bad(path, "a dict (block)", b));
        }
        let state = match self.str_field(b, path, "state")? {
            "active_allocated" => BlockState::ActiveAllocated,
            // The Python docstring says active_awaiting_free; the C++ writer emits
            // active_pending_free. Both mean the same state.
            "active_pending_free" | "active_awaiting_free" => BlockState::ActivePendingFree,
            "inactive" => BlockState::Inactive,
            other => {
                return Err(self.bad_value(
                    format!("{path}.state"),
                    format!("'active_allocated', 'active_pending_free' or 'inactive', found {other:?}"),
                ))
            }
        };
        Ok(Block {
            address: self.u64_field(b, path, "address")?,
            size: self.u64_field(b, path, "size")?,
            requested_size: self.opt_u64(b, path, "requested_size")?.unwrap_or(0),
            state,
            frames: self.frames(b, path)?,
        })
    }

    /// One trace entry; one a replay leaves out (an annotation, an action this version does
    /// not know) with none of its fields read, counted in `skipped` under the file's name: a
    /// trace converted from this snapshot, and a snapshot written from that, carry the caveat.
    fn entry(&mut self, e: ValueId, path: &str) -> Result<TraceEntry, SnapshotError> {
        if !matches!(self.p.get(e), PickleValue::Dict(_)) {
            return Err(self.bad(path, "a dict (trace entry)", e));
        }
        let name = self.str_field(e, path, "action")?;
        let Some(action) = Action::parse(name) else {
            let action = if name == ANNOTATE { Action::Annotate } else { Action::Unknown };
            let first = format!("{path} of {}", file_name(self.file));
            self.skipped.entry(name.to_string()).or_insert(Skipped { count: 0, first }).count += 1;
            return Ok(TraceEntry::left_out(action));
        };
        // A tag of another type than str is said by its type, not dropped.
        let tag = match self.p.dict_get(e, "internal_metadata").map(|v| self.p.get(v)) {
            None | Some(PickleValue::None) => None,
            Some(PickleValue::Str(t)) => (!t.is_empty()).then(|| t.to_string()),
            Some(v) => Some(format!("({})", kind(v))),
        };
        if let Some(tag) = tag {
            let first = format!("{path} of {}", file_name(self.file));
            self.tagged.entry(tag).or_insert(Skipped { count: 0, first }).count += 1;
        }
        let (addr, device_free) = if action == Action::Oom {
            (self.opt_u64(e, path, "addr")?.unwrap_or(0), self.opt_u64(e, path, "device_free")?)
        } else {
            (self.u64_field(e, path, "addr")?, None)
        };
        Ok(TraceEntry {
            action,
            addr,
            size: self.u64_field(e, path, "size")?,
            stream: self.i64_field(e, path, "stream")?,
            time_us: self.opt_u64(e, path, "time_us")?,
            device_free,
            frames: self.frames(e, path)?,
        })
    }

    /// Interns the `frames` list of `obj`; an absent key or None is `None`.
    fn frames(&mut self, obj: ValueId, path: &str) -> Result<Option<StackRef>, SnapshotError> {
        let Some(f) = self.p.dict_get(obj, "frames") else { return Ok(None) };
        if let Some(r) = self.interned.get(&f) {
            return Ok(*r);
        }
        let r = match self.p.get(f) {
            PickleValue::None => None,
            // Python shares each frame dict through the memo but builds a new list per block
            // and entry: equal sequences of frame objects are one stack.
            PickleValue::List(items) if self.by_content.contains_key(items.as_slice()) => {
                Some(self.by_content[items.as_slice()])
            }
            PickleValue::List(items) => {
                let mut frames = Vec::with_capacity(items.len());
                for (i, fr) in items.iter().enumerate() {
                    frames.push(self.frame(*fr).map_or_else(|| self.frame_error(*fr, path, i), Ok)?);
                }
                self.stacks.push(frames);
                let r = (self.stacks.len() - 1) as StackRef;
                self.by_content.insert(items.clone(), r);
                Some(r)
            }
            _ => return Err(self.bad(&format!("{path}.frames"), "a list of frames", f)),
        };
        self.interned.insert(f, r);
        Ok(r)
    }
}

impl Reader<'_> {
    /// A well-formed frame dict; None sends the caller to [`Reader::frame_error`].
    fn frame(&self, fr: ValueId) -> Option<Frame> {
        let text = |key| match self.p.get(self.p.dict_get(fr, key)?) {
            PickleValue::Str(s) => Some(s.to_string()),
            _ => None,
        };
        let line = match self.p.get(self.p.dict_get(fr, "line")?) {
            PickleValue::Int(i) => *i,
            _ => return None,
        };
        Some(Frame { filename: text("filename")?, line: frame_line(line), name: text("name")? })
    }

    /// The error for a malformed frame, naming the first bad field.
    fn frame_error(&self, fr: ValueId, path: &str, i: usize) -> Result<Frame, SnapshotError> {
        let fp = format!("{path}.frames[{i}]");
        if !matches!(self.p.get(fr), PickleValue::Dict(_)) {
            return Err(self.bad(&fp, "a dict (frame)", fr));
        }
        let lv = self.req(fr, &fp, "line", "an int")?;
        self.int_of(lv, &fp, "line")?;
        self.str_field(fr, &fp, "filename")?;
        self.str_field(fr, &fp, "name")?;
        Err(self.bad(&fp, "a frame with name, filename and line", fr))
    }
}

/// PyTorch writes an unknown line as `size_t(-1)`; it and anything else beyond u32 become
/// [`UNKNOWN_LINE`], which export writes back as `2^64 - 1`.
fn frame_line(line: i128) -> u32 {
    u32::try_from(line).ok().filter(|l| *l != UNKNOWN_LINE).unwrap_or(UNKNOWN_LINE)
}

/// The line number standing for PyTorch's `size_t(-1)` (unknown line).
pub const UNKNOWN_LINE: u32 = u32::MAX;
