//! Theoretical occupancy: how many blocks of a kernel can be resident on one SM, following the
//! rules of NVIDIA's CUDA Occupancy Calculator spreadsheet (the same rules
//! `cudaOccupancyMaxActiveBlocksPerMultiprocessor` applies).
//!
//! Per block, the calculator takes the minimum of four limits:
//! - warps: `min(max blocks per SM, floor(max warps per SM / warps per block))`, with
//!   `warps per block = ceil(threads / 32)`;
//! - registers: registers are allocated per warp, `ceil(regs per thread × 32, 256)`; the warps an
//!   SM can hold are `floor(registers per SM / registers per warp)` rounded down to the warp
//!   allocation granularity (4), and the blocks are those warps divided by warps per block;
//! - shared memory: per block `ceil(static + dynamic + reserved, allocation unit)`, and the
//!   blocks are `floor(shared memory per SM / that)`;
//!
//! and occupancy is `active blocks × warps per block / max warps per SM`.
//!
//! Sources for the limits (the table below; KB = 1024 bytes):
//! - CUDA C++ Programming Guide (CUDA 13.1), Table 27 "Technical Specifications per Compute
//!   Capability" (max resident blocks, warps and threads per SM; 64 K registers per SM and per
//!   block; 255 registers per thread; shared memory per SM 64/164/100/100/228/228/100 KB and per
//!   block 64/163/99/99/227/227/99 KB for 7.5/8.0/8.6/8.9/9.0/10.0/12.0), and §20.6.4 for 7.0
//!   (96 KB shared memory capacity). §20.10.3 (12.0): "The 1 KB of shared memory not made
//!   available to a thread block is reserved for system use" (likewise on 8.x and 9.0: per-SM
//!   capacity minus per-block maximum is 1 KB).
//! - CUDA Occupancy Calculator spreadsheet (toolkit 11.1 rows for 7.0, 7.5, 8.0, 8.6, as
//!   transcribed in maxvonbuelow/rtmemtracer `occupancy.h` and xmartlabs/cuda-calculator):
//!   register allocation unit 256 with warp granularity, warp allocation granularity 4, shared
//!   memory allocation unit 256 bytes on 7.x and 128 bytes on 8.x, 1024 bytes of runtime
//!   shared memory per block on 8.x.
//! - CUDA C++ Best Practices Guide §11.1.1: "register allocations are rounded up to the nearest
//!   256 registers per warp".
//! - Blackwell Tuning Guide §1.4.1.1: 10.0 has 64 warps and 32 blocks per SM, 228 KB per SM,
//!   227 KB per block.
//!
//! Not sourced directly (carried over, stated here so nobody mistakes them for looked-up facts):
//! the 128-byte shared memory allocation unit, warp granularity 4 and 1 KB reservation for
//! 8.9, 9.0, 10.0 and 12.0 are the 8.x spreadsheet values. For 12.0 the sources disagree: the
//! Programming Guide table gives 24 blocks and 100 KB per SM, the Blackwell Tuning Guide 32
//! blocks and 128 KB; the table (the reference for `cudaDeviceProp`) is used.
//!
//! The shared-memory limit assumes the largest carveout; the driver may pick a smaller one, so
//! for shared-memory-light kernels this is an upper bound, as in NVIDIA's calculator.

use serde::Serialize;

/// Threads per warp on every NVIDIA GPU so far.
pub const WARP_SIZE: u32 = 32;

/// Per-SM resource limits of one compute capability.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct SmLimits {
    /// Compute capability (major, minor).
    pub compute_capability: (u32, u32),
    /// Maximum threads per block.
    pub max_threads_per_block: u32,
    /// Maximum resident warps per SM.
    pub max_warps_per_sm: u32,
    /// Maximum resident blocks per SM.
    pub max_blocks_per_sm: u32,
    /// 32-bit registers per SM.
    pub registers_per_sm: u32,
    /// Maximum 32-bit registers per block.
    pub max_registers_per_block: u32,
    /// Maximum registers per thread.
    pub max_registers_per_thread: u32,
    /// Registers are allocated per warp in units of this many.
    pub register_alloc_unit: u32,
    /// Warps per SM limited by registers are rounded down to a multiple of this.
    pub warp_alloc_granularity: u32,
    /// Shared memory per SM at the largest carveout, bytes.
    pub shared_mem_per_sm: u32,
    /// Maximum shared memory one block may use (opt-in), bytes.
    pub max_shared_mem_per_block: u32,
    /// Shared memory is allocated per block in units of this many bytes.
    pub shared_mem_alloc_unit: u32,
    /// Shared memory the runtime reserves per block, bytes.
    pub reserved_shared_mem_per_block: u32,
}

