//! Names resolved off the hot path: caller modules (`dladdr`), kernel names (the host stub's
//! symbol, or `cuFuncGetName`), and CUPTI's kernel names, each interned once as a `NameDef`.

use std::ffi::{c_char, c_void, CStr};

use hashbrown::HashMap;
use trace::{Event, NameDef, NameId, Record};

use super::Ctx;
use crate::event::FuncKind;
use crate::real;

/// Key space of CUPTI name pointers in `Names::kernels` (apart from the `FuncKind`s).
const CUPTI_NAME: u8 = 0xff;

pub(super) struct Names {
    next: NameId,
    by_text: HashMap<String, NameId>,
    callers: HashMap<u64, Option<NameId>>,
    kernels: HashMap<(u8, u64), Option<NameId>>,
    /// Direct-mapped front of `kernels`: a training step launches a few hundred distinct
    /// kernels over and over, and a hit here costs a compare instead of a hash and a probe.
    recent: Box<[(u64, u8, Option<NameId>); RECENT]>,
}

/// Slots in [`Names::recent`] (a power of two).
const RECENT: usize = 512;

fn recent_slot(f: u64) -> usize {
    // Function handles and host stubs are at least 16-byte aligned; mix in higher bits so that
    // kernels from one module spread over the slots.
    ((f >> 4) ^ (f >> 13)) as usize & (RECENT - 1)
}

impl Names {
    pub(super) fn new() -> Self {
        Names {
            next: 0,
            by_text: HashMap::new(),
            callers: HashMap::new(),
            kernels: HashMap::new(),
            recent: Box::new([(0, 0, None); RECENT]),
        }
    }
}

/// The file name of the shared object containing `addr`, via `dladdr`.
fn module_of(addr: u64) -> Option<String> {
    // Safety: Dl_info is plain C data; all-zero is a valid value.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // Safety: dladdr only reads loader tables; `info` is a valid out-pointer.
    if unsafe { libc::dladdr(addr as *const c_void, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // Safety: dladdr returned a NUL-terminated path owned by the loader.
    let path = unsafe { CStr::from_ptr(info.dli_fname) }.to_string_lossy();
    let base = path.rsplit('/').next().unwrap_or(&path);
    Some(if base.is_empty() { "main".to_string() } else { base.to_string() })
}

/// The symbol at exactly `addr` (a runtime kernel's host stub).
fn symbol_at(addr: u64) -> Option<String> {
    // Safety: Dl_info is plain C data; all-zero is a valid value.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // Safety: as in module_of.
    if unsafe { libc::dladdr(addr as *const c_void, &mut info) } == 0 || info.dli_sname.is_null() {
        return None;
    }
    if info.dli_saddr as u64 != addr {
        return None;
    }
    // Safety: NUL-terminated name owned by the loader.
    Some(unsafe { CStr::from_ptr(info.dli_sname) }.to_string_lossy().into_owned())
}

/// `cuFuncGetName` through the real driver, when it exports it.
fn cu_func_name(f: u64) -> Option<String> {
    let p = real::driver_symbol(c"cuFuncGetName")?;
    type FuncGetName = unsafe extern "C" fn(*mut *const c_char, *mut c_void) -> i32;
    // Safety: cuFuncGetName has this signature in every driver that exports it (12.3+).
    let get: FuncGetName = unsafe { std::mem::transmute::<usize, FuncGetName>(p) };
    let mut name: *const c_char = std::ptr::null();
    // Safety: out-pointer is valid; the driver validates the function handle.
    let r = unsafe { get(&mut name, f as *mut c_void) };
    if r != 0 || name.is_null() {
        return None;
    }
    // Safety: the driver returns a NUL-terminated string it owns.
    Some(unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned())
}

/// The longest name written whole. A name is one frame, which readers take up to
/// [`trace::codec::MAX_FRAME_LEN`] bytes: a 70 MB kernel name made the whole trace unreadable.
const MAX_NAME: usize = 1 << 20;

/// `text`, cut at a character boundary past [`MAX_NAME`] bytes, saying how much was cut.
fn capped(mut text: String) -> String {
    if text.len() <= MAX_NAME {
        return text;
    }
    let total = text.len();
    let cut = text.floor_char_boundary(MAX_NAME);
    text.truncate(cut);
    text.push_str(&format!(" [memtrace: {} more bytes of this name cut]", total - cut));
    text
}

impl Ctx {
    pub(super) fn intern(&mut self, text: String) -> Result<NameId, trace::TraceError> {
        let text = capped(text);
        if let Some(id) = self.names.by_text.get(&text) {
            return Ok(*id);
        }
        let id = self.names.next;
        self.names.next += 1;
        self.w.write(&Record::bare(Event::Name(NameDef { id, text: text.clone() })))?;
        self.names.by_text.insert(text, id);
        Ok(id)
    }

    pub(super) fn caller(&mut self, ra: u64) -> Result<Option<NameId>, trace::TraceError> {
        if ra == 0 {
            return Ok(None);
        }
        if let Some(c) = self.names.callers.get(&ra) {
            return Ok(*c);
        }
        let id = match module_of(ra) {
            Some(m) => Some(self.intern(m)?),
            None => None,
        };
        self.names.callers.insert(ra, id);
        Ok(id)
    }

    /// A launch's kernel name. Inlined: a training step launches the same few hundred kernels
    /// over and over, so almost every call is a hit in the direct-mapped `recent` cache.
    #[inline(always)]
    pub(super) fn kernel(&mut self, kind: u8, f: u64) -> Result<Option<NameId>, trace::TraceError> {
        // Zeroed slots never match: f == 0 is not cached (and graph launches never are).
        let (rf, rk, rid) = self.names.recent[recent_slot(f)];
        if rf == f && rk == kind && f != 0 {
            return Ok(rid);
        }
        self.kernel_lookup(kind, f)
    }

    #[inline(never)]
    fn kernel_lookup(&mut self, kind: u8, f: u64) -> Result<Option<NameId>, trace::TraceError> {
        if f == 0 || kind == FuncKind::Graph as u8 {
            return Ok(None);
        }
        let slot = recent_slot(f);
        let id = match self.names.kernels.get(&(kind, f)) {
            Some(n) => *n,
            None => {
                let text = if kind == FuncKind::CuFunction as u8 { cu_func_name(f) } else { symbol_at(f) };
                let id = match text {
                    Some(t) => Some(self.intern(t)?),
                    None => None,
                };
                self.names.kernels.insert((kind, f), id);
                id
            }
        };
        self.names.recent[slot] = (f, kind, id);
        Ok(id)
    }

    /// A CUPTI kernel name, by the CUPTI-owned pointer shared by all records of the kernel.
    pub(super) fn cupti_name(&mut self, p: u64) -> Result<Option<NameId>, trace::TraceError> {
        if p == 0 {
            return Ok(None);
        }
        if let Some(n) = self.names.kernels.get(&(CUPTI_NAME, p)) {
            return Ok(*n);
        }
        // Safety: CUPTI keeps kernel names alive until cuptiFinalize, which the shim never calls.
        let text = unsafe { CStr::from_ptr(p as *const c_char) }.to_string_lossy().into_owned();
        let id = Some(self.intern(text)?);
        self.names.kernels.insert((CUPTI_NAME, p), id);
        Ok(id)
    }
}
