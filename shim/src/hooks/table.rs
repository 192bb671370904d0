//! The identity table: every hooked entry point, so that a pointer a resolver hands out can be
//! recognised by identity and replaced by the matching wrapper.

use std::ffi::{c_void, CStr};
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::real::{self, Lib, Slot};

/// One hooked entry point.
pub struct HookDesc {
    /// Exact name.
    pub name: &'static CStr,
    /// Where the real one lives.
    pub lib: Lib,
    /// Our exported symbol.
    pub exported: unsafe extern "C" fn(),
    /// Our resolver-side wrapper.
    pub resolved: unsafe extern "C" fn(),
    /// The next definition after the shim.
    pub real: &'static Slot,
    /// What a resolver returned.
    pub target: &'static Slot,
}

/// Every hook, grouped by file.
pub fn groups() -> [&'static [HookDesc]; 5] {
    [super::runtime::ALL, super::driver::ALL, super::array::ALL, super::launch::ALL, super::resolve::ALL]
}

static OWN_BASE: AtomicUsize = AtomicUsize::new(0);

fn own_base() -> usize {
    let b = OWN_BASE.load(Ordering::Relaxed);
    if b != 0 {
        return b;
    }
    // Safety: Dl_info is plain C data; all-zero is a valid value.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    let here = own_base as *const c_void;
    // Safety: dladdr on one of our own functions; `info` is a valid out-pointer.
    if unsafe { libc::dladdr(here, &mut info) } != 0 {
        OWN_BASE.store(info.dli_fbase as usize, Ordering::Relaxed);
    }
    info.dli_fbase as usize
}

/// Whether `p` is a function of this library (an export or a wrapper): never wrapped again and
/// never used as a "real" function.
pub fn is_own(p: usize) -> bool {
    let base = own_base();
    if base == 0 {
        return false;
    }
    // Safety: Dl_info is plain C data; all-zero is a valid value.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // Safety: dladdr accepts any address and fills `info` on success.
    (unsafe { libc::dladdr(p as *const c_void, &mut info) } != 0) && info.dli_fbase as usize == base
}

/// Replace `p` by the shim's wrapper of the function it is, by pointer identity; anything else
/// (including our own wrappers) is returned unchanged.
///
/// `requested` is the name the caller asked the resolver for. The function a resolver returns
/// for a name is that name or a versioned/per-thread variant of it (`cuMemAlloc` →
/// `cuMemAlloc_v2`, `cuLaunchKernel` → `cuLaunchKernel_ptsz`), so only hooks whose name starts
/// with it are compared; which one it is, is still decided by identity. This keeps the many
/// look-ups of functions the shim does not hook cheap.
pub fn wrap(p: usize, requested: &CStr) -> usize {
    if p == 0 {
        return p;
    }
    let req = requested.to_bytes();
    let plausible = |d: &&HookDesc| d.lib != Lib::Libc && d.name.to_bytes().starts_with(req);
    if !groups().iter().any(|g| g.iter().any(|d| plausible(&d))) || is_own(p) {
        return p;
    }
    for group in groups() {
        for d in group.iter().filter(plausible) {
            let mut hit = d.target.load() == p || d.real.load() == p;
            if !hit {
                real::candidates(d.lib, d.name, |c| hit |= c == p);
            }
            if hit {
                d.target.store(p);
                crate::log!(Debug, "wrapped {:?} at {p:#x}", d.name);
                return d.resolved as usize;
            }
        }
    }
    p
}
