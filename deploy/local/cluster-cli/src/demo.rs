//! `cluster demo`: the main job end to end on one machine. Brings the cluster up (or reuses it),
//! loads rows into every shard with `loadgen prepare`, drives a short open-loop point-select
//! load through the router with `loadgen run`, and prints the report (also written as JSON and
//! an SVG chart into the cluster directory). The cluster stays up for you to explore.

use std::path::PathBuf;
use std::process::{Command, ExitCode};

use clap::Args;

use crate::state::ClusterState;
use crate::up::{self, ClusterArgs, UpArgs};
use crate::{DirArgs, Result};

#[derive(Debug, Args)]
pub struct DemoArgs {
    // The cluster to bring up, as for `up` (the same options and defaults); a cluster that is
    // already up is reused as it is.
    #[command(flatten)]
    pub cluster: ClusterArgs,

    /// Rows loaded into each shard (keys 1, 2, 3, ... as the shard map places them)
    #[arg(long, value_name = "N", default_value_t = 10_000)]
    pub rows_per_shard: u64,

    /// Point selects a second sent to each shard through the router (open loop)
    #[arg(long, value_name = "R", default_value_t = 500)]
    pub rate_per_shard: u64,

    /// How long the measured run lasts (loadgen syntax: 10s, 1m, ...)
    #[arg(long, value_name = "DURATION", default_value = "10s")]
    pub duration: String,

    /// Client connections to the router
    #[arg(long, value_name = "N", default_value_t = 8)]
    pub connections: u32,
}

pub fn run(args: &DemoArgs) -> Result<ExitCode> {
    // Every other option of `up` at its default: one router, no TLS (loadgen connects without
    // it; a cluster made with `up --tls` still serves it, its router's [tls] mode is "allow").
    let up_args = UpArgs::with_defaults(args.cluster.clone())?;
    let code = up::run(&up_args)?;
    if code != ExitCode::SUCCESS {
        return Ok(code);
    }
    let dir = args.cluster.dir.resolve()?;
    let state = ClusterState::load(&dir)?.ok_or("the cluster state file is missing after `up`")?;
    let router = state.router.as_ref().ok_or(
        "the cluster has no router (it was started with --no-router): run `cluster down` first",
    )?;
    let loadgen = find_loadgen()?;
    let rows = args.rows_per_shard.to_string();
    let shardmap = state.shardmap.display().to_string();

    println!(
        "\n== loading {rows} rows into each of the {} shards (loadgen prepare) ==",
        state.shard_count
    );
    step(Command::new(&loadgen).args([
        "prepare",
        "--shardmap",
        &shardmap,
        "--rows-per-shard",
        &rows,
    ]))?;

    let json = dir.join("report.json");
    let chart = dir.join("report.svg");
    println!(
        "\n== {} point selects/s per shard through the router at {} for {} (loadgen run) ==",
        args.rate_per_shard, router.url, args.duration
    );
    step(Command::new(&loadgen).args([
        "run",
        "--target",
        &router.url,
        "--shardmap",
        &shardmap,
        "--rows-per-shard",
        &rows,
        "--rate-per-shard",
        &args.rate_per_shard.to_string(),
        "--duration",
        &args.duration,
        "--warmup",
        "2s",
        "--connections",
        &args.connections.to_string(),
        "--protocol",
        "prepared",
        "--json",
        &json.display().to_string(),
        "--chart",
        &chart.display().to_string(),
    ]))?;
    println!(
        "\nreport:  {}\nchart:   {}",
        json.display(),
        chart.display()
    );
    println!("router:  psql {}", router.url);
    println!(
        "stop:    deploy/local/cluster down{}",
        dir_flag(&args.cluster.dir)
    );
    Ok(ExitCode::SUCCESS)
}

fn dir_flag(dir: &DirArgs) -> String {
    match &dir.dir {
        Some(d) => format!(" --dir {}", d.display()),
        None => String::new(),
    }
}

fn step(cmd: &mut Command) -> Result<()> {
    let status = cmd.status().map_err(|e| format!("running {cmd:?}: {e}"))?;
    if !status.success() {
        return Err(format!("{} failed ({status})", cmd.get_program().to_string_lossy()).into());
    }
    Ok(())
}

/// The `loadgen` binary: `$LOADGEN_BIN`, else the one next to this executable.
fn find_loadgen() -> Result<PathBuf> {
    if let Some(bin) = std::env::var_os("LOADGEN_BIN").filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(bin));
    }
    let exe = std::env::current_exe().map_err(|e| format!("finding this executable: {e}"))?;
    let sibling = exe.with_file_name("loadgen");
    if sibling.is_file() {
        return Ok(sibling);
    }
    Err(format!(
        "loadgen is not at {}; build it with `cargo build --release -p loadgen` (deploy/local/cluster does this) or set LOADGEN_BIN",
        sibling.display()
    )
    .into())
}
