//! Finding the real functions behind the hooks.
//!
//! The shim exports `dlsym` and `dlvsym` itself, so inside this library a call to either by name
//! binds to our own export. The real ones are therefore read straight from libc's dynamic symbol
//! table (GNU hash lookup over `dl_iterate_phdr`), once. Everything else is found with the real
//! `dlsym(RTLD_NEXT, ..)`, falling back to `dlopen(soname, RTLD_NOLOAD)` for libraries that were
//! loaded `RTLD_LOCAL` (their symbols are not in the global scope, so RTLD_NEXT misses them).

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicUsize, Ordering};

/// `dlsym`'s signature.
pub type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;
/// `dlvsym`'s signature.
pub type DlvsymFn = unsafe extern "C" fn(*mut c_void, *const c_char, *const c_char) -> *mut c_void;

pub static REAL_DLSYM: AtomicUsize = AtomicUsize::new(0);
pub static REAL_DLVSYM: AtomicUsize = AtomicUsize::new(0);

/// The library a hooked function lives in, which decides where the real one is looked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lib {
    /// `libcudart.so.13` / `.12`.
    Runtime,
    /// `libcuda.so.1`.
    Driver,
    /// `libnvToolsExt.so.1`.
    Nvtx,
    /// libc (`exit`, `_exit`, `dlsym`, ...).
    Libc,
}

impl Lib {
    fn sonames(self) -> &'static [&'static CStr] {
        match self {
            Lib::Runtime => &[c"libcudart.so.13", c"libcudart.so.12"],
            Lib::Driver => &[c"libcuda.so.1"],
            Lib::Nvtx => &[c"libnvToolsExt.so.1"],
            Lib::Libc => &[],
        }
    }
}

/// `Elf64_Dyn`.
#[repr(C)]
struct Elf64Dyn {
    d_tag: i64,
    d_un: u64,
}

const DT_NULL: i64 = 0;
const DT_STRTAB: i64 = 5;
const DT_SYMTAB: i64 = 6;
const DT_GNU_HASH: i64 = 0x6fff_fef5;
const DT_VERSYM: i64 = 0x6fff_fff0;

struct DynInfo {
    base: usize,
    symtab: usize,
    strtab: usize,
    gnu_hash: usize,
    versym: usize,
}

fn gnu_hash(name: &[u8]) -> u32 {
    name.iter().fold(5381u32, |h, c| h.wrapping_mul(33).wrapping_add(*c as u32))
}

/// Look `name` up in one object's dynamic symbol table, skipping hidden (non-default) versions.
///
/// # Safety
/// `d` must describe a loaded object's mapped dynamic tables.
unsafe fn lookup(d: &DynInfo, name: &[u8]) -> usize {
    if d.gnu_hash == 0 || d.symtab == 0 || d.strtab == 0 {
        return 0;
    }
    let h = gnu_hash(name);
    // Safety: (whole block) the GNU hash table layout is fixed by the ELF gABI extension and the
    // loader mapped it; all indices come from the table itself.
    unsafe {
        let hdr = d.gnu_hash as *const u32;
        let nbuckets = *hdr;
        let symoffset = *hdr.add(1);
        let bloom_size = *hdr.add(2) as usize;
        let buckets = hdr.add(4).cast::<u8>().add(bloom_size * std::mem::size_of::<usize>()).cast::<u32>();
        let chains = buckets.add(nbuckets as usize);
        let mut idx = *buckets.add((h % nbuckets) as usize);
        if idx < symoffset {
            return 0;
        }
        loop {
            let ch = *chains.add((idx - symoffset) as usize);
            if (ch | 1) == (h | 1) {
                let sym = (d.symtab as *const libc::Elf64_Sym).add(idx as usize);
                let sname = CStr::from_ptr((d.strtab as *const c_char).add((*sym).st_name as usize));
                let hidden = d.versym != 0 && (*(d.versym as *const u16).add(idx as usize) & 0x8000) != 0;
                if sname.to_bytes() == name && (*sym).st_value != 0 && !hidden {
                    return d.base + (*sym).st_value as usize;
                }
            }
            if ch & 1 != 0 {
                return 0;
            }
            idx += 1;
        }
    }
}

