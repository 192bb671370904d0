//! Which allocations and frees a replay applies as the caching allocator's requests, and why it
//! leaves the others out: the one rule, for the replay's [`Classifier`](super::Classifier) and
//! for a reader that must agree with the replay without running it (`memsim stats` telling a
//! damaged trace's frees from frees of blocks allocated before the trace began).

use hashbrown::HashMap;
use trace::{Header, Level, MemoryKind, Origin};

/// The rule, for one trace: its shape, and the caller modules it has named so far.
#[derive(Debug, Clone, Default)]
pub struct Requests {
    /// Device-level traces taken with the cache off: each `cudaMalloc` is a request.
    device_level_requests: bool,
    /// Caller modules' names by name id.
    names: HashMap<u32, String>,
}

/// What the replay does with an allocation or free.
pub(super) enum Decision {
    Apply,
    /// Not an allocator request for device memory (an outcome, pinned host memory): counted only.
    NotRequest,
    OtherCaller(String),
    Failed,
}

impl Requests {
    /// The rule for a trace with this header, before its first record.
    pub fn new(header: &Header) -> Requests {
        Requests::with(device_level_requests(header))
    }

    pub(super) fn with(device_level_requests: bool) -> Requests {
        Requests { device_level_requests, names: HashMap::new() }
    }

    /// Notes the trace's name definition `id` (a caller module's name, when a request names it).
    #[inline]
    pub fn name(&mut self, id: u32, text: String) {
        self.names.insert(id, text);
    }

    /// Whether the replay applies an allocation or free with these fields as an allocator
    /// request (a free of an address no live block holds, it then rejects).
    pub fn applies(&self, origin: Origin, mem: MemoryKind, caller: Option<u32>, result: i32) -> bool {
        matches!(self.decide(origin, mem, caller, result), Decision::Apply)
    }

    /// Whether an allocation-like event is one the replay applies; the common request without a
    /// call.
    #[inline(always)]
    pub(super) fn decide(&self, origin: Origin, mem: MemoryKind, caller: Option<u32>, result: i32) -> Decision {
        if plain_request(self.device_level_requests, origin, mem, caller, result) {
            return Decision::Apply;
        }
        self.decide_rare(origin, mem, caller, result)
    }

    /// Whether a call the replay does not apply held (or released) device memory beside the
    /// caching allocator: a successful call for device-resident memory that is not the
    /// allocator's own segment (an outcome, in an allocator-level trace, is one).
    pub(super) fn holds_device_memory(&self, origin: Origin, mem: MemoryKind, result: i32) -> bool {
        result == 0 && mem.is_device() && (self.device_level_requests || origin == Origin::Request)
    }

    /// Whether an event is the allocator's own release of cached memory, as a run recorded it
    /// (an outcome, in an allocator-level trace, of a call that releases).
    pub(super) fn released(&self, origin: Origin, releasing: bool) -> bool {
        releasing && origin == Origin::Outcome && !self.device_level_requests
    }

    #[inline(never)]
    fn decide_rare(&self, origin: Origin, mem: MemoryKind, caller: Option<u32>, result: i32) -> Decision {
        let is_request = if self.device_level_requests { mem == MemoryKind::Device } else { origin == Origin::Request };
        if !is_request || mem != MemoryKind::Device {
            return Decision::NotRequest;
        }
        if let Some(id) = caller {
            let name = self.names.get(&id).cloned().unwrap_or_else(|| format!("<name {id}>"));
            if !is_framework_allocator(&name) {
                return Decision::OtherCaller(name);
            }
        }
        if result != 0 {
            return Decision::Failed;
        }
        Decision::Apply
    }
}

/// Whether a trace's device-level calls are the allocator's requests: taken with the cache off,
/// each `cudaMalloc` PyTorch makes is one.
pub(super) fn device_level_requests(header: &Header) -> bool {
    header.caching_disabled && header.level == Level::Device
}

/// Whether a caller module is PyTorch's caching allocator (or unknown, which producers that only
/// see the allocator leave unset).
fn is_framework_allocator(module: &str) -> bool {
    let base = module.rsplit('/').next().unwrap_or(module);
    base.starts_with("libc10_cuda") || base.starts_with("libc10_hip") || base.starts_with("libtorch_cuda")
}

/// The common request, which a replay applies without looking further: an allocator request for
/// device memory with no caller module and no failure.
#[inline(always)]
fn plain_request(
    device_level_requests: bool,
    origin: Origin,
    mem: MemoryKind,
    caller: Option<u32>,
    result: i32,
) -> bool {
    !device_level_requests && origin == Origin::Request && mem == MemoryKind::Device && caller.is_none() && result == 0
}
