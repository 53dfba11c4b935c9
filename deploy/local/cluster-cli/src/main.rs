//! `shardgate-cluster`: starts, inspects and stops a local shardgate cluster (real PostgreSQL
//! servers holding N shard databases, the `shardmap.toml` describing them, and a `shardgate`
//! router in front of them). Usually run through `deploy/local/cluster`, which builds it and the
//! router first. The servers are started by pgharness.

mod demo;
mod down;
mod router;
mod state;
mod status;
mod tls;
mod up;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

/// Errors are reported as text, with their causes.
pub type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// Run a local shardgate cluster: PostgreSQL servers holding N shard databases, the shard map
/// that routes keys to them, and a shardgate router that clients connect to.
#[derive(Debug, Parser)]
#[command(name = "cluster", version, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Start PostgreSQL servers (wal_level = logical), create the shard databases with the
    /// schema, start any --spare servers, write the shard map, and start a router (shardgate) in
    /// front of them. When the cluster is already up it only restarts a router or spare server
    /// that is not running and adds spares asked for, and changes nothing else.
    Up(up::UpArgs),
    /// Stop the router, then every server listed in the state file, and delete their data.
    Down(DirArgs),
    /// Show the router and the servers, whether each accepts connections, and the shard count.
    Status(DirArgs),
    /// The main job end to end: `up` (or reuse a running cluster), load rows into every shard
    /// (loadgen prepare), drive a short point-select load through the router (loadgen run) and
    /// print the report; the JSON report and an SVG chart are written to the cluster directory.
    Demo(demo::DemoArgs),
    /// Print the CPU time each process PID has used so far, one line per PID: `PID USER SYS`
    /// in clock ticks, then `ticks_per_second N` (what benches/compare.sh measures proxies by).
    Cpu {
        #[arg(required = true)]
        pids: Vec<u32>,
    },
}

/// `cluster cpu PID...`.
fn cpu(pids: &[u32]) -> Result<ExitCode> {
    for &pid in pids {
        let stat = pgharness::proc::stat(pid).ok_or_else(|| format!("no process {pid}"))?;
        println!("{pid} {} {}", stat.utime, stat.stime);
    }
    println!("ticks_per_second {}", pgharness::proc::ticks_per_second());
    Ok(ExitCode::SUCCESS)
}

/// Where the cluster lives.
#[derive(Debug, Clone, Args)]
pub struct DirArgs {
    /// Cluster directory, holding cluster.json (state) and shardmap.toml [default: <repo>/.cluster]
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

/// The repository root: `$SHARDGATE_REPO` (set by `deploy/local/cluster`), else where this binary
/// was built from.
pub fn repo_root() -> PathBuf {
    match std::env::var_os("SHARDGATE_REPO").filter(|v| !v.is_empty()) {
        Some(root) => PathBuf::from(root),
        None => PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../..")),
    }
}

impl DirArgs {
    /// The cluster directory as an absolute path.
    pub fn resolve(&self) -> Result<PathBuf> {
        let dir = match &self.dir {
            Some(dir) => dir.clone(),
            None => repo_root().join(".cluster"),
        };
        let abs = std::path::absolute(&dir)
            .map_err(|e| format!("resolving --dir {}: {e}", dir.display()))?;
        Ok(normalize(&abs))
    }
}

/// Removes `.` and `..` components lexically (paths here are absolute).
pub fn normalize(path: &std::path::Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            c => out.push(c),
        }
    }
    out
}

fn main() -> ExitCode {
    // Behave like other command-line tools when piped into `head`: die quietly on a closed pipe.
    // SAFETY: restoring the default disposition of SIGPIPE before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Up(args) => up::run(&args),
        Command::Down(args) => down::run(&args),
        Command::Status(args) => status::run(&args),
        Command::Demo(args) => demo::run(&args),
        Command::Cpu { pids } => cpu(&pids),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            let mut source = e.source();
            while let Some(s) = source {
                eprintln!("  caused by: {s}");
                source = s.source();
            }
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use super::{Cli, Command};

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    /// `demo` brings the cluster up with the options it shares with `up`, and the same defaults.
    #[test]
    fn demo_and_up_share_their_cluster_options() {
        let up = match Cli::try_parse_from(["cluster", "up"]) {
            Ok(Cli {
                command: Command::Up(a),
            }) => a,
            other => panic!("`cluster up` does not parse as up: {other:?}"),
        };
        let demo = match Cli::try_parse_from(["cluster", "demo"]) {
            Ok(Cli {
                command: Command::Demo(a),
            }) => a,
            other => panic!("`cluster demo` does not parse as demo: {other:?}"),
        };
        assert_eq!(format!("{:?}", up.cluster), format!("{:?}", demo.cluster));
        let from_demo = match crate::up::UpArgs::with_defaults(demo.cluster) {
            Ok(a) => a,
            Err(e) => panic!("{e}"),
        };
        assert_eq!(format!("{up:?}"), format!("{from_demo:?}"));
        assert!(Cli::try_parse_from(["cluster", "up", "--no-router", "--http-port", "1"]).is_err());
    }
}
