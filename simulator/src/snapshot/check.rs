//! The one consistency check of a snapshot's segments, made when it is read, so that every
//! command (`replay`, `validate`, `stats`, `convert`) refuses the same damaged files: a segment
//! no device could hold, or two segments over one address range.

use super::model::Segment;
use super::SnapshotError;

/// Refuses segments larger than any device ([`crate::alloc::MAX_SEGMENT`]), ending past the
/// address space, or overlapping another segment of their device.
pub(super) fn segments(segments: &[Segment], file: &str) -> Result<(), SnapshotError> {
    let bad = |i: usize, field: &str, expected: String| SnapshotError::Field {
        file: file.to_string(),
        field: format!("segments[{i}].{field}"),
        expected,
    };
    for (i, s) in segments.iter().enumerate() {
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