const KB: u32 = 1024;

const fn limits(
    cc: (u32, u32),
    warps: u32,
    blocks: u32,
    smem_sm_kb: u32,
    smem_block_kb: u32,
    smem_unit: u32,
    reserved: u32,
) -> SmLimits {
    SmLimits {
        compute_capability: cc,
        max_threads_per_block: 1024,
        max_warps_per_sm: warps,
        max_blocks_per_sm: blocks,
        registers_per_sm: 64 * KB,
        max_registers_per_block: 64 * KB,
        max_registers_per_thread: 255,
        register_alloc_unit: 256,
        warp_alloc_granularity: 4,
        shared_mem_per_sm: smem_sm_kb * KB,
        max_shared_mem_per_block: smem_block_kb * KB,
        shared_mem_alloc_unit: smem_unit,
        reserved_shared_mem_per_block: reserved,
    }
}

/// Every compute capability this calculator knows (see the module docs for sources).
pub const KNOWN: [SmLimits; 8] = [
    limits((7, 0), 64, 32, 96, 96, 256, 0),
    limits((7, 5), 32, 16, 64, 64, 256, 0),
    limits((8, 0), 64, 32, 164, 163, 128, KB),
    limits((8, 6), 48, 16, 100, 99, 128, KB),
    limits((8, 9), 48, 24, 100, 99, 128, KB),
    limits((9, 0), 64, 32, 228, 227, 128, KB),
    limits((10, 0), 64, 32, 228, 227, 128, KB),
    limits((12, 0), 48, 24, 100, 99, 128, KB),
];

impl SmLimits {
    /// The limits of a compute capability, if known.
    pub fn for_cc(cc: (u32, u32)) -> Option<&'static SmLimits> {
        KNOWN.iter().find(|l| l.compute_capability == cc)
    }
}

/// What a block needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockResources {
    /// Threads per block (`block.x × block.y × block.z`).
    pub threads: u32,
    /// Registers per thread.
    pub registers_per_thread: u32,
    /// Static plus dynamic shared memory per block, bytes.
    pub shared_mem: u32,
}

/// Which limit decided the resident block count (ties go to the first in this order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Limiter {
    /// Maximum warps per SM.
    Warps,
    /// Maximum blocks per SM.
    Blocks,
    /// The register file.
    Registers,
    /// Shared memory.
    SharedMemory,
}

/// Theoretical occupancy of one launch configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Occupancy {
    /// Resident blocks per SM.
    pub active_blocks_per_sm: u32,
    /// Warps per block.
    pub warps_per_block: u32,
    /// Resident warps per SM.
    pub active_warps_per_sm: u32,
    /// The SM's maximum resident warps.
    pub max_warps_per_sm: u32,
    /// The binding limit.
    pub limiter: Limiter,
}

impl Occupancy {
    /// Resident warps over the maximum, 0..=1.
    pub fn fraction(&self) -> f64 {
        f64::from(self.active_warps_per_sm) / f64::from(self.max_warps_per_sm)
    }
}

