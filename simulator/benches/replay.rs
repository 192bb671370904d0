//! Replay throughput of the allocator model on a synthetic trace with a realistic size mix and
//! a few hundred live blocks. `cargo bench -p memtrace-simulator --bench replay -- [--events N]
//! [--dump-ops PATH COUNT]`; `scripts/bench-replay.sh` also runs the Python baseline on the
//! dumped prefix and reports the speedup.

use std::hint::black_box;
use std::io::Write;
use std::time::Instant;

use simulator::alloc::{Allocator, AllocatorConfig, Request, TorchVersion};

/// High bit set: a free of live block `rest % live.len()`; else an allocation of that size.
const FREE: u64 = 1 << 63;

struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Sizes as a training step makes them: many small tensors, activations of a few MiB, some
/// large buffers, and recurring parameter-shaped sizes.
fn size(r: &mut SplitMix) -> u64 {
    const PARAMS: [u64; 6] = [4 << 20, 9_437_184, 16 << 20, 2_359_296, 37_748_736, 64 << 20];
    match r.below(100) {
        0..=44 => {
            let bits = 9 + r.below(12);
            1 + r.below(1 << bits)
        }
        45..=74 => (1 << 20) + r.below(9 << 20),
        75..=89 => PARAMS[r.below(PARAMS.len() as u64) as usize],
        _ => (10 << 20) + r.below(90 << 20),
    }
}

fn generate(events: usize, seed: u64) -> Vec<u64> {
    let mut r = SplitMix(seed);
    let mut live = 0usize;
    let mut ops = Vec::with_capacity(events);
    for _ in 0..events {
        let alloc = live < 200 || (live < 600 && r.below(2) == 0);
        if alloc {
            ops.push(size(&mut r));
            live += 1;
        } else {
            ops.push(FREE | (r.next() >> 1));
            live -= 1;
        }
    }
    ops
}

/// Replays `ops`; returns a checksum of the addresses (for comparing with the baseline) and
/// the peak reserved bytes.
fn replay(ops: &[u64]) -> (u64, u64, usize) {
    let mut a = Allocator::new(AllocatorConfig::default(), TorchVersion::V2_9, None);
    let mut live: Vec<u64> = Vec::with_capacity(1024);
    let mut sum = 0u64;
    for &op in ops {
        let req = if op & FREE == 0 {
            Request::Alloc { size: op, stream: 0, recorded_addr: None }
        } else {
            let i = ((op & !FREE) % live.len() as u64) as usize;
            Request::Free { addr: live.swap_remove(i) }
        };
        match a.apply(black_box(&req)) {
            Ok(out) => {
                if let Some(addr) = out.addr {
                    live.push(addr);
                    sum = sum.wrapping_mul(31).wrapping_add(addr);
                }
            }
            Err(e) => panic!("synthetic trace is valid: {e}"),
        }
    }
    (sum, a.stats().reserved_bytes[0].peak as u64, a.block_count())
}

/// CPU time consumed by this thread.
fn thread_cpu_secs() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime only writes the timespec we pass.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID) failed");
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mut events = 10_000_000usize;
    let mut dump: Option<(String, usize)> = None;
    let mut i = 1;
    while i < args.len() {
        match args[i].as_str() {
            "--events" => {
                events = args.get(i + 1).and_then(|v| v.parse().ok()).expect("--events N");
                i += 1;
            }
            "--dump-ops" => {
                let path = args.get(i + 1).expect("--dump-ops PATH COUNT").clone();
                let n = args.get(i + 2).and_then(|v| v.parse().ok()).expect("--dump-ops PATH COUNT");
                dump = Some((path, n));
                i += 2;
            }
            _ => {} // cargo bench passes --bench
        }
        i += 1;
    }
    let ops = generate(events, 0x5eed);
    let allocs = ops.iter().filter(|&&o| o & FREE == 0).count();
    let mut best = f64::INFINITY;
    let mut best_cpu = f64::INFINITY;
    let mut result = (0, 0, 0);
    for _ in 0..3 {
        let (t, c) = (Instant::now(), thread_cpu_secs());
        result = replay(&ops);
        best = best.min(t.elapsed().as_secs_f64());
        best_cpu = best_cpu.min(thread_cpu_secs() - c);
    }
    // CPU time is what one core spends; wall time also counts waiting on a shared machine.
    println!(
        "replay: {events} events ({allocs} allocs) in {best:.3} s wall, {best_cpu:.3} s CPU = {:.1} M events/s per CPU-second ({:.1} M/s wall); peak reserved {} MiB; {} blocks held at end; checksum {:#x}",
        events as f64 / best_cpu / 1e6,
        events as f64 / best / 1e6,
        result.1 >> 20,
        result.2,
        result.0
    );
    if let Some((path, n)) = dump {
        let n = n.min(ops.len());
        let c = thread_cpu_secs();
        let (sum, peak, _) = replay(&ops[..n]);
        let secs = thread_cpu_secs() - c;
        let mut f = std::fs::File::create(&path).expect("create dump file");
        let bytes: Vec<u8> = ops[..n].iter().flat_map(|o| o.to_le_bytes()).collect();
        f.write_all(&bytes).expect("write dump file");
        println!(
            "prefix: {n} events in {secs:.4} s CPU = {:.1} M events/s; peak reserved {} MiB; checksum {sum:#x}",
            n as f64 / secs / 1e6,
            peak >> 20
        );
    }
}
