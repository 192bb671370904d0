//! The identity look-up: a pointer a resolver hands out, recognised among the hooks' rows by
//! identity and replaced by the matching wrapper. The rows are passed in by the resolver hooks
//! ([`super::resolve::GROUPS`]), which are rows themselves.

use std::ffi::CStr;

use super::shape::HookDesc;
use crate::real::{self, is_own, Lib};

/// Replace `p` by the shim's wrapper of the function it is, by pointer identity; anything else
/// (including our own wrappers) is returned unchanged.
///
/// `requested` is the name the caller asked the resolver for. The function a resolver returns
/// for a name is that name or a versioned/per-thread variant of it (`cuMemAlloc` →
/// `cuMemAlloc_v2`, `cuLaunchKernel` → `cuLaunchKernel_ptsz`), so only hooks whose name starts
/// with it are compared; which one it is, is still decided by identity. This keeps the many
/// look-ups of functions the shim does not hook cheap.
pub fn wrap(groups: &[&[HookDesc]], p: usize, requested: &CStr) -> usize {
    if p == 0 {
        return p;
    }
    let req = requested.to_bytes();
    let plausible = |d: &&HookDesc| d.lib != Lib::Libc && d.name.to_bytes().starts_with(req);
    if !groups.iter().any(|g| g.iter().any(|d| plausible(&d))) || is_own(p) {
        return p;
    }
    for group in groups {
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
