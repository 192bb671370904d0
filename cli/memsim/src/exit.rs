//! The one exit path of the memtrace commands (`memsim` here, `memest` through this crate):
//! clap's usage errors exit 2, `--help` and `--version` 0, a failure prints its error chain
//! (`{:#}`) and exits 2, and a closed pipe (`memsim stats x | head`) ends quietly.

use std::ffi::OsString;
use std::process::ExitCode;

/// `NAME ARGS...` (the first item is the program name) parsed as `C` and handed to `run`: the exit
/// status, after printing the output and, on failure, the error chain on stderr. The binaries and
/// the Python console scripts call this through their crate's `main`.
pub fn main_with<C: clap::Parser>(
    name: &str,
    args: impl IntoIterator<Item = OsString>,
    run: impl FnOnce(C) -> anyhow::Result<u8>,
) -> u8 {
    let cli = match C::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { 2 } else { 0 };
        }
    };
    let code = match run(cli) {
        Ok(code) => code,
        Err(e) if broken_pipe(&e) => 0,
        Err(e) => {
            eprintln!("{name}: error: {}", printable(&chain_text(&e)));
            2
        }
    };
    // The Python console script returns to the interpreter: what was printed must be out.
    let _ = std::io::Write::flush(&mut std::io::stdout());
    code
}

/// A process's `main`: the command's `main(argv)` with the process's arguments, SIGPIPE restored
/// first. Rust ignores SIGPIPE; a command piped into `head` should end quietly, as other tools
/// do, instead of failing in `println!`.
pub fn process_main(main: fn(std::env::ArgsOs) -> u8) -> ExitCode {
    #[cfg(unix)]
    // Safety: restoring the default disposition of SIGPIPE before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    ExitCode::from(main(std::env::args_os()))
}

pub use trace::terminal::printable;

/// The error chain on one line, as `{:#}` prints it, less the causes an error's own message
/// already quotes (a `thiserror` message that says `{source}` and also names it its source).
pub fn chain_text(e: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in e.chain() {
        let said = cause.to_string();
        if text.contains(&said) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&said);
    }
    text
}

fn broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe))
}

#[cfg(test)]
mod tests {
    use std::io::{Error, ErrorKind};

    #[test]
    fn a_closed_pipe_anywhere_in_the_chain_is_quiet() {
        let check = |e: anyhow::Error, expect: bool| assert_eq!(super::broken_pipe(&e), expect, "{e:#}");
        check(anyhow::Error::new(Error::from(ErrorKind::BrokenPipe)), true);
        check(anyhow::Error::new(Error::from(ErrorKind::BrokenPipe)).context("writing the report"), true);
        check(anyhow::Error::new(Error::from(ErrorKind::NotFound)).context("t.mtrace"), false);
        check(anyhow::anyhow!("broken pipe"), false);
    }

    /// An error whose message quotes its source, as a `thiserror` `{source}` message does.
    #[derive(Debug)]
    struct Quoting {
        source: Error,
    }

    impl std::fmt::Display for Quoting {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "t.pickle: not a readable snapshot pickle: {}", self.source)
        }
    }

    impl std::error::Error for Quoting {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.source)
        }
    }

    #[test]
    fn the_chain_says_each_cause_once() {
        let check = |e: anyhow::Error, expect: &str| assert_eq!(super::chain_text(&e), expect);
        let quoting = || Quoting { source: Error::other("file ends before STOP") };
        check(anyhow::Error::new(quoting()), "t.pickle: not a readable snapshot pickle: file ends before STOP");
        check(
            anyhow::Error::new(quoting()).context("--trace t.pickle"),
            "--trace t.pickle: t.pickle: not a readable snapshot pickle: file ends before STOP",
        );
        check(anyhow::Error::new(Error::from(ErrorKind::NotFound)).context("t.mtrace"), "t.mtrace: entity not found");
    }
}
