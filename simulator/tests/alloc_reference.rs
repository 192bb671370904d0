//! A deliberately naive model of the native rules — a Vec of segments, each a Vec of blocks,
//! linear scans everywhere — written from the spec independently of `simulator::alloc`.
//! Covers: rounding (no divisions), pools, per-stream best fit, oversize rules, splitting,
//! merging, free_requested/free_completed, empty_cache, and the capacity OOM chain.

pub const MIB: u64 = 1 << 20;
const BASE: u64 = 0x1000_0000_0000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum St {
    Free,
    Used,
    Pending,
}

#[derive(Debug, Clone)]
pub struct Blk {
    pub addr: u64,
    pub size: u64,
    pub req: u64,
    pub st: St,
}

#[derive(Debug, Clone)]
pub struct Seg {
    pub addr: u64,
    pub size: u64,
    pub stream: i64,
    pub small: bool,
    pub blocks: Vec<Blk>,
}

/// Events as (kind, addr, size): kind 'A' segment_alloc, 'F' segment_free.
pub type Ev = (char, u64, u64);

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counters {
    pub allocated: i64,
    pub allocated_peak: i64,
    pub reserved: i64,
    pub reserved_peak: i64,
    pub active: i64,
    pub active_peak: i64,
    pub requested: i64,
    pub segments: i64,
    pub retries: i64,
    pub ooms: i64,
}

pub struct Reference {
    pub segs: Vec<Seg>,
    next: u64,
    capacity: Option<u64>,
    msp: u64,
    slack: u64,
    pub c: Counters,
}

fn round(size: u64) -> u64 {
    if size < 512 {
        512
    } else {
        size.div_ceil(512) * 512
    }
}

fn seg_size(r: u64) -> u64 {
    if r <= MIB {
        2 * MIB
    } else if r < 10 * MIB {
        20 * MIB
    } else {
        r.div_ceil(2 * MIB) * 2 * MIB
    }
}

impl Reference {
    /// `msp`: max_split_size (u64::MAX for unset); `slack`: the oversize rounding limit R.
    pub fn new(capacity: Option<u64>, msp: u64, slack: u64) -> Self {
        Reference { segs: Vec::new(), next: BASE, capacity, msp, slack, c: Counters::default() }
    }

    fn find(&self, addr: u64) -> Option<(usize, usize)> {
        for (si, s) in self.segs.iter().enumerate() {
            for (bi, b) in s.blocks.iter().enumerate() {
                if b.addr == addr && b.st != St::Free {
                    return Some((si, bi));
                }
            }
        }
        None
    }

    pub fn malloc(&mut self, size: u64, stream: i64, ev: &mut Vec<Ev>) -> Option<u64> {
        let r = round(size);
        let small = r <= MIB;
        // Best fit: smallest free block of this stream and pool, ties by lowest address.
        let mut best: Option<(u64, u64, usize, usize)> = None;
        for (si, s) in self.segs.iter().enumerate() {
            if s.stream != stream || s.small != small {
                continue;
            }
            for (bi, b) in s.blocks.iter().enumerate() {
                if b.st == St::Free && b.size >= r && best.is_none_or(|(sz, a, _, _)| (b.size, b.addr) < (sz, a)) {
                    best = Some((b.size, b.addr, si, bi));
                }
            }
        }
        let mut at = best.and_then(|(bs, _, si, bi)| {
            let too_big = (r < self.msp && bs >= self.msp) || (r >= self.msp && bs >= r + self.slack);
            (!too_big).then_some((si, bi))
        });
        if at.is_none() {
            at = self.new_segment(r, stream, small, ev);
            if at.is_none() && self.release_available(r, stream, small, ev) {
                at = self.new_segment(r, stream, small, ev);
            }
            if at.is_none() {
                self.empty_cache(ev);
                self.c.retries += 1;
                at = self.new_segment(r, stream, small, ev);
            }
        }
        let Some((si, bi)) = at else {
            self.c.ooms += 1;
            return None;
        };
        let seg = &mut self.segs[si];
        let b = seg.blocks[bi].clone();
        let rest = b.size - r;
        let split = if small { rest >= 512 } else { r < self.msp && rest > MIB };
        let bsize = if split { r } else { b.size };
        seg.blocks[bi] = Blk { addr: b.addr, size: bsize, req: size, st: St::Used };
        if split {
            seg.blocks.insert(bi + 1, Blk { addr: b.addr + r, size: rest, req: 0, st: St::Free });
        }
        self.c.allocated += bsize as i64;
        self.c.allocated_peak = self.c.allocated_peak.max(self.c.allocated);
        self.c.active += bsize as i64;
        self.c.active_peak = self.c.active_peak.max(self.c.active);
        self.c.requested += size as i64;
        Some(b.addr)
    }

