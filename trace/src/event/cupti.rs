//! What CUPTI's activity API reports: kernel executions and memory activity, timed inside the
//! driver.

use bincode::{Decode, Encode};
use serde::{Deserialize, Serialize};

use super::NameId;

/// A kernel execution record (CUPTI `CONCURRENT_KERNEL` activity).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Encode, Decode)]
pub struct KernelExec {
    /// Start, ns on the header's clock.
    pub start_ns: u64,
    /// End, ns on the header's clock.
    pub end_ns: u64,
    /// Kernel name (interned), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<NameId>,
    /// Grid dimensions.
    #[serde(default)]
    pub grid: [u32; 3],
    /// Block dimensions.
    #[serde(default)]
    pub block: [u32; 3],
    /// Registers per thread.
    #[serde(default)]
    pub registers_per_thread: u16,
    /// Static shared memory per block, bytes.
    #[serde(default)]
    pub static_shared_mem: u32,
    /// Dynamic shared memory per block, bytes.
    #[serde(default)]
    pub dynamic_shared_mem: u32,
    /// CUPTI stream id.
    #[serde(default)]
    pub stream: i64,
    /// CUPTI correlation id (links to the launching API call).
    #[serde(default)]
    pub correlation_id: u32,
}

/// What a [`MemActivity`] record reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Encode, Decode)]
pub enum MemActivityOp {
    /// Memory was allocated.
    #[serde(rename = "allocation")]
    Allocation,
    /// Memory was released.
    #[serde(rename = "release")]
    Release,
}

/// CUPTI's memory kinds (`CUpti_ActivityMemoryKind`), in CUPTI's order: the variant index is
/// CUPTI's code. Kept apart from [`MemoryKind`](crate::MemoryKind), which says which API allocated; CUPTI says where
/// the memory lives and has kinds no interposed call produces (pageable, array, static).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Encode, Decode, Default)]
pub enum CuptiMemoryKind {
    /// CUPTI did not say (also any code newer than this list).
    #[serde(rename = "unknown")]
    #[default]
    Unknown,
    /// Pageable host memory.
    #[serde(rename = "pageable")]
    Pageable,
    /// Page-locked host memory.
    #[serde(rename = "pinned")]
    Pinned,
    /// Device memory.
    #[serde(rename = "device")]
    Device,
    /// A CUDA array.
    #[serde(rename = "array")]
    Array,
    /// Managed (unified) memory.
    #[serde(rename = "managed")]
    Managed,
    /// Static device memory (`__device__` variables of a loaded module).
    #[serde(rename = "device_static")]
    DeviceStatic,
    /// Static managed memory (`__managed__` variables).
    #[serde(rename = "managed_static")]
    ManagedStatic,
}

impl CuptiMemoryKind {
    /// All kinds, in code order.
    pub const ALL: [CuptiMemoryKind; 8] = [
        CuptiMemoryKind::Unknown,
        CuptiMemoryKind::Pageable,
        CuptiMemoryKind::Pinned,
        CuptiMemoryKind::Device,
        CuptiMemoryKind::Array,
        CuptiMemoryKind::Managed,
        CuptiMemoryKind::DeviceStatic,
        CuptiMemoryKind::ManagedStatic,
    ];

    /// The kind for a `CUpti_ActivityMemoryKind` code; codes newer than this list are `Unknown`.
    pub fn from_cupti(code: u32) -> Self {
        Self::ALL.get(code as usize).copied().unwrap_or(CuptiMemoryKind::Unknown)
    }

    /// The JSON spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            CuptiMemoryKind::Unknown => "unknown",
            CuptiMemoryKind::Pageable => "pageable",
            CuptiMemoryKind::Pinned => "pinned",
            CuptiMemoryKind::Device => "device",
            CuptiMemoryKind::Array => "array",
            CuptiMemoryKind::Managed => "managed",
            CuptiMemoryKind::DeviceStatic => "device_static",
            CuptiMemoryKind::ManagedStatic => "managed_static",
        }
    }

    /// Whether the memory is held on the device (host kinds and `Unknown` are not).
    pub fn is_device(self) -> bool {
        matches!(
            self,
            CuptiMemoryKind::Device
                | CuptiMemoryKind::Array
                | CuptiMemoryKind::Managed
                | CuptiMemoryKind::DeviceStatic
                | CuptiMemoryKind::ManagedStatic
        )
    }
}

/// The kind of stream-ordered memory pool an allocation came from (`CUpti_ActivityMemoryPoolType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Encode, Decode)]
pub enum MemPoolKind {
    /// A pool of this process (`cudaMemPoolCreate`, the device's default pool).
    #[serde(rename = "local")]
    Local,
    /// A pool imported from another process.
    #[serde(rename = "imported")]
    Imported,
}

/// A memory allocation or release as CUPTI's `MEMORY2` activity reports it
/// (`CUpti_ActivityMemory4`): seen inside the driver, whichever API or library asked. The
/// record's `ts_ns` is CUPTI's timestamp on the trace clock, its `device` CUPTI's device id.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Encode, Decode)]
pub struct MemActivity {
    /// Allocation or release.
    pub op: MemActivityOp,
    /// Where the memory lives, as CUPTI names it.
    #[serde(default)]
    pub memory_kind: CuptiMemoryKind,
    /// Start address.
    pub addr: u64,
    /// Size in bytes.
    pub size: u64,
    /// CUPTI stream id, for stream-ordered operations (`cudaMallocAsync`, `cudaFreeAsync`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<i64>,
    /// CUPTI correlation id (links to the API call; 0 when CUPTI gave none).
    #[serde(default)]
    pub correlation_id: u32,
    /// Program counter CUPTI attributes the operation to, 0 when unknown.
    #[serde(default)]
    pub pc: u64,
    /// The memory pool's kind, for allocations from a stream-ordered pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<MemPoolKind>,
    /// The memory pool's address, with `pool`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool_addr: Option<u64>,
}

impl MemActivity {
    /// An `op` of `size` bytes at `addr` with nothing else known: no stream, correlation id or
    /// program counter, no pool.
    pub fn new(op: MemActivityOp, memory_kind: CuptiMemoryKind, addr: u64, size: u64) -> Self {
        MemActivity { op, memory_kind, addr, size, stream: None, correlation_id: 0, pc: 0, pool: None, pool_addr: None }
    }
}
