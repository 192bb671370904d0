//! The raw event: 64 bytes of plain old data a hook fills and the writer translates. Shared by
//! the hot path ([`crate::raw`]), the rings ([`crate::ring`]) and the writer, and depending on
//! none of them.

use trace::Api;

/// What a [`RawEvent`] is; the writer turns each into one `trace::Event`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum RawKind {
    /// `trace::Event::Alloc`.
    Alloc = 1,
    /// `trace::Event::Free`.
    Free = 2,
    /// `trace::Event::Vmm`; the op is in [`RawEvent::sub`].
    Vmm = 3,
    /// `trace::Event::KernelLaunch`; [`RawEvent::aux`] holds the function, `sub` its [`FuncKind`].
    Launch = 4,
    /// `trace::Event::PoolTrim`: `addr` = pool, `size` = bytes to keep.
    PoolTrim = 5,
    /// `trace::Event::Marker`: `aux` owns a `CString::into_raw` pointer the writer frees, or is 0
    /// (no text).
    Marker = 6,
}

/// How the writer resolves a launch's kernel name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum FuncKind {
    /// A runtime host stub address: `dladdr`.
    HostStub = 0,
    /// A driver `CUfunction`: `cuFuncGetName`.
    CuFunction = 1,
    /// A graph launch: no single kernel.
    Graph = 2,
}

/// One intercepted call, as the hook saw it: 64 bytes of plain old data, copied into the
/// thread's ring. The thread id is the ring's, not the event's. Field use by [`RawKind`]:
///
/// | kind | `addr` | `size` | `aux` | `offset` | `caller` |
/// |---|---|---|---|---|---|
/// | Alloc, Free | address | bytes | – | – | return address |
/// | Vmm | address | bytes | physical handle | offset in it | return address |
/// | Launch | function | grid x \| y << 32 | grid z \| block x << 32 | block y \| z << 32 | dynamic shared memory |
/// | PoolTrim | pool | bytes to keep | – | – | – |
/// | Marker | – | – | owned text | – | – |
#[derive(Debug, Clone, Copy)]
#[repr(C)]
pub struct RawEvent {
    /// [`crate::clock::stamp`] (the writer maps it to CLOCK_MONOTONIC).
    pub ts: u64,
    /// See the table.
    pub addr: u64,
    /// See the table.
    pub size: u64,
    /// Stream handle.
    pub stream: u64,
    /// See the table.
    pub aux: u64,
    /// See the table.
    pub offset: u64,
    /// See the table.
    pub caller: u64,
    /// The entry point (stored as the enum: no code lookup on the hot path).
    pub api: Api,
    /// CUDA result code (`cudaError_t` and `CUresult` values are below 1000; see [`result16`]).
    pub result: i16,
    /// What the event is.
    pub kind: RawKind,
    /// `MemoryKind` index, `VmmOp` index or [`FuncKind`].
    pub sub: u8,
}

const _: () = assert!(std::mem::size_of::<RawEvent>() == 64);

impl Default for RawEvent {
    fn default() -> Self {
        RawEvent {
            ts: 0,
            addr: 0,
            size: 0,
            stream: 0,
            aux: 0,
            offset: 0,
            caller: 0,
            api: Api::Unknown(0),
            result: 0,
            // A marker without text: the writer writes it as an empty marker; nothing to free.
            kind: RawKind::Marker,
            sub: 0,
        }
    }
}

/// A CUDA result code in the event's 16 bits. Every `cudaError_t` and `CUresult` fits; a value
/// that does not (none exists) saturates rather than wrapping to success.
#[inline(always)]
pub fn result16(r: i32) -> i16 {
    r.clamp(i32::from(i16::MIN), i32::from(i16::MAX)) as i16
}

/// Two u32 in one u64 (launch dimensions).
#[inline(always)]
pub fn pack(lo: u32, hi: u32) -> u64 {
    u64::from(lo) | (u64::from(hi) << 32)
}

/// The inverse of [`pack`].
pub fn unpack(v: u64) -> (u32, u32) {
    (v as u32, (v >> 32) as u32)
}

/// Memory kinds as `RawEvent::sub` (the writer maps them to `trace::MemoryKind`).
pub mod mem {
    /// Device memory.
    pub const DEVICE: u8 = 0;
    /// Pinned host memory.
    pub const PINNED_HOST: u8 = 1;
    /// Managed memory.
    pub const MANAGED: u8 = 2;
    /// VMM physical handle.
    pub const PHYSICAL: u8 = 3;
    /// Registered host memory.
    pub const HOST_REGISTERED: u8 = 4;
    /// IPC import.
    pub const IPC_IMPORT: u8 = 5;
}

/// VMM operations as `RawEvent::sub`.
pub mod vmm {
    /// `cuMemAddressReserve`.
    pub const RESERVE: u8 = 0;
    /// `cuMemAddressFree`.
    pub const ADDRESS_FREE: u8 = 1;
    /// `cuMemMap`.
    pub const MAP: u8 = 2;
    /// `cuMemUnmap`.
    pub const UNMAP: u8 = 3;
    /// `cuMemSetAccess`.
    pub const SET_ACCESS: u8 = 4;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dimensions_round_trip() {
        for (lo, hi) in [(0, 0), (1, u32::MAX), (u32::MAX, 7)] {
            assert_eq!(unpack(pack(lo, hi)), (lo, hi));
        }
    }
}
