//! Size rounding and segment sizing (spec §1–§3).

/// Rounding quantum and smallest block.
pub const K_MIN_BLOCK_SIZE: u64 = 512;
/// Largest rounded request served by the small pool (exactly 1 MiB is small).
pub const K_SMALL_SIZE: u64 = 1 << 20;
/// Small-pool segment size and small expandable page.
pub const K_SMALL_BUFFER: u64 = 2 << 20;
/// Segment size for requests in (1 MiB, 10 MiB) and the large expandable page.
pub const K_LARGE_BUFFER: u64 = 20 << 20;
/// Requests at or above this get a segment of their own rounded size.
pub const K_MIN_LARGE_ALLOC: u64 = 10 << 20;
/// Rounding for large segments.
pub const K_ROUND_LARGE: u64 = 2 << 20;
/// Number of power-of-two intervals in the divisions table: [1 MiB, 2 MiB) … [32 GiB, 64 GiB).
pub const ROUNDUP_INTERVALS: usize = 16;

/// Index into the divisions table for a size: `clamp(floor(log2 size) - 20, 0, 15)`.
pub fn divisions_index(size: u64) -> usize {
    if size == 0 {
        return 0;
    }
    let log = 63 - size.leading_zeros() as i64;
    (log - 20).clamp(0, ROUNDUP_INTERVALS as i64 - 1) as usize
}

/// `roundup_power2_next_division`: round up to the next of `divisions` equal steps between
/// consecutive powers of two.
pub fn roundup_power2_next_division(size: u64, divisions: u64) -> u64 {
    if size.is_power_of_two() || divisions == 0 {
        return size;
    }
    let floor = 1u64 << (63 - size.leading_zeros());
    let step = floor >> (63 - divisions.leading_zeros());
    if step == 0 {
        return floor.saturating_mul(2);
    }
    let low = size & !(step - 1);
    if low == size {
        size
    } else {
        low.saturating_add(step)
    }
}

/// `round_size`: the size the allocator actually looks for, given the divisions table.
pub fn round_size(size: u64, divisions: &[u64; ROUNDUP_INTERVALS]) -> u64 {
    if size < K_MIN_BLOCK_SIZE {
        return K_MIN_BLOCK_SIZE;
    }
    let d = divisions[divisions_index(size)];
    if d > 1 && size > K_MIN_BLOCK_SIZE.saturating_mul(d) {
        roundup_power2_next_division(size, d)
    } else {
        size.div_ceil(K_MIN_BLOCK_SIZE).saturating_mul(K_MIN_BLOCK_SIZE)
    }
}

/// `get_allocation_size`: the `cudaMalloc` size of a new segment for a rounded request.
pub fn get_allocation_size(size: u64) -> u64 {
    if size <= K_SMALL_SIZE {
        K_SMALL_BUFFER
    } else if size < K_MIN_LARGE_ALLOC {
        K_LARGE_BUFFER
    } else {
        size.div_ceil(K_ROUND_LARGE).saturating_mul(K_ROUND_LARGE)
    }
}

/// Whether a rounded request is served by the small pool.
pub fn is_small(size: u64) -> bool {
    size <= K_SMALL_SIZE
}
