//! The one consistency check of a snapshot's segments, made when it is read, so that every
//! command (`replay`, `validate`, `stats`, `convert`) refuses the same damaged files: an empty
//! segment or one no device could hold, two segments over one address range, or a block outside its segment.

use super::model::Segment;
use super::SnapshotError;

/// Refuses segments larger than any device ([`crate::alloc::MAX_SEGMENT`]), ending past the
/// address space, overlapping another segment of their device, or holding a block that lies
/// outside them or over another of their blocks.
pub(super) fn segments(segments: &[Segment], file: &str) -> Result<(), SnapshotError> {
    let bad = |i: usize, field: &str, expected: String| SnapshotError::Field {
        file: file.to_string(),
        field: format!("segments[{i}].{field}"),
        expected,
    };
    for (i, s) in segments.iter().enumerate() {
        // The model refuses an empty segment when it rebuilds the start state: `validate` failed
        // on it, `replay` rejected it as a request, `stats` said nothing. PyTorch reports a
        // segment as the blocks that tile it, so one of 0 B is damage, said here for all.
        if s.total_size == 0 {
            return Err(bad(
                i,
                "total_size",
                format!("a segment of at least one byte, found 0 B at {:#x}: a damaged snapshot", s.address),
            ));
        }
        if s.total_size > crate::alloc::MAX_SEGMENT {
            return Err(bad(
                i,
                "total_size",
                format!(
                    "a segment size no device exceeds (at most {} B), found {} B: a damaged snapshot",
                    crate::alloc::MAX_SEGMENT,
                    s.total_size
                ),
            ));
        }
        if s.address.checked_add(s.total_size).is_none() {
            return Err(bad(
                i,
                "address",
                format!(
                    "a segment inside the address space, found {:#x} + {} B past 2^64: a damaged snapshot",
                    s.address, s.total_size
                ),
            ));
        }
        blocks(i, s, &bad)?;
    }
    let mut order: Vec<usize> = (0..segments.len()).collect();
    order.sort_by_key(|&i| (segments[i].device, segments[i].address));
    for w in order.windows(2) {
        let (a, b) = (&segments[w[0]], &segments[w[1]]);
        if a.device == b.device && a.address + a.total_size > b.address {
            return Err(bad(
                w[1],
                "address",
                format!(
                    "segments that do not overlap, found segments[{}] ({:#x} + {} B) and segments[{}] ({:#x} + {} B) \
                     over one address range on device {}: a damaged snapshot (its segments or their total_size)",
                    w[0], a.address, a.total_size, w[1], b.address, b.total_size, a.device
                ),
            ));
        }
    }
    Ok(())
}

/// PyTorch reports a segment as the blocks that tile it (its `total_size` is their sum), so a
/// block reaching past its segment or over the block before it is damage, not a state the
/// allocator can be in: replayed, it was cut to fit and the peaks came out of a smaller block.
fn blocks(i: usize, s: &Segment, bad: &dyn Fn(usize, &str, String) -> SnapshotError) -> Result<(), SnapshotError> {
    let end = s.address + s.total_size;
    let mut prev_end = s.address;
    for (j, b) in s.blocks.iter().enumerate() {
        let block_end = b.address.checked_add(b.size);
        let field = format!("blocks[{j}]");
        if b.address < s.address || block_end.is_none_or(|e| e > end) {
            return Err(bad(
                i,
                &field,
                format!(
                    "a block inside its segment ({:#x} + {} B), found a block at {:#x} of {} B: a damaged snapshot \
                     (its blocks or the segment's total_size)",
                    s.address, s.total_size, b.address, b.size
                ),
            ));
        }
        if b.address < prev_end {
            return Err(bad(
                i,
                &field,
                format!(
                    "blocks in address order that do not overlap, found a block at {:#x} of {} B that starts before \
                     the block before it ends ({:#x}): a damaged snapshot",
                    b.address, b.size, prev_end
                ),
            ));
        }
        prev_end = b.address + b.size;
    }
    Ok(())
}
