//! `shardgate reshard`: splitting one shard into two online, step by step or all at once.
//!
//! The rows of each new half are selected by Postgres itself: a publication per half on the
//! source whose row filter is the half's placement predicate, a subscription on each new
//! primary that copies the existing rows and then streams every change ([`copy`]); its
//! progress and a comparison of source and targets ([`status`]); the switch of every router
//! to the new map with the shard paused, nothing lost and nothing failed, rolled back on any
//! failure ([`cutover`]); and the removal of what the split made ([`cleanup`]). The plan
//! ([`plan`]) is pure and names everything; docs/resharding.md is the operator's walk-through.

pub mod cleanup;
pub mod copy;
pub mod cutover;
pub mod db;
pub mod plan;
pub mod status;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Subcommand;
use shardmap::KeyRange;

use plan::Plan;

#[derive(Subcommand, Debug)]
pub enum ReshardCommand {
    /// Plan a split of one shard into its two halves and check that it can run: the key
    /// column is in each table's primary key or replica identity, wal_level = logical on the
    /// source, the targets are reachable and empty. Writes the plan file the other steps read.
    Plan {
        /// The shard map the routers run.
        #[arg(long, value_name = "FILE")]
        shardmap: PathBuf,
        /// The exact range of the shard to split, e.g. 40-80 or -80.
        #[arg(long, allow_hyphen_values = true)]
        range: String,
        /// The primary of the lower half, then (given again) of the upper half, as
        /// postgres://USER:PASSWORD@HOST:PORT/DATABASE. One may be the shard's own primary:
        /// that half stays.
        #[arg(long, value_name = "URL", required = true)]
        into: Vec<String>,
        /// Where to write the plan.
        #[arg(long, value_name = "FILE", default_value = "split.toml")]
        out: PathBuf,
    },
    /// Copy the schema to the targets (pg_dump --schema-only into psql), create the
    /// publications on the source and the subscriptions on the targets. The initial copy and
    /// the stream then run inside Postgres; safe to run again after a failure.
    Start {
        #[arg(long, value_name = "FILE", default_value = "split.toml")]
        plan: PathBuf,
        /// Directory of pg_dump and psql (default: PATH, then /usr/lib/postgresql/*/bin).
        #[arg(long, value_name = "DIR")]
        pg_bin: Option<PathBuf>,
    },
    /// Per target and table: the copy's state and rows; per target: the replication lag in
    /// bytes and seconds. Exits 0 when every table is ready to cut over, 3 when not yet.
    Status {
        #[arg(long, value_name = "FILE", default_value = "split.toml")]
        plan: PathBuf,
    },
    /// Compare row counts and checksums per table and new range, source against target,
    /// until a round matches (under writes the target trails the source by a moment). Exits
    /// 1 when differences remain.
    Verify {
        #[arg(long, value_name = "FILE", default_value = "split.toml")]
        plan: PathBuf,
        /// Rounds at most.
        #[arg(long, default_value_t = 5)]
        rounds: u32,
        /// Time between rounds.
        #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = humantime::parse_duration)]
        interval: Duration,
    },
    /// Switch every router to the new map: pause the shard on every router, wait for its
    /// transactions to end, fence the source, wait for the targets to apply everything, verify,
    /// publish the new map, reload, resume. Any failure, or the pause passing --max-pause,
    /// rolls back to the old map.
    Cutover(CutoverArgs),
    /// Drop the subscriptions, the slots (also those of an abandoned split whose target is
    /// gone), the publications and the split's tables. After a cut-over the source's fence
    /// stays and the moved rows are deleted only with --delete-moved.
    Cleanup {
        #[arg(long, value_name = "FILE", default_value = "split.toml")]
        plan: PathBuf,
        /// After a cut-over: delete the moved rows from the source.
        #[arg(long)]
        delete_moved: bool,
        /// For a split that was not cut over: drop the tables copied to the targets.
        #[arg(long)]
        reset_targets: bool,
    },
    /// start, wait until every table is ready (at most --ready-timeout), then cutover.
    Run {
        #[command(flatten)]
        cutover: CutoverArgs,
        /// Directory of pg_dump and psql.
        #[arg(long, value_name = "DIR")]
        pg_bin: Option<PathBuf>,
        /// How long the initial copy may take.
        #[arg(long, value_name = "DURATION", default_value = "1h", value_parser = humantime::parse_duration)]
        ready_timeout: Duration,
    },
}

