//! The `loadgen` binary: see `loadgen --help` and docs/loadgen.md.

fn main() {
    std::process::exit(loadgen::cli::main());
}
