//! What the model is asked to do, what it answers, and the views it gives of its state.

use thiserror::Error;

/// One allocator call, as a trace records it.
#[derive(Debug, Clone, PartialEq)]
pub enum Request {
    /// `malloc(size, stream)`. `recorded_addr` is the address the real run returned, when
    /// known: a request that needs a new segment (or a new expandable reservation) puts that
    /// segment where the block lands at `recorded_addr`, because cudaMalloc chose it on the GPU
    /// and best-fit ties between equal blocks resolve by address. Without it the model uses a
    /// deterministic synthetic address space (non-overlapping, 2 MiB aligned).
    Alloc {
        /// Requested bytes (unrounded).
        size: u64,
        /// Stream (`cudaStream_t` as a signed integer).
        stream: i64,
        /// Address observed in the real run.
        recorded_addr: Option<u64>,
    },
    /// The program freed the block: `allocated_bytes` drops now; the memory becomes reusable only
    /// at the matching [`Request::FreeCompleted`].
    FreeRequested {
        /// Block address.
        addr: u64,
    },
    /// The allocator made the block reusable (`free_block`: merge and return to the pool).
    FreeCompleted {
        /// Block address.
        addr: u64,
    },
    /// A free whose completion the model decides: at once, or, for a block used on other streams
    /// (`record_stream`), at the start of the next allocation (`process_events`) or an
    /// `empty_cache`.
    Free {
        /// Block address.
        addr: u64,
    },
    /// `Tensor.record_stream(stream)` on the allocated block at `addr`.
    RecordStream {
        /// Block address.
        addr: u64,
        /// The stream that uses it.
        stream: i64,
    },
    /// `torch.cuda.empty_cache()`.
    EmptyCache,
    /// `torch.cuda.set_per_process_memory_fraction(f)`.
    SetMemoryFraction(f64),
    /// `torch.cuda.reset_peak_memory_stats()`.
    ResetPeakStats,
}

/// A device-level action, in the order PyTorch records them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceEvent {
    /// `cudaMalloc` of a native segment.
    SegmentAlloc {
        /// Segment base.
        addr: u64,
        /// Segment size.
        size: u64,
    },
    /// `cudaFree` of a whole native segment.
    SegmentFree {
        /// Segment base.
        addr: u64,
        /// Segment size.
        size: u64,
    },
    /// Pages mapped into an expandable segment.
    SegmentMap {
        /// Range start.
        addr: u64,
        /// Range size.
        size: u64,
    },
    /// Pages unmapped from an expandable segment.
    SegmentUnmap {
        /// Range start.
        addr: u64,
        /// Range size.
        size: u64,
    },
}

/// Why an allocation failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OomInfo {
    /// The rounded request (what PyTorch's `oom` trace entry records as `size`).
    pub rounded_size: u64,
    /// The unrounded request.
    pub requested_size: u64,
    /// Reserved bytes when it failed.
    pub reserved: u64,
    /// Allocated bytes when it failed.
    pub allocated: u64,
    /// Device bytes the allocator could still have obtained (capacity minus reserved), when a
    /// capacity is set.
    pub device_free: Option<u64>,
}

/// The answer to one [`Request`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Outcome {
    /// For an allocation: the block address (None on OOM or for a zero-byte request).
    pub addr: Option<u64>,
    /// For an allocation: the block size, at least the rounded request. For a free: the size of
    /// the block freed.
    pub block_size: u64,
    /// Segment events, in PyTorch's order. Empty in the common case (no allocation happens).
    pub device_events: Vec<DeviceEvent>,
    /// Set when the allocation failed.
    pub oom: Option<OomInfo>,
    /// The allocation went through `release_cached_blocks` and a retry.
    pub retried: bool,
    /// Blocks whose deferred free completed during this request (`process_events` or the
    /// synchronisation in `release_cached_blocks`), by address.
    pub completed_frees: Vec<u64>,
    /// What a memory fraction had to allow for this request to reserve: the most
    /// `reserved + alloc_size` an `alloc_block` that succeeded compared with `allowed_max` (or
    /// would have, with no fraction enforced). 0 when the request reserved nothing: one served
    /// from the cache is never refused, however much is reserved.
    pub fraction_checked: u64,
}

