//! Events: one enum, pinned tags, and the small enums they carry.
//!
//! Every event travels inside a [`Record`], which adds the fields all events share (timestamp,
//! thread, device). Unknown values are `None`, never zero: old snapshots have no timestamps.
//!
//! Tags are pinned in [`Event::tag`] and in `#[serde(rename)]`; variants and enum values are only
//! ever appended. Reordering declarations changes nothing on disk.

use bincode::{Decode, Encode};
use serde::{Deserialize, Serialize};

use crate::api::Api;

mod cupti;
mod segment;

pub use cupti::{CuptiMemoryKind, KernelExec, MemActivity, MemActivityOp, MemPoolKind};
pub use segment::{BlockInfo, BlockState, SegmentPool, SegmentState, SnapshotPoint, StateAt};

/// Interned string id (kernel names, caller modules). Defined by an [`Event::Name`] earlier in the
/// same trace.
pub type NameId = u32;
/// Interned stack id. Defined by an [`Event::Stack`] earlier in the same trace.
pub type StackId = u32;

/// Fields every event shares, plus the event itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// Nanoseconds since the header's clock origin (monotonic). `None` when unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ts_ns: Option<u64>,
    /// OS thread id of the caller. `None` when unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tid: Option<u32>,
    /// CUDA device ordinal. `None` when unknown or not device-related.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<u32>,
    /// The event.
    #[serde(flatten)]
    pub event: Event,
}

impl Record {
    /// A record with no timestamp, thread or device.
    pub fn bare(event: Event) -> Self {
        Record { ts_ns: None, tid: None, device: None, event }
    }
}

/// One trace event. The JSON Lines `"kind"` and the binary tag byte are pinned per variant.
///
/// Deliberately not `#[non_exhaustive]`: consumers in this workspace match it exhaustively, so a
/// new variant makes every consumer decide what it means.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind")]
pub enum Event {
    /// A memory allocation (request to an allocator, or a driver/runtime call). Tag 1.
    #[serde(rename = "alloc")]
    Alloc(Alloc),
    /// A free. Tag 2.
    #[serde(rename = "free")]
    Free(Free),
    /// A virtual-memory-management operation on an address range. Tag 3.
    #[serde(rename = "vmm")]
    Vmm(Vmm),
    /// A kernel launch seen on the host. Tag 4.
    #[serde(rename = "launch")]
    KernelLaunch(KernelLaunch),
    /// A kernel execution record from CUPTI. Tag 5.
    #[serde(rename = "kernel_exec")]
    KernelExec(KernelExec),
    /// A `cudaMemGetInfo`-style sample. Tag 6.
    #[serde(rename = "mem_info")]
    MemInfo(MemInfo),
    /// A marker (`iter:<n>`, `phase:<p>` or free text). Tag 7.
    #[serde(rename = "marker")]
    Marker(Marker),
    /// Defines an interned string. Tag 8.
    #[serde(rename = "name")]
    Name(NameDef),
    /// Defines an interned call stack. Tag 9.
    #[serde(rename = "stack")]
    Stack(StackDef),
    /// The allocator gave up on a request (a snapshot's `oom` entry). Tag 10.
    #[serde(rename = "oom")]
    Oom(Oom),
    /// A call that changes allocator state without allocating (`empty_cache`, ...). Tag 11.
    #[serde(rename = "control")]
    Control(Control),
    /// A memory-pool trim (`cudaMemPoolTrimTo`, `cuMemPoolTrimTo`). Tag 12.
    #[serde(rename = "pool_trim")]
    PoolTrim(PoolTrim),
    /// Allocator segment state (a snapshot's `segments`), at the start or end of the trace. Tag 13.
    #[serde(rename = "segment_state")]
    SegmentState(SegmentState),
    /// A snapshot's `snapshot` entry: total active bytes at that point. Tag 14.
    #[serde(rename = "snapshot_point")]
    SnapshotPoint(SnapshotPoint),
    /// The process ended; a trace without it was cut short. Tag 15.
    #[serde(rename = "process_exit")]
    ProcessExit(ProcessExit),
    /// A memory allocation or release from CUPTI's `MEMORY2` activity. Tag 16, appended within
    /// version 1: readers that predate it skip it as an unknown kind.
    #[serde(rename = "mem_activity")]
    MemActivity(MemActivity),
}

