//! The `shardgate` binary: see `shardgate --help`.

use std::process::ExitCode;

use clap::Parser;

/// mimalloc rather than the system allocator: after a burst (a large merge, long statements)
/// it gives memory back to the system, where glibc's malloc kept hundreds of MB resident;
/// point selects are no slower (docs/benchmarks.md, "Allocator").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's `mi_option_purge_delay` (its 16th option in v2 and v3).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

fn main() -> ExitCode {
    // Freed memory goes back to the system at once rather than after 10 ms of the same
    // thread's activity: a worker idle after a burst would otherwise keep it (measured: 150 MB
    // kept after a 200k-group merge, 42 MB with this).
    // SAFETY: sets a process-wide allocator option; called before any thread is started.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 0) };
    let args = shardgate::cli::Args::parse();
    match shardgate::cli::run(args) {
        Ok(code) => code,
        Err(message) => {
            eprintln!("shardgate: {message}");
            ExitCode::FAILURE
        }
    }
}
