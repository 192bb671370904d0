//! Where an allocation was made, in the few lines a table cell holds. A real snapshot's stack
//! starts with the unwinder and the allocator itself (`torch::unwind::unwind`,
//! `CapturedTraceback::gather`, `DeviceCachingAllocator::malloc`), which say nothing about the
//! program: the cell shows the program's own frames instead.

use trace::Frame;

/// Frames PyTorch's memory viewer (`MemoryViz.js`, `frameFilter`) leaves out, by function name.
const OMIT_FUNCTIONS: [&str; 8] = [
    "unwind::unwind",
    "CapturedTraceback::gather",
    "gather_with_cpp",
    "_start",
    "__libc_start_main",
    "PyEval_",
    "PyObject_",
    "PyFunction_",
];

/// ... and by file name.
const OMIT_FILENAMES: [&str; 10] = [
    "core/boxing",
    "/Register",
    "/Redispatch",
    "pythonrun.c",
    "Modules/main.c",
    "Objects/call.c",
    "Objects/methodobject.c",
    "pycore_ceval.h",
    "ceval.c",
    "cpython/abstract.h",
];

/// Lines the "where" cell shows.
pub const LINES: usize = 3;

/// Whether PyTorch's memory viewer shows the frame.
pub fn viewer_keeps(f: &Frame) -> bool {
    !OMIT_FUNCTIONS.iter().any(|o| f.name.contains(o)) && !OMIT_FILENAMES.iter().any(|o| f.filename.contains(o))
}

/// `file:line in function`.
pub fn format(f: &Frame) -> String {
    format!("{}:{} in {}", f.filename, f.line, f.name)
}

/// The first [`LINES`] frames (innermost first) that say where in the program the allocation
/// was made: when the stack has Python frames, the innermost (the operation) and the program's
/// own frames after it (outside installed packages), else the next Python frames; else the operator calls and autograd
/// nodes of a C++-only stack (the backward pass runs on autograd's own thread, with no Python
/// frame); else what the viewer keeps.
pub fn site(frames: &[Frame]) -> Vec<String> {
    let kept: Vec<&Frame> = frames.iter().filter(|f| viewer_keeps(f)).collect();
    let python: Vec<&Frame> = kept.iter().copied().filter(|f| f.filename.ends_with(".py")).collect();
    let chosen = if let Some(&innermost) = python.first() {
        // The innermost Python frame is the operation (often a library's: `linear.py in
        // forward`); the program's own lines follow it, past the libraries' module plumbing.
        let own = python.iter().copied().filter(|f| !is_library(&f.filename) && !std::ptr::eq(*f, innermost));
        let mut chosen = vec![innermost];
        chosen.extend(own.take(LINES - 1));
        if chosen.len() == 1 {
            chosen.extend(python.iter().copied().skip(1));
        }
        chosen
    } else {
        let ops: Vec<&Frame> = kept.iter().copied().filter(|f| is_operator(&f.name)).collect();
        if ops.is_empty() {
            kept
        } else {
            ops
        }
    };
    chosen.into_iter().take(LINES).map(format).collect()
}

/// A file of an installed package or of Python itself, not of the program.
fn is_library(filename: &str) -> bool {
    ["/site-packages/", "/dist-packages/", "/lib/python3"].iter().any(|d| filename.contains(d))
}

/// An ATen operator's entry (`at::_ops::mm::call(...)`) or an autograd node
/// (`torch::autograd::generated::MmBackward0::apply(...)`).
fn is_operator(name: &str) -> bool {
    (name.starts_with("at::_ops::") && name.contains("::call("))
        || (name.contains("autograd::generated::") && name.contains("::apply("))
}