impl Event {
    /// The pinned tag byte of this event in the binary form.
    pub fn tag(&self) -> u8 {
        match self {
            Event::Alloc(_) => 1,
            Event::Free(_) => 2,
            Event::Vmm(_) => 3,
            Event::KernelLaunch(_) => 4,
            Event::KernelExec(_) => 5,
            Event::MemInfo(_) => 6,
            Event::Marker(_) => 7,
            Event::Name(_) => 8,
            Event::Stack(_) => 9,
            Event::Oom(_) => 10,
            Event::Control(_) => 11,
            Event::PoolTrim(_) => 12,
            Event::SegmentState(_) => 13,
            Event::SnapshotPoint(_) => 14,
            Event::ProcessExit(_) => 15,
            Event::MemActivity(_) => 16,
        }
    }

    /// The JSON Lines `"kind"` of this event: [`Event::KINDS`] is in tag order, so the tag is
    /// the one mapping from variant to kind.
    pub fn kind(&self) -> &'static str {
        Self::KINDS[usize::from(self.tag()) - 1]
    }

    /// Every kind this version knows, in tag order.
    pub const KINDS: [&'static str; 16] = [
        "alloc",
        "free",
        "vmm",
        "launch",
        "kernel_exec",
        "mem_info",
        "marker",
        "name",
        "stack",
        "oom",
        "control",
        "pool_trim",
        "segment_state",
        "snapshot_point",
        "process_exit",
        "mem_activity",
    ];
}

/// Whether an allocation event is a request to the framework's allocator or what it (or the driver)
/// did. memsim replays requests and compares outcomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Encode, Decode, Default)]
pub enum Origin {
    /// A request to the framework's allocator (a tensor block). Replayed by memsim.
    #[serde(rename = "request")]
    #[default]
    Request,
    /// What an allocator or driver did (a segment, a `cudaMalloc` under the cache). Compared only.
    #[serde(rename = "outcome")]
    Outcome,
}

/// What kind of memory an allocation holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Encode, Decode, Default)]
pub enum MemoryKind {
    /// Device memory.
    #[serde(rename = "device")]
    #[default]
    Device,
    /// Page-locked host memory (`cudaHostAlloc`, `cudaMallocHost`). Kept apart from device memory.
    #[serde(rename = "pinned_host")]
    PinnedHost,
    /// Managed (unified) memory.
    #[serde(rename = "managed")]
    Managed,
    /// A VMM physical allocation handle (`cuMemCreate`); the address field holds the handle.
    #[serde(rename = "physical")]
    Physical,
    /// Host memory registered with `cudaHostRegister`.
    #[serde(rename = "host_registered")]
    HostRegistered,
    /// Memory imported from another process (`cudaIpcOpenMemHandle`, shareable handles).
    #[serde(rename = "ipc_import")]
    IpcImport,
}

impl MemoryKind {
    /// All kinds in declaration order.
    pub const ALL: [MemoryKind; 6] = [
        MemoryKind::Device,
        MemoryKind::PinnedHost,
        MemoryKind::Managed,
        MemoryKind::Physical,
        MemoryKind::HostRegistered,
        MemoryKind::IpcImport,
    ];

    /// Whether this memory counts as device memory of this process (physical VMM handles do).
    pub fn is_device(self) -> bool {
        matches!(self, MemoryKind::Device | MemoryKind::Managed | MemoryKind::Physical)
    }
}

/// What an allocation is for, when the producer knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Encode, Decode)]
pub enum Category {
    /// Model parameters.
    #[serde(rename = "parameter")]
    Parameter,
    /// Parameter gradients.
    #[serde(rename = "gradient")]
    Gradient,
    /// Optimizer state (momentum, Adam moments, step counters).
    #[serde(rename = "optimizer_state")]
    OptimizerState,
    /// Activations and other autograd-saved or temporary tensors of forward/backward.
    #[serde(rename = "activation")]
    Activation,
    /// Library workspaces (cuBLAS, cuDNN).
    #[serde(rename = "workspace")]
    Workspace,
    /// Input batches and targets.
    #[serde(rename = "input")]
    Input,
    /// Anything else.
    #[serde(rename = "other")]
    Other,
}

impl Category {
    /// All categories in declaration order.
    pub const ALL: [Category; 7] = [
        Category::Parameter,
        Category::Gradient,
        Category::OptimizerState,
        Category::Activation,
        Category::Workspace,
        Category::Input,
        Category::Other,
    ];

    /// The JSON spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Category::Parameter => "parameter",
            Category::Gradient => "gradient",
            Category::OptimizerState => "optimizer_state",
            Category::Activation => "activation",
            Category::Workspace => "workspace",
            Category::Input => "input",
            Category::Other => "other",
        }
    }
}

