//! Raw events and CUPTI records into trace records, with the running tally.

use std::ffi::{c_char, CString};

use trace::{
    Alloc, Event, Free, FreeStage, KernelExec, KernelLaunch, Marker, MemoryKind, Origin, PoolTrim, Record, Vmm, VmmOp,
};

use super::{free_owned, Ctx};
use crate::cupti::{Activity, Exec, Mem};
use crate::event::{mem, unpack, vmm, RawEvent, RawKind};

fn mem_kind(sub: u8) -> MemoryKind {
    match sub {
        mem::PINNED_HOST => MemoryKind::PinnedHost,
        mem::MANAGED => MemoryKind::Managed,
        mem::PHYSICAL => MemoryKind::Physical,
        mem::HOST_REGISTERED => MemoryKind::HostRegistered,
        mem::IPC_IMPORT => MemoryKind::IpcImport,
        _ => MemoryKind::Device,
    }
}

fn vmm_op(sub: u8) -> VmmOp {
    match sub {
        vmm::RESERVE => VmmOp::Reserve,
        vmm::ADDRESS_FREE => VmmOp::AddressFree,
        vmm::MAP => VmmOp::Map,
        vmm::UNMAP => VmmOp::Unmap,
        _ => VmmOp::SetAccess,
    }
}

impl Ctx {
    /// One CUPTI record.
    pub(super) fn cupti(&mut self, a: Activity) -> Result<(), trace::TraceError> {
        match a {
            Activity::Kernel(e) => self.exec(&e),
            Activity::Memory(m) => self.mem_activity(m),
        }
    }

    /// A CUPTI memory activity record (timestamp already on CLOCK_MONOTONIC).
    fn mem_activity(&mut self, m: Mem) -> Result<(), trace::TraceError> {
        if self.limit_hit {
            self.tally.over_limit += 1;
            return Ok(());
        }
        self.tally.cupti_mem += 1;
        self.tally.events += 1;
        let ts = Some(m.ts.saturating_sub(self.origin));
        let r = Record { ts_ns: ts, tid: None, device: Some(m.device), event: Event::MemActivity(m.event) };
        self.write_checked(&r)
    }

    /// A CUPTI kernel execution record (timestamps already on CLOCK_MONOTONIC).
    fn exec(&mut self, e: &Exec) -> Result<(), trace::TraceError> {
        if self.limit_hit {
            self.tally.over_limit += 1;
            return Ok(());
        }
        self.tally.execs += 1;
        let name = self.cupti_name(e.name)?;
        let exec = Event::KernelExec(KernelExec {
            start_ns: e.start.saturating_sub(self.origin),
            end_ns: e.end.saturating_sub(self.origin),
            name,
            grid: e.grid,
            block: e.block,
            registers_per_thread: e.registers,
            static_shared_mem: e.static_shared,
            dynamic_shared_mem: e.dynamic_shared,
            stream: i64::from(e.stream),
            correlation_id: e.correlation,
        });
        self.tally.events += 1;
        let r =
            Record { ts_ns: Some(e.start.saturating_sub(self.origin)), tid: None, device: Some(e.device), event: exec };
        self.write_checked(&r)
    }

    #[inline(always)]
    pub(super) fn handle(&mut self, tid: u32, ev: &RawEvent) -> Result<(), trace::TraceError> {
        if self.limit_hit {
            self.tally.over_limit += 1;
            free_owned(ev);
            return Ok(());
        }
        let api = ev.api;
        let result = i32::from(ev.result);
        let event = match ev.kind {
            RawKind::Alloc => {
                let caller = self.caller(ev.caller)?;
                let m = mem_kind(ev.sub);
                if result == 0 {
                    self.tally.allocs += u64::from(m.is_device());
                    self.tally.pinned += u64::from(m == MemoryKind::PinnedHost);
                    if m.is_device() {
                        self.tally.live.insert((m == MemoryKind::Physical, ev.addr), ev.size);
                        self.tally.live_bytes += ev.size;
                        self.tally.peak = self.tally.peak.max(self.tally.live_bytes);
                    }
                } else {
                    self.tally.failed += 1;
                }
                Event::Alloc(Alloc {
                    addr: ev.addr,
                    size: ev.size,
                    stream: ev.stream as i64,
                    mem: m,
                    api,
                    result,
                    origin: Origin::Outcome,
                    category: None,
                    caller,
                    stack: None,
                })
            }
            RawKind::Free => {
                let caller = self.caller(ev.caller)?;
                let m = mem_kind(ev.sub);
                let mut size = (ev.size != 0).then_some(ev.size);
                if result == 0 && m.is_device() {
                    self.tally.frees += 1;
                    if let Some(s) = self.tally.live.remove(&(m == MemoryKind::Physical, ev.addr)) {
                        self.tally.live_bytes -= s;
                        size = Some(s);
                    }
                } else if result != 0 {
                    self.tally.failed += 1;
                }
                Event::Free(Free {
                    addr: ev.addr,
                    size,
                    stream: ev.stream as i64,
                    mem: m,
                    api,
                    result,
                    origin: Origin::Outcome,
                    stage: FreeStage::Immediate,
                    caller,
                    stack: None,
                })
            }
            RawKind::Vmm => {
                self.tally.failed += u64::from(result != 0);
                let caller = self.caller(ev.caller)?;
                Event::Vmm(Vmm {
                    op: vmm_op(ev.sub),
                    addr: ev.addr,
                    size: ev.size,
                    handle: ev.aux,
                    offset: ev.offset,
                    api,
                    result,
                    origin: Origin::Outcome,
                    stream: 0,
                    caller,
                })
            }
            RawKind::Launch => {
                // As `memsim stats` counts them: a failed launch ran no kernel, and is a failed call.
                if result == 0 {
                    self.tally.launches += 1;
                } else {
                    self.tally.failed += 1;
                }
                let name = self.kernel(ev.sub, ev.addr)?;
                let ((gx, gy), (gz, bx), (by, bz)) = (unpack(ev.size), unpack(ev.aux), unpack(ev.offset));
                let launch = KernelLaunch {
                    api,
                    name,
                    grid: [gx, gy, gz],
                    block: [bx, by, bz],
                    shared_mem: ev.caller as u32,
                    stream: ev.stream as i64,
                    result,
                };
                // Launches are most of a trace: written without building a `Record`.
                self.tally.events += 1;
                let ts = self.clock.to_ns(ev.ts).saturating_sub(self.origin);
                self.w.write_launch(Some(ts), Some(tid), None, &launch)?;
                return self.check_limit();
            }
            RawKind::PoolTrim => {
                self.tally.failed += u64::from(result != 0);
                Event::PoolTrim(PoolTrim { pool: ev.addr, min_bytes_to_keep: ev.size, api, result })
            }
            RawKind::Marker if ev.aux == 0 => Event::Marker(Marker { text: String::new() }),
            RawKind::Marker => {
                // Safety: a marker's non-zero `aux` is a pointer from CString::into_raw made by
                // the hook; only the writer reclaims it, exactly once (here or in `release`).
                let text = unsafe { CString::from_raw(ev.aux as *mut c_char) };
                Event::Marker(Marker { text: text.to_string_lossy().into_owned() })
            }
        };
        self.tally.events += 1;
        let ts = self.clock.to_ns(ev.ts);
        let r = self.rec(ts, tid, event);
        self.write_checked(&r)
    }
}