unsafe extern "C" fn find_libc(info: *mut libc::dl_phdr_info, _size: usize, data: *mut c_void) -> c_int {
    // Safety: the loader passes a valid info for each object; `data` is our `[usize; 2]`.
    unsafe {
        let info = &*info;
        if info.dlpi_name.is_null() {
            return 0;
        }
        let name = CStr::from_ptr(info.dlpi_name).to_bytes();
        let base = name.rsplit(|c| *c == b'/').next().unwrap_or(name);
        if !base.starts_with(b"libc.so") {
            return 0;
        }
        let base_addr = info.dlpi_addr as usize;
        let mut d = DynInfo { base: base_addr, symtab: 0, strtab: 0, gnu_hash: 0, versym: 0 };
        for i in 0..info.dlpi_phnum as usize {
            let ph = &*info.dlpi_phdr.add(i);
            if ph.p_type != libc::PT_DYNAMIC {
                continue;
            }
            let mut dy = (base_addr + ph.p_vaddr as usize) as *const Elf64Dyn;
            // glibc relocates these entries in place; an unrelocated one is below the base.
            let fix = |p: u64| if (p as usize) < base_addr { p as usize + base_addr } else { p as usize };
            while (*dy).d_tag != DT_NULL {
                let v = (*dy).d_un;
                match (*dy).d_tag {
                    DT_SYMTAB => d.symtab = fix(v),
                    DT_STRTAB => d.strtab = fix(v),
                    DT_GNU_HASH => d.gnu_hash = fix(v),
                    DT_VERSYM => d.versym = fix(v),
                    _ => {}
                }
                dy = dy.add(1);
            }
        }
        let out = &mut *(data as *mut [usize; 2]);
        out[0] = lookup(&d, b"dlsym");
        out[1] = lookup(&d, b"dlvsym");
        1
    }
}

fn init_dl() {
    let mut found = [0usize; 2];
    // Safety: find_libc matches dl_iterate_phdr's callback contract; `found` outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(find_libc), (&mut found as *mut [usize; 2]).cast()) };
    if found[0] == 0 || found[1] == 0 {
        crate::log!(Warn, "cannot find libc's dlsym/dlvsym; resolver hooks pass nothing through");
    }
    REAL_DLSYM.store(found[0], Ordering::Release);
    REAL_DLVSYM.store(found[1], Ordering::Release);
}

/// The address in `slot` (`REAL_DLSYM` or `REAL_DLVSYM`), looked up in libc the first time.
/// 0 when it could not be found.
fn libc_fn(slot: &AtomicUsize) -> usize {
    let p = slot.load(Ordering::Acquire);
    if p != 0 {
        return p;
    }
    init_dl();
    slot.load(Ordering::Acquire)
}

/// libc's `dlsym` (never the shim's export). 0 when it could not be found.
pub fn real_dlsym_addr() -> usize {
    libc_fn(&REAL_DLSYM)
}

/// libc's `dlvsym`. 0 when it could not be found.
pub fn real_dlvsym_addr() -> usize {
    libc_fn(&REAL_DLVSYM)
}

/// The real `dlsym`, called as the shim (RTLD_NEXT means "after libmemtrace").
// libc validates the handle; it is never dereferenced here.
#[allow(clippy::not_unsafe_ptr_arg_deref)]
pub fn dlsym(handle: *mut c_void, name: &CStr) -> usize {
    let p = real_dlsym_addr();
    if p == 0 {
        return 0;
    }
    // Safety: p is libc's dlsym, found by exact name in libc's own table.
    let f: DlsymFn = unsafe { std::mem::transmute::<usize, DlsymFn>(p) };
    // Safety: `name` is NUL-terminated; dlsym accepts any handle value and reports failure as NULL.
    unsafe { f(handle, name.as_ptr()) as usize }
}

