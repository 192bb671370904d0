//! Allocator state at a point of the run (a snapshot's segments and blocks), as `segment_state`
//! and `snapshot_point` events carry it.

use bincode::{Decode, Encode};
use serde::{Deserialize, Serialize};

use super::StackId;

/// When a [`SegmentState`] holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Encode, Decode)]
pub enum StateAt {
    /// Before the first event (a rebuilt or recorded starting state).
    #[serde(rename = "start")]
    Start,
    /// After the last event (a snapshot's `segments` at dump time).
    #[serde(rename = "end")]
    End,
}

/// Allocator pool of a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Encode, Decode)]
pub enum SegmentPool {
    /// Small pool (requests of at most 1 MiB).
    #[serde(rename = "small")]
    Small,
    /// Large pool.
    #[serde(rename = "large")]
    Large,
}

/// State of a block inside a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Encode, Decode)]
pub enum BlockState {
    /// Allocated and in use.
    #[serde(rename = "active_allocated")]
    ActiveAllocated,
    /// Freed by the program, waiting for other streams.
    #[serde(rename = "active_pending_free")]
    ActivePendingFree,
    /// Free.
    #[serde(rename = "inactive")]
    Inactive,
}

/// A block inside a segment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Encode, Decode)]
pub struct BlockInfo {
    /// Block address.
    pub addr: u64,
    /// Block size (rounded).
    pub size: u64,
    /// Requested size.
    #[serde(default)]
    pub requested_size: u64,
    /// State.
    pub state: BlockState,
    /// Stack (interned), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stack: Option<StackId>,
}

/// One allocator segment with its blocks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Encode, Decode)]
pub struct SegmentState {
    /// Start or end of the trace.
    pub at: StateAt,
    /// Segment base address.
    pub addr: u64,
    /// Segment size.
    pub total_size: u64,
    /// Stream.
    #[serde(default)]
    pub stream: i64,
    /// Pool.
    pub pool: SegmentPool,
    /// Whether it is an expandable segment's mapped range.
    #[serde(default)]
    pub is_expandable: bool,
    /// `segment_pool_id` (0, 0 for the default pool).
    #[serde(default)]
    pub pool_id: (i64, i64),
    /// Stack of the segment's allocation, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stack: Option<StackId>,
    /// Blocks, by address.
    pub blocks: Vec<BlockInfo>,
}

/// A snapshot's `snapshot` trace entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Encode, Decode)]
pub struct SnapshotPoint {
    /// Total active bytes at that point.
    pub active_bytes: u64,
}