#[derive(clap::Args, Debug)]
pub struct CutoverArgs {
    #[arg(long, value_name = "FILE", default_value = "split.toml")]
    plan: PathBuf,
    /// A router's admin console, postgres://ADMIN:PASSWORD@HOST:PORT/shardgate; give every
    /// router of the fleet.
    #[arg(long = "router", value_name = "URL", required = true)]
    routers: Vec<String>,
    /// A shard map file the routers read (their config's `shardmap`); rewritten atomically
    /// with the new map, a copy of the old kept beside it. Repeat for several files.
    #[arg(long = "shardmap", value_name = "FILE", required = true)]
    shardmaps: Vec<PathBuf>,
    /// A shell command run after the map file is written (and after the old one is put back
    /// on a rollback), to carry it to the routers' hosts; $SHARDGATE_SHARDMAP names the file.
    #[arg(long, value_name = "CMD")]
    publish_command: Option<String>,
    /// The longest the shard may stay paused; past it the cut-over rolls back. Must be below
    /// every router's [pool] pause_timeout_ms (after which held statements fail): checked first.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = humantime::parse_duration)]
    max_pause: Duration,
    /// Skip the comparison of counts and checksums while paused (a shorter pause).
    #[arg(long)]
    no_verify: bool,
}

/// Writes a file only its owner can read (a plan holds the primaries' passwords).
fn write_private(path: &Path, text: &str) -> Result<(), String> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let _ = std::fs::remove_file(path);
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .map_err(|e| format!("{}: {e}", path.display()))
}

fn read_plan(path: &Path) -> Result<Plan, String> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        format!(
            "{}: {e} (write it with `shardgate reshard plan`)",
            path.display()
        )
    })?;
    Plan::parse(&text, &path.display().to_string())
}

/// Runs a reshard step; `Ok(false)` is a step that ran but did not succeed (exit status).
pub fn run(cmd: ReshardCommand) -> Result<std::process::ExitCode, String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    runtime.block_on(run_async(cmd))
}

async fn run_async(cmd: ReshardCommand) -> Result<std::process::ExitCode, String> {
    use std::process::ExitCode;
    match cmd {
        ReshardCommand::Plan {
            shardmap,
            range,
            into,
            out,
        } => {
            let map = shardmap::load(&shardmap).map_err(|e| e.to_string())?;
            let range = KeyRange::parse(&range).map_err(|e| format!("--range {range:?}: {e}"))?;
            let plan = Plan::new(&map, &range, &into)?;
            print!("{}", plan.describe());
            let (problems, notes) = copy::check(&plan).await?;
            for n in &notes {
                println!("note: {n}");
            }
            if !problems.is_empty() {
                return Err(format!(
                    "the split cannot run; no plan written:\n  {}",
                    problems.join("\n  ")
                ));
            }
            write_private(&out, &plan.to_toml())?;
            println!(
                "checks passed; plan written to {} (next: shardgate reshard start --plan {})",
                out.display(),
                out.display()
            );
            Ok(ExitCode::SUCCESS)
        }
        ReshardCommand::Start { plan, pg_bin } => {
            copy::start(&read_plan(&plan)?, pg_bin.as_deref()).await?;
            Ok(ExitCode::SUCCESS)
        }
        ReshardCommand::Status { plan } => Ok(if status::status(&read_plan(&plan)?).await? {
            println!("ready to cut over");
            ExitCode::SUCCESS
        } else {
            ExitCode::from(3)
        }),
        ReshardCommand::Verify {
            plan,
            rounds,
            interval,
        } => Ok(
            if status::verify(&read_plan(&plan)?, rounds, interval).await? {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            },
        ),
        ReshardCommand::Cutover(args) => {
            cut_over(&args).await?;
            Ok(ExitCode::SUCCESS)
        }
        ReshardCommand::Cleanup {
            plan,
            delete_moved,
            reset_targets,
        } => {
            let opts = cleanup::Cleanup {
                delete_moved,
                reset_targets,
            };
            cleanup::cleanup(&read_plan(&plan)?, &opts).await?;
            Ok(ExitCode::SUCCESS)
        }
        ReshardCommand::Run {
            cutover,
            pg_bin,
            ready_timeout,
        } => {
            let plan = read_plan(&cutover.plan)?;
            copy::start(&plan, pg_bin.as_deref()).await?;
            let deadline = Instant::now() + ready_timeout;
            let source = db::connect(&plan.source, "the source").await?;
            loop {
                let mut ready = true;
                for (i, _) in plan.moving() {
                    ready &= status::part_status(&plan, &source, i, false).await?.ready;
                }
                if ready {
                    break;
                }
                if Instant::now() > deadline {
                    return Err(format!(
                        "the initial copy is not done after --ready-timeout {ready_timeout:?}; it goes on: see `shardgate reshard status`, then run cutover"
                    ));
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            println!("every table copied and streaming: cutting over");
            cut_over(&cutover).await?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

async fn cut_over(args: &CutoverArgs) -> Result<(), String> {
    let plan = read_plan(&args.plan)?;
    let c = cutover::Cutover {
        plan: &plan,
        routers: &args.routers,
        shardmaps: &args.shardmaps,
        publish_command: args.publish_command.as_deref(),
        max_pause: args.max_pause,
        verify: !args.no_verify,
    };
    cutover::cutover(&c).await.map(|_| ())
}
