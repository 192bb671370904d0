//! Trace records the tests build by hand (shared with the memsim command's tests).

use trace::{
    Alloc, Api, Category, Control, ControlOp, Event, Frame, Free, FreeStage, Header, KernelExec, KernelLaunch, Level,
    Origin, Record, StackDef,
};

const MIB: u64 = 1 << 20;

/// An allocator-level request of `size` bytes at trace address `addr`.
pub fn alloc(addr: u64, size: u64, cat: Option<Category>) -> Record {
    Record {
        ts_ns: Some(addr),
        tid: None,
        device: Some(0),
        event: Event::Alloc(Alloc { category: cat, ..Alloc::device(addr, size, Api::Allocator, Origin::Request) }),
    }
}

/// The free of the request at `addr`.
pub fn free(addr: u64) -> Record {
    Record {
        ts_ns: Some(addr + 1),
        tid: None,
        device: Some(0),
        event: Event::Free(Free::device(addr, Api::Allocator, Origin::Request, FreeStage::Immediate)),
    }
}

/// The program's `torch.cuda.set_per_process_memory_fraction(f)`, at time 0.
pub fn fraction(f: f64) -> Record {
    Record {
        ts_ns: Some(0),
        tid: None,
        device: Some(0),
        event: Event::Control(Control { op: ControlOp::SetMemoryFraction { fraction: f } }),
    }
}

/// Three 30 MiB tensors; the second freed; a 60 MiB one allocated at the top of a known stack
/// (the peak: 30 + 30 + 60 = 120 MiB allocated, 150 MiB reserved), then everything freed.
pub fn records() -> Vec<Record> {
    let stack = Record {
        ts_ns: None,
        tid: None,
        device: Some(0),
        event: Event::Stack(StackDef {
            id: 7,
            frames: vec![Frame { filename: "train.py".into(), line: 42, name: "forward".into() }],
        }),
    };
    let mut big = alloc(4, 60 * MIB, Some(Category::Activation));
    if let Event::Alloc(a) = &mut big.event {
        a.stack = Some(7);
    }
    vec![
        alloc(1, 30 * MIB, Some(Category::Parameter)),
        alloc(2, 30 * MIB, Some(Category::Activation)),
        alloc(3, 30 * MIB, Some(Category::Activation)),
        free(2),
        stack,
        big,
        free(4),
        free(3),
        free(1),
    ]
}

/// A kernel on device 0: `[start, end)`, `grid` blocks of 256 threads with 32 registers (100%
/// theoretical occupancy on 8.0), on `stream`, recorded at its end.
pub fn kernel(start: u64, end: u64, grid: u32, stream: i64, name: Option<u32>) -> Record {
    Record {
        ts_ns: Some(end),
        tid: None,
        device: Some(0),
        event: Event::KernelExec(KernelExec {
            start_ns: start,
            end_ns: end,
            name,
            grid: [grid, 1, 1],
            block: [256, 1, 1],
            registers_per_thread: 32,
            static_shared_mem: 0,
            dynamic_shared_mem: 0,
            stream,
            correlation_id: 0,
        }),
    }
}

/// An unnamed one-block `cudaLaunchKernel` of `block` threads on `stream`, seen on device 0 at `ts`.
pub fn launch(ts: u64, block: u32, stream: i64) -> Record {
    Record {
        ts_ns: Some(ts),
        tid: None,
        device: Some(0),
        event: Event::KernelLaunch(KernelLaunch::succeeded(
            Api::CudaLaunchKernel,
            None,
            [1, 1, 1],
            [block, 1, 1],
            stream,
        )),
    }
}

pub fn header() -> Header {
    let mut h = Header::new("test", "0", Level::Allocator);
    h.synthetic_addresses = true;
    h
}
