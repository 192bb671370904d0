//! The `memest` binary: `memest_cli::main` with the process's arguments.

use std::process::ExitCode;

fn main() -> ExitCode {
    // Rust ignores SIGPIPE; a CLI piped into `head` should end quietly, as other tools do, instead
    // of panicking in println!.
    #[cfg(unix)]
    // Safety: restoring the default disposition of SIGPIPE before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    ExitCode::from(memest_cli::main(std::env::args_os()))
}