    fn new_segment(&mut self, r: u64, stream: i64, small: bool, ev: &mut Vec<Ev>) -> Option<(usize, usize)> {
        let size = seg_size(r);
        if self.capacity.is_some_and(|c| self.c.reserved as u64 + size > c) {
            return None;
        }
        let addr = self.next.div_ceil(2 * MIB) * 2 * MIB;
        self.next = addr + size;
        self.segs.push(Seg { addr, size, stream, small, blocks: vec![Blk { addr, size, req: 0, st: St::Free }] });
        self.c.reserved += size as i64;
        self.c.reserved_peak = self.c.reserved_peak.max(self.c.reserved);
        self.c.segments += 1;
        ev.push(('A', addr, size));
        Some((self.segs.len() - 1, 0))
    }

    fn whole_free(&self, si: usize) -> bool {
        self.segs[si].blocks.len() == 1 && self.segs[si].blocks[0].st == St::Free
    }

    fn release(&mut self, si: usize, ev: &mut Vec<Ev>) {
        let s = self.segs.remove(si);
        self.c.reserved -= s.size as i64;
        self.c.segments -= 1;
        ev.push(('F', s.addr, s.size));
    }

    /// Free blocks of a pool as (stream, size, addr, seg index, whole segment free).
    fn free_blocks(&self, small: bool) -> Vec<(i64, u64, u64, usize, bool)> {
        let mut v = Vec::new();
        for (si, s) in self.segs.iter().enumerate() {
            if s.small != small {
                continue;
            }
            for b in &s.blocks {
                if b.st == St::Free {
                    v.push((s.stream, b.size, b.addr, si, self.whole_free(si)));
                }
            }
        }
        v.sort();
        v
    }

    fn release_by_addr(&mut self, addr: u64, ev: &mut Vec<Ev>) {
        let si = self.segs.iter().position(|s| s.addr == addr).expect("segment exists");
        self.release(si, ev);
    }

    fn release_available(&mut self, r: u64, stream: i64, small: bool, ev: &mut Vec<Ev>) -> bool {
        if self.msp == u64::MAX {
            return false;
        }
        let key = r.max(self.msp);
        let blocks = self.free_blocks(small);
        if let Some(&(_, _, addr, _, whole)) = blocks.iter().find(|b| b.0 == stream && b.1 >= key) {
            if whole {
                self.release_by_addr(addr, ev);
            }
            return whole;
        }
        let mut total = 0;
        let mut victims = Vec::new();
        for &(s, size, addr, _, whole) in blocks.iter().rev().filter(|b| (b.0, b.1) < (stream, key)) {
            if total >= key || size < self.msp || s != stream {
                break;
            }
            if whole {
                victims.push(addr);
                total += size;
            }
        }
        for a in victims {
            self.release_by_addr(a, ev);
        }
        total >= key
    }

    pub fn empty_cache(&mut self, ev: &mut Vec<Ev>) {
        for small in [false, true] {
            let order: Vec<u64> = self.free_blocks(small).into_iter().filter(|b| b.4).map(|b| b.2).collect();
            for a in order {
                self.release_by_addr(a, ev);
            }
        }
    }

    /// `free_requested`; returns false for an unknown address.
    pub fn free_requested(&mut self, addr: u64) -> bool {
        let Some((si, bi)) = self.find(addr) else { return false };
        let b = &mut self.segs[si].blocks[bi];
        if b.st != St::Used {
            return false;
        }
        b.st = St::Pending;
        self.c.allocated -= b.size as i64;
        true
    }

    /// `free_completed`: merge with free neighbours.
    pub fn free_completed(&mut self, addr: u64) -> bool {
        let Some((si, mut bi)) = self.find(addr) else { return false };
        let seg = &mut self.segs[si];
        if seg.blocks[bi].st != St::Pending {
            return false;
        }
        self.c.active -= seg.blocks[bi].size as i64;
        self.c.requested -= seg.blocks[bi].req as i64;
        seg.blocks[bi].st = St::Free;
        seg.blocks[bi].req = 0;
        if bi + 1 < seg.blocks.len() && seg.blocks[bi + 1].st == St::Free {
            let n = seg.blocks.remove(bi + 1);
            seg.blocks[bi].size += n.size;
        }
        if bi > 0 && seg.blocks[bi - 1].st == St::Free {
            let b = seg.blocks.remove(bi);
            bi -= 1;
            seg.blocks[bi].size += b.size;
        }
        true
    }
}