/// A configuration that cannot launch on the device.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OccupancyError {
    /// A block with no threads.
    #[error("block has 0 threads: expected 1..={max}")]
    EmptyBlock {
        /// The device maximum.
        max: u32,
    },
    /// More threads per block than the device allows.
    #[error("block has {threads} threads: expected at most {max} on compute capability {}.{}", .cc.0, .cc.1)]
    BlockTooLarge {
        /// Threads asked for.
        threads: u32,
        /// The device maximum.
        max: u32,
        /// Compute capability.
        cc: (u32, u32),
    },
    /// More registers per thread than the architecture has.
    #[error("{registers} registers per thread: expected at most {max}")]
    TooManyRegisters {
        /// Registers asked for.
        registers: u32,
        /// The maximum.
        max: u32,
    },
    /// The block's registers exceed the per-block register limit.
    #[error("block needs {needed} registers (allocated per warp): expected at most {max}")]
    BlockRegistersTooMany {
        /// Registers the block would be allocated.
        needed: u32,
        /// The per-block maximum.
        max: u32,
    },
    /// The block's shared memory exceeds the per-block maximum.
    #[error("block uses {bytes} bytes of shared memory: expected at most {max} on compute capability {}.{}", .cc.0, .cc.1)]
    SharedMemoryTooLarge {
        /// Bytes asked for.
        bytes: u32,
        /// The per-block maximum.
        max: u32,
        /// Compute capability.
        cc: (u32, u32),
    },
    /// Registers rounded to the warp allocation granularity leave room for no whole block, so
    /// the launch would fail ("too many resources requested").
    #[error("no block fits: {limiter:?} allow 0 resident blocks of {warps_per_block} warps")]
    NoBlockFits {
        /// The limit that allows none.
        limiter: Limiter,
        /// Warps per block.
        warps_per_block: u32,
    },
}

fn round_up(x: u64, unit: u64) -> u64 {
    x.div_ceil(unit) * unit
}

/// Theoretical occupancy of `res` on an SM with `lim`.
pub fn occupancy(lim: &SmLimits, res: BlockResources) -> Result<Occupancy, OccupancyError> {
    if res.threads == 0 {
        return Err(OccupancyError::EmptyBlock { max: lim.max_threads_per_block });
    }
    if res.threads > lim.max_threads_per_block {
        return Err(OccupancyError::BlockTooLarge {
            threads: res.threads,
            max: lim.max_threads_per_block,
            cc: lim.compute_capability,
        });
    }
    if res.registers_per_thread > lim.max_registers_per_thread {
        return Err(OccupancyError::TooManyRegisters {
            registers: res.registers_per_thread,
            max: lim.max_registers_per_thread,
        });
    }
    if res.shared_mem > lim.max_shared_mem_per_block {
        return Err(OccupancyError::SharedMemoryTooLarge {
            bytes: res.shared_mem,
            max: lim.max_shared_mem_per_block,
            cc: lim.compute_capability,
        });
    }
    let warps_per_block = res.threads.div_ceil(WARP_SIZE);

    let by_warps = lim.max_warps_per_sm / warps_per_block;
    let mut best = (by_warps, Limiter::Warps);
    if lim.max_blocks_per_sm < best.0 {
        best = (lim.max_blocks_per_sm, Limiter::Blocks);
    }

    if res.registers_per_thread > 0 {
        let per_warp =
            round_up(u64::from(res.registers_per_thread) * u64::from(WARP_SIZE), u64::from(lim.register_alloc_unit));
        let per_block = per_warp * u64::from(warps_per_block);
        if per_block > u64::from(lim.max_registers_per_block) {
            return Err(OccupancyError::BlockRegistersTooMany {
                needed: u32::try_from(per_block).unwrap_or(u32::MAX),
                max: lim.max_registers_per_block,
            });
        }
        let warps = u64::from(lim.max_registers_per_block) / per_warp;
        let warps = warps / u64::from(lim.warp_alloc_granularity) * u64::from(lim.warp_alloc_granularity);
        let files = u64::from(lim.registers_per_sm / lim.max_registers_per_block);
        let by_regs = u32::try_from(warps / u64::from(warps_per_block) * files).unwrap_or(u32::MAX);
        if by_regs < best.0 {
            best = (by_regs, Limiter::Registers);
        }
    }

    let smem = u64::from(res.shared_mem) + u64::from(lim.reserved_shared_mem_per_block);
    if smem > 0 {
        let per_block = round_up(smem, u64::from(lim.shared_mem_alloc_unit));
        let by_smem = u32::try_from(u64::from(lim.shared_mem_per_sm) / per_block).unwrap_or(u32::MAX);
        if by_smem < best.0 {
            best = (by_smem, Limiter::SharedMemory);
        }
    }

    let (blocks, limiter) = best;
    if blocks == 0 {
        return Err(OccupancyError::NoBlockFits { limiter, warps_per_block });
    }
    Ok(Occupancy {
        active_blocks_per_sm: blocks,
        warps_per_block,
        active_warps_per_sm: blocks * warps_per_block,
        max_warps_per_sm: lim.max_warps_per_sm,
        limiter,
    })
}
