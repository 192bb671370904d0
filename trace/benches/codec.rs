//! Write and read throughput (events/s) and size (bytes/event) for two synthetic mixes.
//!
//! `cargo bench -p memtrace-trace --bench codec`. The bytes/event lines are printed before the
//! timings; record both in docs/benchmarks.md.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use trace::*;

const N: usize = 100_000;

/// Deterministic pseudo-random numbers (xorshift) so every run measures the same trace.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// A record as the shim writes them: one thread, device 0.
fn rec(ts: u64, event: Event) -> Record {
    Record { ts_ns: Some(ts), tid: Some(41_234), device: Some(0), event }
}

fn launch(ts: u64, name: u32, grid: u32, stream: i64) -> Record {
    rec(
        ts,
        Event::KernelLaunch(KernelLaunch::succeeded(
            Api::__CudaLaunchKernel,
            Some(name),
            [grid, 1, 1],
            [256, 1, 1],
            stream,
        )),
    )
}

fn alloc(ts: u64, addr: u64, size: u64, stream: i64) -> Record {
    rec(ts, Event::Alloc(Alloc { stream, ..Alloc::device(addr, size, Api::Allocator, Origin::Request) }))
}

fn free(ts: u64, addr: u64, size: u64, stream: i64) -> Record {
    rec(
        ts,
        Event::Free(Free {
            size: Some(size),
            stream,
            ..Free::device(addr, Api::Allocator, Origin::Request, FreeStage::Immediate)
        }),
    )
}

/// A training step as the shim sees it: 300 interned kernel names, launches 2-8 µs apart on
/// the default stream, one allocator request or free per ten events.
fn launch_heavy() -> Vec<Record> {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut out: Vec<Record> = (0..300)
        .map(|i| Record::bare(Event::Name(NameDef { id: i, text: format!("kernel_{i:03}_sm90_xmma") })))
        .collect();
    let mut ts = 1_000_000u64;
    let mut live: Vec<(u64, u64)> = Vec::new();
    while out.len() < N {
        ts += 2_000 + rng.next() % 6_000;
        let r = rng.next();
        if r.is_multiple_of(10) {
            if live.len() > 50 || (r.is_multiple_of(20) && !live.is_empty()) {
                let (addr, size) = live.swap_remove((r as usize / 20) % live.len());
                out.push(free(ts, addr, size, 0));
            } else {
                let size = 512 << (rng.next() % 16);
                let addr = 0x7f3a_0000_0000 + (rng.next() % (1 << 34)) / 512 * 512;
                live.push((addr, size));
                out.push(alloc(ts, addr, size, 0));
            }
        } else {
            let grid = [1, 80, 132, 1024, 4096][(r >> 8) as usize % 5];
            out.push(launch(ts, (r >> 16) as u32 % 300, grid, 0));
        }
    }
    out
}

/// Allocator-level churn: alloc/free pairs with a realistic size mix on two streams, one of
/// them a pointer-valued side stream.
fn alloc_heavy() -> Vec<Record> {
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let mut out = Vec::with_capacity(N);
    let mut ts = 1_000_000u64;
    let mut live: Vec<(u64, u64, i64)> = Vec::new();
    while out.len() < N {
        ts += 200 + rng.next() % 3_000;
        let r = rng.next();
        if live.len() > 200 || (r.is_multiple_of(2) && !live.is_empty()) {
            let (addr, size, stream) = live.swap_remove((r as usize >> 1) % live.len());
            out.push(free(ts, addr, size, stream));
        } else {
            let size = match r % 4 {
                0 => 512 * (1 + rng.next() % 8),
                1 => 4096 * (1 + rng.next() % 256),
                2 => (1 << 20) * (1 + rng.next() % 64),
                _ => 1 + rng.next() % (1 << 30),
            };
            let addr = 0x7f3a_0000_0000 + (rng.next() % (1 << 36)) / 512 * 512;
            let stream = if r % 8 == 1 { 0x55d0_1234_5000 } else { 0 };
            live.push((addr, size, stream));
            out.push(alloc(ts, addr, size, stream));
        }
    }
    out
}

fn header() -> Header {
    Header::new("bench", "0", Level::Allocator)
}

/// A `$writer` (`BinaryWriter` or `JsonlWriter`) over `$out` that has written every record of
/// `$recs`, not yet finished.
macro_rules! write_all {
    ($writer:ident, $out:expr, $header:expr, $recs:expr) => {{
        let mut w = $writer::new($out, $header).unwrap();
        for r in $recs {
            w.write(black_box(r)).unwrap();
        }
        w
    }};
}

fn encode_binary(recs: &[Record]) -> Vec<u8> {
    write_all!(BinaryWriter, Vec::new(), &header(), recs).finish().unwrap()
}

fn encode_jsonl(recs: &[Record]) -> Vec<u8> {
    write_all!(JsonlWriter, Vec::new(), &header(), recs).finish().unwrap()
}

/// Reads a trace in either form to the end; the number of records.
fn count_records(bytes: &[u8]) -> u64 {
    let mut r = open_reader(bytes).unwrap();
    let mut n = 0u64;
    while let Some(rec) = r.next_record() {
        black_box(rec.unwrap());
        n += 1;
    }
    n
}

fn bench(c: &mut Criterion) {
    let header = header();
    for (mix, recs) in [("launch-heavy", launch_heavy()), ("alloc-heavy", alloc_heavy())] {
        let bin = encode_binary(&recs);
        let json = encode_jsonl(&recs);
        let header_len = encode_binary(&[]).len();
        let launches: Vec<Record> =
            recs.iter().filter(|r| matches!(r.event, Event::KernelLaunch(_))).cloned().collect();
        let launch_bytes = encode_binary(&launches).len() - header_len;
        println!(
            "{mix}: {} events, binary {:.2} bytes/event (launch frames alone {:.2}), JSON Lines {:.1} bytes/event",
            recs.len(),
            (bin.len() - header_len) as f64 / recs.len() as f64,
            if launches.is_empty() { 0.0 } else { launch_bytes as f64 / launches.len() as f64 },
            json.len() as f64 / recs.len() as f64,
        );

        let mut g = c.benchmark_group(mix);
        g.throughput(Throughput::Elements(recs.len() as u64));
        g.bench_function("binary write", |b| {
            b.iter(|| black_box(write_all!(BinaryWriter, std::io::sink(), &header, &recs).bytes_written()))
        });
        g.bench_function("binary read", |b| b.iter(|| count_records(black_box(&bin))));
        g.bench_function("jsonl write", |b| {
            b.iter(|| black_box(write_all!(JsonlWriter, std::io::sink(), &header, &recs).bytes_written()))
        });
        g.bench_function("jsonl read", |b| b.iter(|| count_records(black_box(&json))));
        g.finish();
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1));
    targets = bench
}
criterion_main!(benches);
