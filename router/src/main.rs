//! The `shardgate` binary: see `shardgate --help`.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let args = shardgate::cli::Args::parse();
    match shardgate::cli::run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("shardgate: {message}");
            ExitCode::FAILURE
        }
    }
}