/// Handles from `dlopen(soname, RTLD_NOLOAD)`, kept once found (our reference keeps them loaded).
static HANDLES: [AtomicUsize; 4] = [const { AtomicUsize::new(0) }; 4];

fn handle_slot(soname: &CStr) -> usize {
    match soname.to_bytes() {
        b"libcudart.so.13" => 0,
        b"libcudart.so.12" => 1,
        b"libcuda.so.1" => 2,
        _ => 3,
    }
}

/// A handle to an already-loaded library, by soname; never loads anything.
pub fn loaded(soname: &CStr) -> Option<*mut c_void> {
    let slot = &HANDLES[handle_slot(soname)];
    let h = slot.load(Ordering::Acquire);
    if h != 0 {
        return Some(h as *mut c_void);
    }
    // Safety: RTLD_NOLOAD never runs constructors or maps anything new.
    let h = unsafe { libc::dlopen(soname.as_ptr(), libc::RTLD_NOLOAD | libc::RTLD_LAZY) };
    if h.is_null() {
        return None;
    }
    if slot.compare_exchange(0, h as usize, Ordering::AcqRel, Ordering::Acquire).is_err() {
        // Safety: drop the extra reference we just took.
        unsafe { libc::dlclose(h) };
    }
    Some(slot.load(Ordering::Acquire) as *mut c_void)
}

/// A symbol of the loaded driver (for the writer's `cuFuncGetName`).
pub fn driver_symbol(name: &CStr) -> Option<usize> {
    let h = loaded(c"libcuda.so.1")?;
    let p = dlsym(h, name);
    (p != 0 && !is_own(p)).then_some(p)
}

/// The definition of `name` in each already-loaded library of `lib` (for pointer identity).
pub fn candidates(lib: Lib, name: &CStr, mut f: impl FnMut(usize)) {
    for soname in lib.sonames() {
        if let Some(h) = loaded(soname) {
            let p = dlsym(h, name);
            if p != 0 {
                f(p);
            }
        }
    }
}

/// The next definition of `name` after the shim: RTLD_NEXT, then the library by soname. Never
/// returns one of the shim's own functions; 0 when there is none.
pub fn next(lib: Lib, name: &CStr) -> usize {
    let p = dlsym(libc::RTLD_NEXT, name);
    if p != 0 {
        if !is_own(p) {
            return p;
        }
        crate::log!(Warn, "dlsym(RTLD_NEXT, {name:?}) returned the shim's own function; ignoring it");
    }
    let mut found = 0;
    candidates(lib, name, |p| {
        if found == 0 && !is_own(p) {
            found = p;
        }
    });
    found
}

/// A lazily resolved real function.
pub struct Slot(AtomicUsize);

impl Slot {
    /// Unresolved.
    pub const fn new() -> Slot {
        Slot(AtomicUsize::new(0))
    }

    /// The real function, resolving it on first use. 0 when it cannot be found (retried on the
    /// next call: the library may be loaded later).
    #[inline]
    pub fn get(&self, lib: Lib, name: &CStr) -> usize {
        let p = self.0.load(Ordering::Relaxed);
        if p != 0 {
            return p;
        }
        self.resolve(lib, name)
    }

    #[cold]
    fn resolve(&self, lib: Lib, name: &CStr) -> usize {
        let was = crate::raw::is_internal();
        crate::raw::set_internal(true);
        let p = next(lib, name);
        crate::raw::set_internal(was);
        if p == 0 {
            crate::log!(Debug, "no real {name:?} found yet");
        } else {
            self.0.store(p, Ordering::Relaxed);
        }
        p
    }

    /// The stored value (0 if unset).
    pub fn load(&self) -> usize {
        self.0.load(Ordering::Acquire)
    }

    /// Store a value (the resolver wrappers store exactly what the real resolver returned).
    pub fn store(&self, p: usize) {
        self.0.store(p, Ordering::Release)
    }
}

impl Default for Slot {
    fn default() -> Self {
        Self::new()
    }
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
