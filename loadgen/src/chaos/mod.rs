//! `loadgen chaos`: a fixed-rate mix of reads, increments, inserts and transfers through a
//! fleet of routers while a schedule of faults is applied, then the invariants checked on the
//! shards and a timeline an operator can read.
//!
//! The parts: [`bank`] (the tables, their setup and the invariants), [`lanes`] (the load and
//! its ledger), [`faults`] (the schedule and its runner), [`timeline`] (per-second figures and
//! each fault's window), [`report`] (the tables, JSON and CSV) and [`chart`] (the SVG).
//! `benches/chaos.sh` builds a fleet, writes the fault commands and calls this.

pub mod bank;
pub mod chart;
pub mod faults;
pub mod lanes;
pub mod report;
pub mod timeline;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;

use self::bank::Size;
use self::lanes::{Mix, Shared};
use self::timeline::Timeline;

/// `loadgen chaos` options.
#[derive(Debug, Args)]
pub struct ChaosArgs {
    /// Shard map file: the tables chaos_accounts, chaos_counters and chaos_events must be in it,
    /// sharded by `id` (bigint). Setup and the checks at the end connect to every shard's
    /// primary as the file says at that moment (a failover or split may have changed it).
    #[arg(long, value_name = "FILE")]
    pub shardmap: PathBuf,
    /// postgres://USER:PASSWORD@HOST:PORT/DB of a router; repeat for several. Each connection
    /// goes to the next router in turn, and to the next again when its connection breaks.
    #[arg(long = "target", value_name = "URL", required = true)]
    pub targets: Vec<String>,
    /// Requests a second, all connections together (open loop: sent on schedule whatever the
    /// answers do, latency measured from the intended send time).
    #[arg(long, default_value_t = 500.0)]
    pub rate: f64,
    /// How long the load runs, in seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 60.0)]
    pub duration: f64,
    /// Connections (lanes), spread over the routers.
    #[arg(long, default_value_t = 16)]
    pub connections: usize,
    /// Weights of the operations: read (a point SELECT), increment (counter n = n + 1), insert
    /// (an event with a fresh id), transfer (BEGIN, debit one account, credit another, COMMIT:
    /// across shards, the routers' two-phase commit).
    #[arg(long, default_value = "read=50,increment=20,insert=15,transfer=15")]
    pub mix: Mix,
    /// A request not answered this long after its intended send time is a timeout.
    #[arg(long, value_name = "SECONDS", default_value_t = 10.0)]
    pub timeout: f64,
    /// Accounts (each starts with --initial-balance) and counters (each at 0).
    #[arg(long, default_value_t = 2000)]
    pub accounts: i64,
    #[arg(long, default_value_t = 500)]
    pub counters: i64,
    #[arg(long, default_value_t = 1000)]
    pub initial_balance: i64,
    /// A file of faults, one per line: `AT NAME COMMAND` (AT in seconds after the load starts,
    /// or with s/m/h; COMMAND run with sh -c; `#` starts a comment). Faults run one at a time.
    #[arg(long, value_name = "FILE")]
    pub faults: Option<PathBuf>,
    /// One fault, as a line of --faults; repeatable.
    #[arg(long = "fault", value_name = "AT NAME COMMAND")]
    pub fault: Vec<String>,
    /// Directory for chaos.json, timeline.csv, chaos.svg and faults.log (created if missing).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// Seconds to wait at the end for in-doubt two-phase transactions to be resolved before
    /// counting the prepared transactions left.
    #[arg(long, value_name = "SECONDS", default_value_t = 60.0)]
    pub settle: f64,
    /// Seed of the operation mix and keys.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Use the tables as they are (no CREATE, TRUNCATE or load): for a second run on the same data
    /// the invariants then do not hold, so this is only for looking at the load.
    #[arg(long)]
    pub no_setup: bool,
}

