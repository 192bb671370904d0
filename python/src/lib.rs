//! `memtrace._native`: the `memsim` and `memest` commands, run in the Python process. The
//! console scripts of the wheel call them with `sys.argv`, and `memtrace` calls them with the
//! arguments the CLI would get (no subprocess), so the wheel behaves as the binaries do.

use pyo3::prelude::*;

/// `memsim ARGV[1:]` in this process; its exit status. Output goes to the process's stdout and
/// stderr, flushed before returning. The interpreter's lock is released while it runs.
#[pyfunction]
fn memsim_main(py: Python<'_>, argv: Vec<String>) -> u8 {
    py.detach(|| memsim_cli::main(argv.into_iter().map(Into::into)))
}

/// `memest ARGV[1:]` in this process; its exit status (see `memsim_main`).
#[pyfunction]
fn memest_main(py: Python<'_>, argv: Vec<String>) -> u8 {
    py.detach(|| memest_cli::main(argv.into_iter().map(Into::into)))
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(memsim_main, m)?)?;
    m.add_function(wrap_pyfunction!(memest_main, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
