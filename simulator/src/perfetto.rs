//! Perfetto / Chrome trace-event JSON export: memory counters and kernel slices. Sans-IO: feed
//! records, then take the JSON value. ui.perfetto.dev opens the result directly.
//!
//! - Allocator-level traces are replayed through the allocator model, and the counter track
//!   "GPU memory (device N)" carries `reserved` and `allocated` bytes after every request.
//! - Device-level traces carry `live_device_bytes` from the recorded allocations and frees.
//! - CUPTI kernel records become complete slices (`"ph":"X"`) on one track per stream; host
//!   launches become instants on the launching thread, markers and recorded OOMs become global
//!   instants.
//! - Without timestamps (old snapshots) the time axis is the record index, in µs, and the trace's
//!   metadata says so.

use hashbrown::HashMap;
use serde_json::{json, Value};
use trace::{Event, FreeStage, Header, Level, Record};

use crate::replay::{ReplayOptions, ReplaySetupError, Replayer};

/// Builds the trace-event list.
pub struct PerfettoBuilder {
    pid: u64,
    events: Vec<Value>,
    names: HashMap<u32, String>,
    replayer: Option<Replayer>,
    last: HashMap<u32, (u64, u64)>,
    live: HashMap<(u32, u64), u64>,
    live_total: HashMap<u32, u64>,
    index: u64,
    has_timestamps: bool,
    /// The symbolic tracer's timestamps are event numbers (`clock = logical`), not time.
    logical: bool,
}

impl PerfettoBuilder {
    /// A builder for a trace with this header.
    pub fn new(header: &Header, opts: ReplayOptions) -> Result<Self, ReplaySetupError> {
        let replayer = if header.is_allocator_level() { Some(Replayer::new(header, opts)?) } else { None };
        let pid = header.pid.map_or(1, u64::from);
        let events = vec![json!({
            "name": "process_name", "ph": "M", "pid": pid,
            "args": {"name": format!("{} (pid {})", header.producer.name, pid)}
        })];
        Ok(PerfettoBuilder {
            pid,
            events,
            names: HashMap::new(),
            replayer,
            last: HashMap::new(),
            live: HashMap::new(),
            live_total: HashMap::new(),
            index: 0,
            has_timestamps: false,
            logical: header.meta(&trace::metadata::CLOCK).is_some(),
        })
    }

    fn ts_us(&mut self, rec: &Record) -> f64 {
        match rec.ts_ns {
            Some(ns) => {
                self.has_timestamps = true;
                ns as f64 / 1000.0
            }
            None => self.index as f64,
        }
    }

    fn name(&self, id: Option<u32>) -> String {
        id.and_then(|i| self.names.get(&i).cloned()).unwrap_or_else(|| "kernel".to_string())
    }

    /// Account one record.
    pub fn observe(&mut self, rec: &Record) {
        let ts = self.ts_us(rec);
        self.index += 1;
        let device = rec.device.unwrap_or(0);
        let tid = rec.tid.map_or(0, u64::from);
        match &rec.event {
            Event::Name(n) => {
                self.names.insert(n.id, n.text.clone());
            }
            Event::KernelExec(k) => {
                let name = self.name(k.name);
                self.events.push(json!({
                    "name": name, "cat": "kernel", "ph": "X", "pid": self.pid,
                    "tid": format!("stream {}", k.stream),
                    "ts": k.start_ns as f64 / 1000.0,
                    "dur": k.end_ns.saturating_sub(k.start_ns) as f64 / 1000.0,
                    "args": {"device": device, "stream": k.stream, "correlation": k.correlation_id,
                             "grid": k.grid, "block": k.block,
                             "registers per thread": k.registers_per_thread,
                             "shared memory": k.static_shared_mem + k.dynamic_shared_mem}
                }));
            }
            Event::KernelLaunch(k) => {
                let name = self.name(k.name);
                self.events.push(json!({
                    "name": name, "cat": "cuda_runtime", "ph": "i", "s": "t", "pid": self.pid, "tid": tid,
                    "ts": ts, "args": {"api": k.api.name(), "grid": k.grid, "block": k.block, "stream": k.stream}
                }));
            }
            Event::Marker(m) => {
                self.events.push(json!({
                    "name": m.text, "cat": "marker", "ph": "i", "s": "g", "pid": self.pid, "tid": tid, "ts": ts
                }));
            }
            // The moment the run failed is what a reader of its memory curve looks for first.
            Event::Oom(o) => {
                self.events.push(json!({
                    "name": format!("OOM (device {device}): {} B requested", o.size), "cat": "oom", "ph": "i",
                    "s": "g", "pid": self.pid, "tid": tid, "ts": ts,
                    "args": {"device": device, "size": o.size, "device_free": o.device_free, "stream": o.stream}
                }));
            }
            _ => {}
        }
        if let Some(r) = self.replayer.as_mut() {
            r.observe(rec);
            let now = r.current(device);
            if self.last.get(&device) != Some(&now) {
                self.last.insert(device, now);
                self.events.push(json!({
                    "name": format!("GPU memory (device {device})"), "ph": "C", "pid": self.pid, "ts": ts,
                    "args": {"reserved": now.0, "allocated": now.1}
                }));
            }
            return;
        }
        // Device level: live bytes from the recorded calls.
        let changed = match &rec.event {
            Event::Alloc(a) if a.result == 0 && a.mem.is_device() => {
                self.live.insert((device, a.addr), a.size);
                *self.live_total.entry(device).or_default() += a.size;
                true
            }
            Event::Free(f) if f.result == 0 && f.mem.is_device() && f.stage != FreeStage::Requested => {
                match self.live.remove(&(device, f.addr)) {
                    Some(size) => {
                        *self.live_total.entry(device).or_default() -= size;
                        true
                    }
                    None => false,
                }
            }
            _ => false,
        };
        if changed {
            let v = self.live_total.get(&device).copied().unwrap_or(0);
            self.events.push(json!({
                "name": format!("GPU memory (device {device})"), "ph": "C", "pid": self.pid, "ts": ts,
                "args": {"live_device_bytes": v}
            }));
        }
    }

    /// The finished JSON object.
    pub fn finish(self, header: &Header) -> Value {
        json!({
            "traceEvents": self.events,
            "displayTimeUnit": "ms",
            "metadata": {
                "producer": header.producer.name,
                "level": match header.level { Level::Device => "device", Level::Allocator => "allocator" },
                "time_axis": match (self.has_timestamps, self.logical) {
                    // Shown in µs, one per event: the run is not 1.7 µs long.
                    (true, true) => "the symbolic tracer's event numbers, shown as ns (not time: the trace is of no real run)",
                    (true, false) => "trace timestamps (us)",
                    (false, _) => "record index (trace has no timestamps)",
                },
            }
        })
    }
}
