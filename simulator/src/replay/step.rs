//! Records sorted for replay before they reach it: the two-phase form of
//! [`Replayer::observe`](super::Replayer::observe).
//!
//! Why: a replay is fed by a decoding thread. Deciding what a record means to the replay (a
//! plain allocator request, something the replay ignores, or a record that needs its full
//! handling) depends only on the record and on the trace's header, so that thread can do it.
//! The replay's own thread then reads a 32-byte [`Step`] instead of a 112-byte record and skips
//! the decision. [`Replayer::observe_step`] of a record's step leaves the replay exactly as
//! [`Replayer::observe`] of the record does (`tests/replay_steps.rs`).

use trace::{Category, Event, FreeStage, MemoryKind, Origin, Record, StateAt};

use super::Replayer;

/// A record as the replay will use it.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// An allocator request to allocate, with nothing unusual about it.
    Alloc {
        /// CUDA device ordinal.
        device: u32,
        /// What the tensor is, when the trace says.
        category: Option<Category>,
        /// The trace's address of the block.
        addr: u64,
        /// Requested bytes.
        size: u64,
        /// The stream it was allocated on.
        stream: i64,
    },
    /// An allocator request to free, with nothing unusual about it.
    Free {
        /// CUDA device ordinal.
        device: u32,
        /// Which stage of a free.
        stage: FreeStage,
        /// The trace's address of the block.
        addr: u64,
    },
    /// A record the replay counts and otherwise ignores (launches, kernel times, memory
    /// queries, stacks, ...).
    Skip,
    /// Any other record, handled as [`Replayer::observe`] handles it: names, control
    /// operations, markers, start state, and requests the replay leaves out or reports.
    Record(Box<Record>),
}

/// Sorts records into [`Step`]s; made by [`Replayer::classifier`], and `Send` so that a
/// decoding thread can own it.
#[derive(Debug, Clone, Copy)]
pub struct Classifier {
    /// Device-level traces taken with the cache off: each `cudaMalloc` is a request.
    device_level_requests: bool,
}

impl Classifier {
    /// What this record is to the replay.
    #[inline(always)]
    pub fn classify(&self, rec: Record) -> Step {
        // The record is taken apart by value, so that the hot arms drop nothing.
        let Record { ts_ns, tid, device: dev, event } = rec;
        let device = dev.unwrap_or(0);
        let plain =
            |origin, mem, caller, result| plain_request(self.device_level_requests, origin, mem, caller, result);
        let whole = |event: Event| Step::Record(Box::new(Record { ts_ns, tid, device: dev, event }));
        match event {
            Event::Alloc(a) if plain(a.origin, a.mem, a.caller, a.result) => {
                Step::Alloc { device, category: a.category, addr: a.addr, size: a.size, stream: a.stream }
            }
            Event::Free(f) if plain(f.origin, f.mem, f.caller, f.result) => {
                Step::Free { device, stage: f.stage, addr: f.addr }
            }
            e if counted_only(&e) => Step::Skip,
            e => whole(e),
        }
    }
}

/// The common request, which a replay applies without looking further: an allocator request for
/// device memory with no caller module and no failure. Anything else is for
/// `Replayer::wants_rare` to judge (and count when it leaves it out).
#[inline(always)]
pub(super) fn plain_request(
    device_level_requests: bool,
    origin: Origin,
    mem: MemoryKind,
    caller: Option<u32>,
    result: i32,
) -> bool {
    !device_level_requests && origin == Origin::Request && mem == MemoryKind::Device && caller.is_none() && result == 0
}

/// Whether a replay only counts this event: every kind but requests, names, control operations,
/// markers and a start state. Exhaustive, so that a new event kind needs a decision here.
pub(super) fn counted_only(e: &Event) -> bool {
    match e {
        Event::SegmentState(s) => s.at != StateAt::Start,
        Event::Vmm(_)
        | Event::KernelLaunch(_)
        | Event::KernelExec(_)
        | Event::MemInfo(_)
        | Event::Stack(_)
        | Event::Oom(_)
        | Event::PoolTrim(_)
        | Event::SnapshotPoint(_)
        | Event::ProcessExit(_)
        | Event::MemActivity(_) => true,
        Event::Alloc(_) | Event::Free(_) | Event::Name(_) | Event::Control(_) | Event::Marker(_) => false,
    }
}

impl Replayer {
    /// The classifier for [`Replayer::observe_step`]; `None` when this replay realises the
    /// trace ([`Replayer::realize`]), which needs every record whole.
    pub fn classifier(&self) -> Option<Classifier> {
        self.realized.is_none().then_some(Classifier { device_level_requests: self.device_level_requests })
    }

    /// Feed one record as its [`Step`], made by this replay's [`Replayer::classifier`].
    #[inline]
    pub fn observe_step(&mut self, step: &Step) {
        match *step {
            Step::Alloc { device, category, addr, size, stream } => {
                let index = self.index;
                self.index += 1;
                let req = self.alloc_request(addr, size, stream);
                self.apply(index, device, &req, Some((addr, category)), None);
            }
            Step::Free { device, stage, addr } => {
                let index = self.index;
                self.index += 1;
                self.apply(index, device, &super::free_request(stage, addr), None, None);
            }
            Step::Skip => self.index += 1,
            Step::Record(ref rec) => self.observe(rec),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_is_small() {
        // The point of a step is to carry less than a record across threads.
        assert!(std::mem::size_of::<Step>() <= 32, "Step is {} bytes", std::mem::size_of::<Step>());
    }
}
