//! A symbolic trace held in memory, and the allocator-free quantities read straight from it:
//! live-peak (our ablation) and the FakeTensor-style peak (forward and backward only).

use std::path::{Path, PathBuf};

use hashbrown::HashMap;
use trace::marker::{self, MarkerKind, Phase};
use trace::{metadata, Category, Event, FreeStage, Header, MemoryKind, Origin, Record};

use crate::error::Result;
use crate::features::{Family, Features};
use simulator::fit::Libraries;

/// A trace read into memory: symbolic traces are small, and PEF replays them several times.
#[derive(Debug, Clone)]
pub struct LoadedTrace {
    /// Where it came from.
    pub path: PathBuf,
    /// Its header.
    pub header: Header,
    /// Its records.
    pub records: Vec<Record>,
    /// What the reader saw: truncation and skipped unknown kinds.
    pub summary: trace::Summary,
}

impl LoadedTrace {
    /// Read a trace (binary or JSON Lines).
    pub fn load(path: &Path) -> Result<LoadedTrace> {
        let mut r = trace::Reader::open(path)?;
        let header = r.header().clone();
        let mut records = Vec::new();
        while let Some(rec) = r.next_record() {
            records.push(rec?);
        }
        Ok(LoadedTrace { path: path.to_path_buf(), header, records, summary: r.summary() })
    }

    /// What the input did not give whole, as warning lines naming the file: a truncated end,
    /// skipped records, header metadata values outside their key's domain (ignored), and what a
    /// replay of the snapshot it was converted from cannot show: memsim's list
    /// ([`simulator::snapshot::input_warnings`]).
    pub fn warnings(&self) -> Vec<String> {
        simulator::snapshot::input_warnings(&self.header, Some(&self.summary), &self.path)
    }

    /// A header metadata value (`optimizer`, `amp`, `batch_size`, `cuda_emulation`, ...).
    pub fn meta(&self, key: &metadata::Key) -> Option<&str> {
        self.header.meta(key)
    }

    /// Whether the trace was taken on the plain meta path (no CUDA emulation).
    pub fn is_plain_meta(&self) -> bool {
        self.header.meta_flag(&metadata::CUDA_EMULATION) == Some(false)
    }

    /// Whether any allocation is a library workspace: the tracer emits the cuBLAS workspace at
    /// the first GEMM, so this says cuBLAS was loaded.
    pub fn has_workspace(&self) -> bool {
        self.records.iter().any(|r| matches!(&r.event, Event::Alloc(a) if a.category == Some(Category::Workspace)))
    }

    /// Peak of live requested bytes over the whole trace: what the program asked for, with no
    /// allocator rounding, caching or fragmentation.
    pub fn live_peak(&self) -> u64 {
        live_peak_until(&self.records, |_| false)
    }

    /// Peak of live requested bytes in the first iteration before its optimizer phase: the
    /// FakeTensor method as GPUMemNet ran it (forward and backward, live storage bytes, no
    /// optimizer step, no allocator).
    pub fn forward_backward_peak(&self) -> u64 {
        live_peak_until(
            &self.records,
            |r| matches!(&r.event, Event::Marker(m) if matches!(marker::parse(&m.text), MarkerKind::Phase(Phase::Optimizer))),
        )
    }
}

/// Peak of live request bytes, stopping at the first record for which `stop` holds.
fn live_peak_until(records: &[Record], stop: impl Fn(&Record) -> bool) -> u64 {
    let mut live: HashMap<(u32, u64), u64> = HashMap::new();
    let (mut cur, mut peak) = (0u64, 0u64);
    for r in records {
        if stop(r) {
            break;
        }
        let dev = r.device.unwrap_or(0);
        match &r.event {
            Event::Alloc(a) if a.origin == Origin::Request && a.mem == MemoryKind::Device && a.result == 0 => {
                if let Some(old) = live.insert((dev, a.addr), a.size) {
                    cur -= old;
                }
                cur += a.size;
                peak = peak.max(cur);
            }
            // Bytes stop being live when the program frees them, not when the stream catches up.
            Event::Free(f)
                if f.origin == Origin::Request && f.mem == MemoryKind::Device && f.stage != FreeStage::Completed =>
            {
                if let Some(sz) = live.remove(&(dev, f.addr)) {
                    cur -= sz;
                }
            }
            _ => {}
        }
    }
    peak
}

/// The CUDA libraries a job loads, the one rule of `memest estimate` and `memest compare`: the
/// trace header's `uses_gemm`/`uses_conv` where it says, each key on its own ([`Libraries::of`]); else the evidence at
/// hand, named by where it came from: a GEMM when the features have a GEMM layer or the trace
/// holds a cuBLAS workspace (the tracer emits it at the first GEMM), a convolution when the
/// features have one or the job is a CNN (a dataset row whose layer list is empty still ran its
/// generator's convolutions). `memsim replay`, which has neither features nor family, counts the
/// context only and says so.
pub fn job_libraries(trace: Option<&LoadedTrace>, features: Option<&Features>, family: Option<Family>) -> Libraries {
    let workspace = trace.is_some_and(LoadedTrace::has_workspace);
    let cnn = family == Some(Family::Cnn);
    let fallback = match features {
        Some(f) => {
            let source = if cnn && !f.uses_conv() { "features and family" } else { "features" };
            Libraries::single(f.uses_gemm() || workspace, f.uses_conv() || cnn, source)
        }
        None => {
            let source = match (trace.is_some(), cnn) {
                (true, false) => "trace workspaces",
                (true, true) => "trace workspaces and family",
                (false, true) => "family",
                (false, false) => "unknown",
            };
            Libraries::single(workspace, cnn, source)
        }
    };
    match trace {
        Some(t) => Libraries::of(&t.header, fallback),
        None => fallback,
    }
}

/// What [`job_libraries`] decided without the header when the header gave only one of
/// `uses_gemm`/`uses_conv`: one warning per missing (or unreadable) key, naming the library and
/// where its answer came from, so a partly written header is not read as "not loaded".
pub fn library_warnings(trace: &LoadedTrace, libs: &Libraries) -> Vec<String> {
    let keys = [(&metadata::USES_GEMM, "cuBLAS", libs.gemm), (&metadata::USES_CONV, "cuDNN", libs.conv)];
    let said = keys.map(|(k, ..)| trace.header.meta_flag(k).is_some());
    if said.iter().all(|&s| s) || !said.iter().any(|&s| s) {
        return Vec::new();
    }
    let given = keys.iter().zip(said).find(|(_, s)| *s).map(|((k, ..), _)| k.name).unwrap_or_default();
    keys.iter()
        .zip(said)
        .filter(|(_, s)| !s)
        .map(|((k, lib, used), _)| {
            format!(
                "{}: header metadata says `{given}` but not `{}` (absent or unreadable): {lib} {} from the other evidence (libraries from {})",
                trace.path.display(),
                k.name,
                if *used { "counted" } else { "not counted" },
                libs.source
            )
        })
        .collect()
}