/// An allocation: a request to an allocator or a driver/runtime allocation call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Encode, Decode)]
pub struct Alloc {
    /// Address returned (for [`MemoryKind::Physical`], the handle). 0 when the call failed.
    pub addr: u64,
    /// Requested size in bytes (unrounded for allocator requests).
    pub size: u64,
    /// Stream (`cudaStream_t` as a signed integer; 0 is the legacy default stream).
    #[serde(default)]
    pub stream: i64,
    /// Memory kind.
    #[serde(default)]
    pub mem: MemoryKind,
    /// The API that made it.
    pub api: Api,
    /// CUDA result code (0 = success; 2 = out of memory).
    #[serde(default)]
    pub result: i32,
    /// Request or outcome.
    #[serde(default)]
    pub origin: Origin,
    /// What the memory is for, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub category: Option<Category>,
    /// The shared library that made the call (interned name), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caller: Option<NameId>,
    /// The call stack (interned), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stack: Option<StackId>,
}

impl Alloc {
    /// A successful allocation of device memory on stream 0, with no category, caller or
    /// stack; other fields by struct update (`Alloc { stream, ..Alloc::device(..) }`).
    pub fn device(addr: u64, size: u64, api: Api, origin: Origin) -> Alloc {
        Alloc {
            addr,
            size,
            stream: 0,
            mem: MemoryKind::Device,
            api,
            result: 0,
            origin,
            category: None,
            caller: None,
            stack: None,
        }
    }
}

/// Which step of freeing a free event records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Encode, Decode, Default)]
pub enum FreeStage {
    /// A plain free: requested and completed at once (a `cudaFree`, a symbolic-trace free).
    #[serde(rename = "immediate")]
    #[default]
    Immediate,
    /// The program released the block; it may still be in use on other streams.
    #[serde(rename = "requested")]
    Requested,
    /// The allocator made the block reusable.
    #[serde(rename = "completed")]
    Completed,
}

/// A free.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Encode, Decode)]
pub struct Free {
    /// Address freed (for [`MemoryKind::Physical`], the handle).
    pub addr: u64,
    /// Size in bytes, when the producer knows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    /// Stream.
    #[serde(default)]
    pub stream: i64,
    /// Memory kind.
    #[serde(default)]
    pub mem: MemoryKind,
    /// The API that made it.
    pub api: Api,
    /// CUDA result code.
    #[serde(default)]
    pub result: i32,
    /// Request or outcome.
    #[serde(default)]
    pub origin: Origin,
    /// Requested, completed, or both at once.
    #[serde(default)]
    pub stage: FreeStage,
    /// The shared library that made the call, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caller: Option<NameId>,
    /// The call stack (interned), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stack: Option<StackId>,
}

impl Free {
    /// A successful free of device memory at `addr` on stream 0, with no size, caller or stack;
    /// other fields by struct update (`Free { size: Some(n), ..Free::device(..) }`).
    pub fn device(addr: u64, api: Api, origin: Origin, stage: FreeStage) -> Free {
        Free {
            addr,
            size: None,
            stream: 0,
            mem: MemoryKind::Device,
            api,
            result: 0,
            origin,
            stage,
            caller: None,
            stack: None,
        }
    }
}

/// Virtual memory operations. Physical memory (`cuMemCreate`/`cuMemRelease`) is recorded as
/// [`Alloc`]/[`Free`] with [`MemoryKind::Physical`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Encode, Decode)]
pub enum VmmOp {
    /// `cuMemAddressReserve`.
    #[serde(rename = "reserve")]
    Reserve,
    /// `cuMemAddressFree`.
    #[serde(rename = "address_free")]
    AddressFree,
    /// `cuMemMap` (or a snapshot's `segment_map`).
    #[serde(rename = "map")]
    Map,
    /// `cuMemUnmap` (or a snapshot's `segment_unmap`).
    #[serde(rename = "unmap")]
    Unmap,
    /// `cuMemSetAccess`.
    #[serde(rename = "set_access")]
    SetAccess,
}

