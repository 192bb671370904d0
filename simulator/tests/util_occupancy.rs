//! The occupancy calculator on CUDA's documented cases, launch failures, and invariants.

use proptest::prelude::*;
use simulator::utilization::{occupancy, BlockResources, Limiter, OccupancyError, SmLimits};

const KB: u32 = 1024;

/// Compute capability, threads per block, registers per thread, shared memory bytes.
type Config = ((u32, u32), u32, u32, u32);

fn calc(cc: (u32, u32), threads: u32, registers: u32, shared_mem: u32) -> Result<(u32, Limiter, f64), OccupancyError> {
    let lim = SmLimits::for_cc(cc).unwrap_or_else(|| panic!("compute capability {cc:?} missing from the table"));
    occupancy(lim, BlockResources { threads, registers_per_thread: registers, shared_mem })
        .map(|o| (o.active_blocks_per_sm, o.limiter, o.fraction()))
}

/// `expect`: resident blocks per SM, the binding limit, and the occupancy.
fn check(cc: (u32, u32), threads: u32, registers: u32, shared_mem: u32, expect: (u32, Limiter, f64)) {
    let got = calc(cc, threads, registers, shared_mem)
        .unwrap_or_else(|e| panic!("cc {cc:?} {threads} threads {registers} regs {shared_mem} B: {e}"));
    assert_eq!((got.0, got.1), (expect.0, expect.1), "cc {cc:?} {threads} threads {registers} regs {shared_mem} B");
    assert!((got.2 - expect.2).abs() < 1e-12, "cc {cc:?}: occupancy {} != {}", got.2, expect.2);
}

#[test]
fn programming_guide_register_example() {
    // Programming Guide, "Multiprocessor Level": 512-thread blocks with 64 registers fill the
    // 64 K register file with two blocks (32 warps); with 65 registers only one (16 warps) fits.
    // The guide states it for 6.x; 7.0 and 8.0 have the same register file and warp limits.
    for cc in [(7, 0), (8, 0), (9, 0)] {
        check(cc, 512, 64, 0, (2, Limiter::Registers, 0.5));
        check(cc, 512, 65, 0, (1, Limiter::Registers, 0.25));
    }
}

#[test]
fn calculator_cases() {
    use Limiter::*;
    let cases: &[(Config, (u32, Limiter, f64))] = &[
        // 256 threads × 32 registers: 8 blocks fill the 64 warps of 8.0.
        (((8, 0), 256, 32, 0), (8, Warps, 1.0)),
        // 1024-thread blocks: one per SM on 7.5 (32 warps) and on 8.6 (48 warps: 2/3), two on 9.0.
        (((7, 5), 1024, 0, 0), (1, Warps, 1.0)),
        (((8, 6), 1024, 0, 0), (1, Warps, 32.0 / 48.0)),
        (((8, 6), 768, 0, 0), (2, Warps, 1.0)),
        (((10, 0), 1024, 32, 0), (2, Warps, 1.0)),
        (((12, 0), 256, 0, 0), (6, Warps, 1.0)),
        // Small blocks hit the resident-block limit: 32 on 8.0, 16 on 8.6, 24 on 8.9.
        (((8, 0), 32, 0, 0), (32, Blocks, 0.5)),
        (((8, 6), 64, 0, 0), (16, Blocks, 32.0 / 48.0)),
        (((8, 9), 64, 0, 0), (24, Warps, 1.0)),
        // Register-limited with the warp allocation granularity: 40 registers → 1280 per warp,
        // 65536 / 1280 = 51 warps, rounded down to 48 → 16 blocks of 3 warps (17 without the
        // rounding), 12 blocks of 4.
        (((7, 0), 96, 40, 0), (16, Registers, 0.75)),
        (((7, 0), 128, 40, 0), (12, Registers, 0.75)),
        // Shared-memory-limited, with the 1 KB the runtime reserves per block on 8.x/9.0:
        // 48 KB + 1 KB per block in 164 KB → 3 blocks.
        (((8, 0), 128, 32, 48 * KB), (3, SharedMemory, 12.0 / 64.0)),
        // GPU Glossary's H100 example (32 threads, 8 registers, 12 KB): 228 KB / 12 KB = 19 without
        // the reservation; CUDA's rule adds 1 KB per block: 233472 / 13312 → 17.
        (((9, 0), 32, 8, 12 * KB), (17, SharedMemory, 17.0 / 64.0)),
        // The largest block allocation leaves room for one block.
        (((9, 0), 256, 32, 227 * KB), (1, SharedMemory, 8.0 / 64.0)),
        (((8, 0), 256, 32, 163 * KB), (1, SharedMemory, 8.0 / 64.0)),
        // 7.x reserves nothing: 96 KB / 32 KB = 3 blocks.
        (((7, 0), 256, 32, 32 * KB), (3, SharedMemory, 24.0 / 64.0)),
        // Shared memory rounds up to the allocation unit: 7.5 (256 B): 4097 B → 4352 B → 15 blocks.
        (((7, 5), 32, 0, 4097), (15, SharedMemory, 15.0 / 32.0)),
        // 8.0 (128 B units, +1 KB): 4097 B → 5248 B, and 167936 / 5248 = 32 exactly: a tie with
        // the block limit, which binds because ties go to the earlier limit.
        (((8, 0), 32, 0, 4097), (32, Blocks, 0.5)),
    ];
    for &((cc, t, r, s), expect) in cases {
        check(cc, t, r, s, expect);
    }
}