/// Checks the options, runs, prints the report; exit status 0 when every invariant held and
/// every fault's command succeeded.
pub fn run(a: ChaosArgs) -> Result<i32, String> {
    let map = bank::load_map(&a.shardmap)?;
    if !(a.rate > 0.0 && a.rate <= 1e6) {
        return Err(format!(
            "--rate {}: give between 0 and 1e6 requests a second",
            a.rate
        ));
    }
    let positive = |s: f64| s > 0.0 && s <= 366.0 * 86400.0;
    if !positive(a.duration) || !positive(a.timeout) || a.settle.is_nan() || a.settle < 0.0 {
        return Err("--duration and --timeout must be above 0 seconds, --settle at least 0".into());
    }
    if a.connections == 0 || a.accounts < 2 || a.counters < 1 {
        return Err(
            "--connections and --counters must be at least 1, --accounts at least 2".into(),
        );
    }
    for t in &a.targets {
        shardmap::Primary::parse(t).map_err(|e| format!("--target: {e}"))?;
    }
    let schedule = faults::schedule(a.faults.as_deref(), &a.fault)?;
    if let Some(late) = schedule.iter().find(|f| f.at >= a.duration) {
        return Err(format!(
            "the fault {} at {}s is not inside the {}s of load",
            late.name, late.at, a.duration
        ));
    }
    std::fs::create_dir_all(&a.out)
        .map_err(|e| format!("cannot create {}: {e}", a.out.display()))?;
    let size = Size {
        accounts: a.accounts,
        counters: a.counters,
        initial_balance: a.initial_balance,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(crate::cpu::cores_available().clamp(1, 4))
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))?;
    rt.block_on(async {
        let timeout = Duration::from_secs_f64(a.timeout);
        if !a.no_setup {
            bank::setup(&map, size, timeout).await?;
        }
        let (seconds, applied, claims) = drive(&a, size, schedule).await?;
        eprintln!("loadgen chaos: load done; checking the invariants on the shards ...");
        let checks = bank::check(
            &a.shardmap,
            size,
            &claims,
            Duration::from_secs_f64(a.settle),
            timeout,
        )
        .await?;
        let report = report::Report::new(&a, &seconds, applied, checks);
        print!("{}", report.render());
        report.write(&a.out, &seconds)?;
        chart::draw(&report, &seconds, &a.out.join("chaos.svg"))?;
        eprintln!(
            "loadgen chaos: wrote {}/chaos.json, timeline.csv, chaos.svg, faults.log",
            a.out.display()
        );
        Ok(if report.passed() { 0 } else { 1 })
    })
}

/// Runs the lanes and the faults side by side; returns the timeline, the faults as applied
/// and the ledger.
async fn drive(
    a: &ChaosArgs,
    size: Size,
    schedule: Vec<faults::Fault>,
) -> Result<(Vec<timeline::Second>, Vec<faults::Applied>, bank::Claims), String> {
    // A second's lead: every lane has its timer before the first request is due.
    let start = Instant::now() + Duration::from_secs(1);
    let end = start + Duration::from_secs_f64(a.duration);
    let interval = Duration::from_secs_f64(a.connections as f64 / a.rate);
    let shared = Arc::new(Shared::new(
        Timeline::new(start),
        a.targets.clone(),
        a.mix,
        size,
        Duration::from_secs_f64(a.timeout),
        end,
    ));
    let lanes: Vec<_> = (0..a.connections)
        .map(|i| {
            let first = start + interval.mul_f64(i as f64 / a.connections as f64);
            tokio::spawn(lanes::lane(i, shared.clone(), first, interval, a.seed))
        })
        .collect();
    let log = a.out.join("faults.log");
    let applied = faults::run(schedule, start, &log).await?;
    let mut inserts = Vec::with_capacity(lanes.len());
    for lane in lanes {
        inserts.push(lane.await.map_err(|e| format!("a lane failed: {e}"))??);
    }
    Ok((shared.timeline.snapshot(), applied, shared.claims(inserts)))
}