/// A VMM operation on a virtual address range.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Encode, Decode)]
pub struct Vmm {
    /// Which operation.
    pub op: VmmOp,
    /// Start of the virtual range.
    pub addr: u64,
    /// Length of the range in bytes.
    pub size: u64,
    /// Physical handle mapped (for `map`), else 0.
    #[serde(default)]
    pub handle: u64,
    /// Offset into the physical handle (for `map`).
    #[serde(default)]
    pub offset: u64,
    /// The API that made it.
    pub api: Api,
    /// CUDA result code.
    #[serde(default)]
    pub result: i32,
    /// Request or outcome.
    #[serde(default)]
    pub origin: Origin,
    /// Stream (snapshots record one per mapped range), else 0.
    #[serde(default)]
    pub stream: i64,
    /// The shared library that made the call, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caller: Option<NameId>,
}

/// A kernel launch seen on the host.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Encode, Decode)]
pub struct KernelLaunch {
    /// The launching API.
    pub api: Api,
    /// Kernel name (interned), when resolved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<NameId>,
    /// Grid dimensions.
    #[serde(default)]
    pub grid: [u32; 3],
    /// Block dimensions.
    #[serde(default)]
    pub block: [u32; 3],
    /// Dynamic shared memory in bytes.
    #[serde(default)]
    pub shared_mem: u32,
    /// Stream.
    #[serde(default)]
    pub stream: i64,
    /// CUDA result code.
    #[serde(default)]
    pub result: i32,
}

impl KernelLaunch {
    /// A successful launch without dynamic shared memory; other fields by struct update
    /// (`KernelLaunch { shared_mem, ..KernelLaunch::succeeded(..) }`).
    pub fn succeeded(api: Api, name: Option<NameId>, grid: [u32; 3], block: [u32; 3], stream: i64) -> KernelLaunch {
        KernelLaunch { api, name, grid, block, shared_mem: 0, stream, result: 0 }
    }
}

/// A device memory sample.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Encode, Decode)]
pub struct MemInfo {
    /// Free bytes.
    pub free: u64,
    /// Total bytes.
    pub total: u64,
}

/// A marker. See [`crate::marker`] for the grammar.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Encode, Decode)]
pub struct Marker {
    /// `iter:<n>`, `phase:<forward|backward|optimizer|data|other>`, or free text.
    pub text: String,
}

/// An interned string.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Encode, Decode)]
pub struct NameDef {
    /// Id used by later events.
    pub id: NameId,
    /// The text.
    pub text: String,
}

/// One stack frame.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Encode, Decode)]
pub struct Frame {
    /// Source file.
    pub filename: String,
    /// Line number.
    pub line: u32,
    /// Function name.
    pub name: String,
}

/// An interned call stack, innermost frame first (as PyTorch records them).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Encode, Decode)]
pub struct StackDef {
    /// Id used by later events.
    pub id: StackId,
    /// Frames.
    pub frames: Vec<Frame>,
}

/// The allocator's OOM record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Encode, Decode)]
pub struct Oom {
    /// The rounded request that failed.
    pub size: u64,
    /// Free device bytes reported at that moment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_free: Option<u64>,
    /// Stream.
    #[serde(default)]
    pub stream: i64,
}

/// Allocator control operations.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Encode, Decode)]
#[serde(tag = "op")]
pub enum ControlOp {
    /// `torch.cuda.empty_cache()`.
    #[serde(rename = "empty_cache")]
    EmptyCache,
    /// `torch.cuda.set_per_process_memory_fraction(fraction)`.
    #[serde(rename = "set_memory_fraction")]
    SetMemoryFraction {
        /// The fraction, 0..=1.
        fraction: f64,
    },
    /// `torch.cuda.reset_peak_memory_stats()`.
    #[serde(rename = "reset_peak_stats")]
    ResetPeakStats,
    /// `Tensor.record_stream(stream)` on the block at `addr`.
    #[serde(rename = "record_stream")]
    RecordStream {
        /// Block address.
        addr: u64,
        /// The stream that uses it.
        stream: i64,
    },
}

/// A control call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Encode, Decode)]
pub struct Control {
    /// The operation.
    #[serde(flatten)]
    pub op: ControlOp,
}

/// A pool trim.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Encode, Decode)]
pub struct PoolTrim {
    /// Pool handle.
    pub pool: u64,
    /// `minBytesToKeep`.
    pub min_bytes_to_keep: u64,
    /// The API.
    pub api: Api,
    /// CUDA result code.
    #[serde(default)]
    pub result: i32,
}

/// End of the process. Its presence means the trace is complete.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Encode, Decode)]
pub struct ProcessExit {
    /// Exit status, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<i32>,
    /// Signal that ended the process, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// Events the producer dropped (queue full).
    #[serde(default)]
    pub lost_events: u64,
}
