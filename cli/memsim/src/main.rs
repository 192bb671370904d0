//! The `memsim` binary: `memsim_cli::main` with the process's arguments.

fn main() -> std::process::ExitCode {
    memsim_cli::exit::process_main(memsim_cli::main)
}