impl Outcome {
    /// Back to `Outcome::default()`, keeping the vectors' capacity.
    pub fn clear(&mut self) {
        self.addr = None;
        self.block_size = 0;
        self.device_events.clear();
        self.oom = None;
        self.retried = false;
        self.completed_frees.clear();
        self.fraction_checked = 0;
    }
}

/// A request the model cannot apply; the state is left unchanged.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum ReplayError {
    /// No allocated or pending block starts at this address.
    #[error("free of unknown address {addr:#x}: no live block starts there")]
    UnknownAddress {
        /// The address.
        addr: u64,
    },
    /// The block's free was already requested.
    #[error("double free of {addr:#x}: its free was already requested")]
    DoubleFree {
        /// The address.
        addr: u64,
    },
    /// `free_completed` for a block whose free was never requested.
    #[error("free_completed for {addr:#x}, which is still allocated (no free_requested before it)")]
    NotRequested {
        /// The address.
        addr: u64,
    },
    /// `record_stream` at an address where no live block starts.
    #[error("record_stream on unknown address {addr:#x}: no live block starts there")]
    UnknownStreamUse {
        /// The address.
        addr: u64,
    },
    /// `record_stream` on a block that is not allocated.
    #[error("record_stream on {addr:#x}, which is not an allocated block")]
    NotAllocated {
        /// The address.
        addr: u64,
    },
    /// `set_per_process_memory_fraction` outside [0, 1].
    #[error("invalid fraction: {0}. Please set within [0, 1]")]
    InvalidFraction(f64),
}

/// A segment that existed before the trace began.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExistingSegment {
    /// Segment base.
    pub addr: u64,
    /// Segment size (for an expandable segment, the mapped range).
    pub size: u64,
    /// Stream.
    pub stream: i64,
    /// Small-pool segment.
    pub is_small_pool: bool,
    /// An expandable segment's mapped range.
    pub expandable: bool,
    /// Its blocks, in address order, covering the segment exactly.
    pub blocks: Vec<ExistingBlock>,
}

/// A block of an [`ExistingSegment`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExistingBlock {
    /// Block address.
    pub addr: u64,
    /// Block size.
    pub size: u64,
    /// Requested size (for allocated blocks).
    pub requested_size: u64,
    /// Allocated (`active_allocated` or `active_pending_free`) rather than free.
    pub allocated: bool,
}

/// A starting segment the model cannot take.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SeedError {
    /// The segment has no size or no blocks.
    #[error("segment {addr:#x}: empty segment (size 0 or no blocks)")]
    Empty {
        /// Segment base.
        addr: u64,
    },
    /// The blocks do not tile the segment exactly.
    #[error("segment {addr:#x}: block at {block:#x} does not continue the previous block (blocks must tile [addr, addr+size) in order)")]
    NotTiled {
        /// Segment base.
        addr: u64,
        /// The offending block.
        block: u64,
    },
    /// The segment overlaps one the model already holds.
    #[error("segment {addr:#x}+{size:#x} overlaps an existing segment")]
    Overlap {
        /// Segment base.
        addr: u64,
        /// Segment size.
        size: u64,
    },
}

/// State of a block in a [`SegmentView`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockViewState {
    /// Allocated (`active_allocated`).
    Allocated,
    /// Freed by the program, not yet reusable (`active_pending_free`).
    PendingFree,
    /// Free and mapped (`inactive`).
    Inactive,
}

/// A block as snapshots describe it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockView {
    /// Address.
    pub addr: u64,
    /// Size.
    pub size: u64,
    /// Requested size (0 for free blocks).
    pub requested_size: u64,
    /// State.
    pub state: BlockViewState,
}

/// A segment as snapshots describe it: a native segment, or one contiguous mapped range of an
/// expandable reservation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentView {
    /// Base address.
    pub addr: u64,
    /// Size.
    pub size: u64,
    /// Stream.
    pub stream: i64,
    /// Small pool.
    pub is_small_pool: bool,
    /// Part of an expandable segment.
    pub expandable: bool,
    /// Blocks in address order.
    pub blocks: Vec<BlockView>,
}
