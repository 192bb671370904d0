//! The `memest` binary: `memest_cli::main` with the process's arguments.

fn main() -> std::process::ExitCode {
    memsim_cli::exit::process_main(memest_cli::main)
}