#[test]
fn launch_failures() {
    let cases: &[(Config, &str)] = &[
        (((8, 0), 0, 32, 0), "block has 0 threads"),
        (((8, 0), 1025, 32, 0), "block has 1025 threads: expected at most 1024"),
        (((8, 0), 256, 256, 0), "256 registers per thread: expected at most 255"),
        (((8, 0), 1024, 65, 0), "block needs 73728 registers"),
        (((8, 0), 256, 32, 163 * KB + 1), "expected at most 166912 on compute capability 8.0"),
        (((7, 5), 256, 32, 64 * KB + 1), "expected at most 65536 on compute capability 7.5"),
        // 800 threads × 80 registers fit the per-block limit (64000) but the warp granularity
        // leaves 24 warps for a 25-warp block.
        (((8, 0), 800, 80, 0), "no block fits"),
    ];
    for &((cc, t, r, s), msg) in cases {
        match calc(cc, t, r, s) {
            Ok(o) => panic!("cc {cc:?} {t} threads {r} regs {s} B: expected an error, got {o:?}"),
            Err(e) => assert!(e.to_string().contains(msg), "{e} does not contain {msg:?}"),
        }
    }
}

#[test]
fn table_is_self_consistent() {
    for cc in [(7, 0), (7, 5), (8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (12, 0)] {
        let l = SmLimits::for_cc(cc).unwrap_or_else(|| panic!("{cc:?} missing"));
        // Per-SM capacity = per-block maximum + the runtime's reservation (Programming Guide).
        assert_eq!(l.shared_mem_per_sm - l.max_shared_mem_per_block, l.reserved_shared_mem_per_block, "{cc:?}");
        assert!(l.max_warps_per_sm * 32 >= l.max_threads_per_block, "{cc:?}");
    }
    assert!(SmLimits::for_cc((6, 1)).is_none());
}

proptest! {
    #[test]
    fn invariants(ci in 0usize..8, threads in 1u32..=1024, regs in 0u32..=255, smem_frac in 0.0f64..=1.0) {
        let lim = &simulator::utilization::occupancy::KNOWN[ci];
        let smem = (f64::from(lim.max_shared_mem_per_block) * smem_frac) as u32;
        let res = BlockResources { threads, registers_per_thread: regs, shared_mem: smem };
        if let Ok(o) = occupancy(lim, res) {
            prop_assert!(o.active_blocks_per_sm >= 1 && o.active_blocks_per_sm <= lim.max_blocks_per_sm);
            prop_assert!(o.active_warps_per_sm <= lim.max_warps_per_sm);
            prop_assert!(o.fraction() > 0.0 && o.fraction() <= 1.0);
            // More registers or more shared memory never lets more blocks in.
            for more in [
                BlockResources { registers_per_thread: regs + 1, ..res },
                BlockResources { shared_mem: smem.saturating_add(128), ..res },
            ] {
                if let Ok(m) = occupancy(lim, more) {
                    prop_assert!(m.active_blocks_per_sm <= o.active_blocks_per_sm, "{more:?}: {m:?} vs {o:?}");
                }
            }
        }
    }
}
