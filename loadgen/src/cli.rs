//! The command line: `loadgen prepare`, `run`, `merge`, `compare` and `storm`, their options
//! (with the help text operators read), and turning them into configurations.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::prepare::{self, PrepareConfig};
use crate::report::Report;
use crate::run::{self, Rate, RunConfig};
use crate::target::Topology;
use crate::workload::{Mix, Protocol};

/// Load generator for shardgate: prepares data on every shard, drives open-loop load through
/// routers (or straight at the shards) and reports throughput per shard and latency measured
/// from each request's intended send time.
#[derive(Debug, Parser)]
#[command(name = "loadgen", version, about, long_about = None, after_help = "See docs/loadgen.md for the full manual.")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create table kv where missing and load the same number of rows into every shard.
    Prepare(PrepareArgs),
    /// Drive load and report throughput, latency and errors.
    Run(Box<RunArgs>),
    /// Merge the --json reports of several loadgen hosts into one (histograms exactly).
    Merge(MergeArgs),
    /// Set two --json reports side by side: throughput, p50 to max, mean, errors and timeouts
    /// per million, before, after, change and ratio, overall and per shard (worst first).
    Compare(CompareArgs),
    /// Logins rather than queries: N clients logging in at the same instant (a reconnect
    /// storm), and/or M silent TCP connections held open (slowloris) while a bystander logs in
    /// every 200 ms. Exit status 0 when every storm login succeeded and the bystander never
    /// failed, 1 otherwise.
    Storm(StormArgs),
    /// A fixed-rate mix of reads, counter increments, inserts and two-phase transfers through
    /// several routers while a schedule of faults (shell commands at given seconds) is
    /// applied; then the invariants checked on the shards (bank total, acknowledged inserts
    /// exactly once, counters, no prepared transaction left) and a timeline (text, JSON, CSV,
    /// SVG) with each fault's errors, p99 and time to recover. Exit status 0 when every
    /// invariant held. Used by benches/chaos.sh.
    Chaos(Box<crate::chaos::ChaosArgs>),
    /// A TCP proxy for experiments: adds a delay each way (sub-millisecond, in user space),
    /// and on command from its control port cuts a route's connections or holds its traffic
    /// like a link that went down. Runs until killed.
    Proxy(crate::proxy::ProxyArgs),
}

/// Where load and data go (shared by prepare and run).
#[derive(Debug, Args)]
pub struct TargetArgs {
    /// Shard map file (shardmap.toml). Alone: connect straight to every shard's primary. With
    /// --target: go through the routers and use the map to pick keys per shard and attribute
    /// every request to its shard.
    #[arg(long, value_name = "FILE")]
    pub shardmap: Option<PathBuf>,
    /// postgres://USER:PASSWORD@HOST:PORT/DB of a router; repeat for several routers
    /// (connections are spread over them round robin). Without --shardmap, one plain
    /// (unsharded) database.
    #[arg(long = "target", value_name = "URL")]
    pub targets: Vec<String>,
    /// Rows each shard holds: keys 1, 2, 3, ... go to their shards (by the map's hash) until
    /// every shard has this many. prepare and run must be given the same number.
    #[arg(long, value_name = "N", default_value_t = 100_000)]
    pub rows_per_shard: usize,
    /// Length in characters of the v column written by prepare, updates and inserts.
    #[arg(long, value_name = "CHARS", default_value_t = 32)]
    pub value_size: usize,
}

#[derive(Debug, Args)]
pub struct PrepareArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    /// Shards loaded at the same time (one connection each).
    #[arg(long, value_name = "N", default_value_t = 4)]
    pub jobs: usize,
    /// Empty kv on every shard before loading (straight to the shards only).
    #[arg(long)]
    pub reset: bool,
    /// Connect timeout, e.g. 5s.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    pub timeout: Duration,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    /// Connections in total. Through routers they are spread over the --target URLs and each
    /// serves every shard; straight to the shards each serves one shard, and there is at
    /// least one per shard.
    #[arg(long, short = 'c', value_name = "N", default_value_t = 8)]
    pub connections: usize,
    /// Requests in flight per connection (tokio-postgres pipelines them on the socket).
    #[arg(long, value_name = "K", default_value_t = 1)]
    pub pipeline: usize,
    /// How long to measure, e.g. 30s, 2m, 500ms (a bare number is seconds).
    #[arg(long, short = 'd', value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Load before measuring starts (not counted in the report, shown in progress).
    #[arg(long, value_name = "DURATION", default_value = "0s", value_parser = parse_duration)]
    pub warmup: Duration,
    /// Requests a second over all shards (open loop: sent at their scheduled times, latency
    /// measured from then), or `max` for closed loop (each connection sends the next request
    /// as soon as one of its --pipeline slots is free).
    #[arg(long, value_name = "R|max", conflicts_with = "rate_per_shard", value_parser = parse_rate)]
    pub rate: Option<RateArg>,
    /// Requests a second to each shard (open loop); the total is this times the shard count.
    #[arg(long, value_name = "R")]
    pub rate_per_shard: Option<f64>,
    /// Operation weights: read = `SELECT v FROM kv WHERE id = $1`, update = `UPDATE kv SET v
    /// = $2 WHERE id = $1`, insert = `INSERT .. ON CONFLICT (id) DO NOTHING` of a new key.
    #[arg(long, value_name = "read=W,update=W,insert=W", default_value = "read=100", value_parser = Mix::parse)]
    pub mix: Mix,
    /// Zipfian keys within each shard with this exponent (1.0 = classic; the shard's lowest
    /// ids are hottest). Default: uniform over the loaded keys.
    #[arg(long, value_name = "S")]
    pub zipf: Option<f64>,
    /// simple = Query message with literals; extended = Parse/Bind/Execute of the unnamed
    /// statement each time; prepared = prepared once per connection, Bind/Execute after.
    #[arg(long, value_enum, default_value_t = Protocol::Prepared)]
    pub protocol: Protocol,
    /// A request not answered this long after its intended send time counts as a timeout
    /// (also the connect timeout when a connection is reopened).
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = parse_duration)]
    pub timeout: Duration,
    /// Open loop: when a connection wakes for a request, it also sends those due within this
    /// window (timed from when they leave, so never flattered). 0 sends every request at its
    /// own time, one wake-up each; a window batches requests at high rates per connection
    /// and saves CPU, at the cost of sending some up to the window early.
    #[arg(long, value_name = "DURATION", default_value = "0s", value_parser = parse_duration)]
    pub batch_window: Duration,
    /// Worker threads of loadgen (default: the cores it may use).
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
    /// Write the full report (histograms, per-shard counts, time series) as JSON.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Draw QPS and p50/p99 over time and QPS per shard into an SVG file.
    #[arg(long, value_name = "FILE.svg")]
    pub chart: Option<PathBuf>,
    /// Seed for key and operation choices (default: random).
    #[arg(long, value_name = "N")]
    pub seed: Option<u64>,
    /// Start the load at this wall-clock time, so loadgens on several hosts start together and
    /// their windows line up: RFC 3339 (2026-12-01T21:30:00.250Z, 2026-12-01T22:30:00+01:00,
    /// what `date -Iseconds` prints) or Unix seconds (1796160600.25). Connections are opened
    /// before it; it must still be ahead once they are, and within a day. Hosts' clocks must
    /// agree (NTP/chrony: within a few ms).
    #[arg(long, value_name = "TIME", value_parser = parse_time)]
    pub start_at: Option<std::time::SystemTime>,
    /// This host's name in the report and in merged reports (default: its hostname).
    #[arg(long, value_name = "NAME")]
    pub label: Option<String>,
    /// No progress lines on stderr.
    #[arg(long, short = 'q')]
    pub quiet: bool,
}

#[derive(Debug, Args)]
pub struct MergeArgs {
    /// JSON reports (`loadgen run --json`) of hosts that ran at the same time against the
    /// same shard map.
    #[arg(required = true, value_name = "REPORT.json")]
    pub reports: Vec<PathBuf>,
    /// Write the merged report as JSON.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Draw the merged chart into an SVG file.
    #[arg(long, value_name = "FILE.svg")]
    pub chart: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct CompareArgs {
    /// The report of the run before the change (`loadgen run --json` or `merge --json`).
    #[arg(value_name = "BEFORE.json")]
    pub before: PathBuf,
    /// The report of the run after it, same workload.
    #[arg(value_name = "AFTER.json")]
    pub after: PathBuf,
    /// Shards shown in the table, worst first (all are in --json).
    #[arg(long, value_name = "N", default_value_t = 10)]
    pub shards: usize,
    /// Write the comparison as JSON.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Draw both latency distributions (by percentile, log scale) and both time series into
    /// an SVG file.
    #[arg(long, value_name = "FILE.svg")]
    pub chart: Option<PathBuf>,
}

#[derive(Debug, Args)]
#[command(after_help = "\
Phases run in this order: the login storm (--logins), then the slowloris (--silent and the \
bystander). Examples:
  loadgen storm --target postgres://app:pw@127.0.0.1:6432/app --logins 10000 --router-pid $PID
  loadgen storm --target postgres://app:pw@localhost:6432/app --logins 10000 --tls-ca ca.pem
  loadgen storm --target postgres://app:pw@127.0.0.1:6432/app --silent 1500 \\
      --silent-from 127.0.0.2 --bystander-every-ms 200 --duration-s 30 --json slowloris.json
See docs/loadgen.md, \"loadgen storm\".")]
pub struct StormArgs {
    /// postgres://USER:PASSWORD@HOST:PORT/DB of the server (router, Postgres, PgBouncer), or
    /// a key=value string. A password is used as the server asks (SCRAM-SHA-256, md5, plain).
    #[arg(long, value_name = "URL")]
    pub target: String,
    /// Clients that log in at the same instant: N tasks wait on one barrier, then all connect;
    /// each runs SELECT 1 and keeps its connection until every login has finished, so the
    /// server holds N logged-in clients at the end (as after a fleet restart). 0: no storm.
    #[arg(long, short = 'n', value_name = "N", default_value_t = 0)]
    pub logins: usize,
    /// Raw TCP connections that connect and never send a byte (slowloris); each one the server
    /// closes is reopened at once, for --duration-s. Always plain TCP. 0: none.
    #[arg(long, value_name = "M", default_value_t = 0)]
    pub silent: usize,
    /// Bind the silent connections to this source address, so the server sees them come from
    /// elsewhere than the bystander (e.g. 127.0.0.2: Linux routes all of 127/8 over loopback).
    #[arg(long, value_name = "IP")]
    pub silent_from: Option<std::net::IpAddr>,
    /// A bystander logs in on a fresh connection every MS ms for --duration-s, runs SELECT 1
    /// and disconnects; it starts once the silent connections are open (or after 5 s).
    /// Default: 200 when --silent is given, else no bystander; 0 turns it off.
    #[arg(long, value_name = "MS")]
    pub bystander_every_ms: Option<u64>,
    /// How long the slowloris and the bystander last, in seconds.
    #[arg(long, value_name = "S", default_value_t = 10.0)]
    pub duration_s: f64,
    /// Log in with TLS (sslmode=require), checking the server's certificate against the CAs
    /// in this PEM file; the name checked is the host of --target.
    #[arg(long, value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,
    /// The server's process id (same machine): report its CPU time per login from /proc/PID/stat
    /// over each phase, and its memory from /proc/PID/status (VmHWM, the lifetime peak, and
    /// VmRSS) at the end of each phase.
    #[arg(long, value_name = "PID")]
    pub router_pid: Option<u32>,
    /// Longest a login (TCP, TLS, authentication), a SELECT 1 or a silent connect may take, in
    /// seconds; a login that takes longer fails as `timeout`.
    #[arg(long, value_name = "S", default_value_t = 60.0)]
    pub timeout_s: f64,
    /// Also write the figures as JSON.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// No progress lines on stderr.
    #[arg(long, short = 'q')]
    pub quiet: bool,
}

/// Slowest open-loop rate (once in about 17 minutes) and fastest (far beyond any machine).
pub const MIN_RATE: f64 = 0.001;
pub const MAX_RATE: f64 = 1e9;

/// `--rate` as given.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RateArg {
    Max,
    PerSecond(f64),
}

fn parse_rate(text: &str) -> Result<RateArg, String> {
    if text.eq_ignore_ascii_case("max") {
        return Ok(RateArg::Max);
    }
    match text.trim().trim_end_matches("/s").parse::<f64>() {
        Ok(r) if (MIN_RATE..=MAX_RATE).contains(&r) => Ok(RateArg::PerSecond(r)),
        Ok(r) if r > 0.0 && r.is_finite() => Err(format!(
            "{text:?}: give between {MIN_RATE} and {MAX_RATE:e} requests a second"
        )),
        _ => Err(format!(
            "{text:?} is not a rate: give requests a second (e.g. 5000) or max"
        )),
    }
}

/// An RFC 3339 time (`Z` or a `+HH:MM` / `-HH:MM` offset, as `date -Iseconds` prints) or
/// Unix seconds (with a fraction).
pub fn parse_time(text: &str) -> Result<std::time::SystemTime, String> {
    let t = text.trim();
    let bad = |why: String| {
        format!(
            "{text:?} is not a time ({why}): write RFC 3339 (2026-12-01T21:30:00Z, 2026-12-01T22:30:00+01:00) or Unix seconds (1796160600.25)"
        )
    };
    if let Ok(secs) = t.parse::<f64>() {
        return Duration::try_from_secs_f64(secs)
            .ok()
            .and_then(|d| std::time::UNIX_EPOCH.checked_add(d))
            .ok_or_else(|| bad("out of range".into()));
    }
    // humantime reads only UTC (`Z`): take a numeric offset off and apply it.
    let (local, offset_s) = match t.len().checked_sub(6).map(|i| t.split_at(i)) {
        Some((head, tail))
            if tail.len() == 6
                && (tail.starts_with('+') || tail.starts_with('-'))
                && tail.as_bytes()[3] == b':' =>
        {
            let hours: i64 = tail[1..3].parse().map_err(|_| bad("bad offset".into()))?;
            let minutes: i64 = tail[4..].parse().map_err(|_| bad("bad offset".into()))?;
            let sign = if tail.starts_with('-') { -1 } else { 1 };
            (format!("{head}Z"), sign * (hours * 3600 + minutes * 60))
        }
        _ => (t.to_string(), 0),
    };
    let utc = humantime::parse_rfc3339(&local).map_err(|e| bad(e.to_string()))?;
    let shift = Duration::from_secs(offset_s.unsigned_abs());
    // 12:00+01:00 is 11:00Z.
    let at = if offset_s >= 0 {
        utc.checked_sub(shift)
    } else {
        utc.checked_add(shift)
    };
    at.ok_or_else(|| bad("out of range".into()))
}

/// `30s`, `2m`, `500ms`, `50us`, `1h`, `1.5s` or a bare number of seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num
        .parse()
        .map_err(|_| format!("{text:?} is not a duration: write e.g. 30s, 2m, 500ms"))?;
    let secs = match unit.trim() {
        "" | "s" => value,
        "ms" => value / 1000.0,
        "us" | "µs" => value / 1e6,
        "m" | "min" => value * 60.0,
        "h" => value * 3600.0,
        other => {
            return Err(format!(
                "{text:?}: unknown unit {other:?}; use us, ms, s, m or h"
            ))
        }
    };
    if !secs.is_finite() || secs < 0.0 {
        return Err(format!("{text:?} is not a duration"));
    }
    if secs > MAX_DURATION_S {
        return Err(format!("{text:?} is longer than a year"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// No duration loadgen takes is longer (it keeps instants far from overflow).
const MAX_DURATION_S: f64 = 366.0 * 24.0 * 3600.0;

/// Runs the command line; returns the process exit code.
pub fn main() -> i32 {
    let cli = Cli::parse();
    match dispatch(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("loadgen: {e}");
            1
        }
    }
}

/// The async runtime: one thread runs everything when `threads` is 1 (fewest cross-thread
/// wake-ups), else a work-stealing pool of `threads` workers.
fn runtime(threads: usize) -> Result<tokio::runtime::Runtime, crate::Error> {
    let mut builder = if threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(threads);
        b
    };
    builder
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))
}

fn dispatch(cli: Cli) -> Result<i32, crate::Error> {
    match cli.command {
        Command::Prepare(a) => {
            let topology = Topology::resolve(a.target.shardmap.as_deref(), &a.target.targets)?;
            eprintln!(
                "loadgen prepare: {} rows per shard into {}",
                a.target.rows_per_shard,
                prepare::describe(&topology)
            );
            let cfg = PrepareConfig {
                topology,
                rows_per_shard: a.target.rows_per_shard,
                value_size: a.target.value_size,
                jobs: a.jobs,
                reset: a.reset,
                timeout: a.timeout,
                progress: !a.quiet,
            };
            runtime(crate::cpu::cores_available())?.block_on(prepare::prepare(&cfg))?;
            Ok(0)
        }
        Command::Run(a) => {
            let a = *a;
            let topology = Topology::resolve(a.target.shardmap.as_deref(), &a.target.targets)?;
            let rate = match (a.rate, a.rate_per_shard) {
                (Some(RateArg::Max), _) => Rate::Max,
                (Some(RateArg::PerSecond(r)), _) => Rate::Total(r),
                (None, Some(r)) if (MIN_RATE..=MAX_RATE).contains(&r) => Rate::PerShard(r),
                (None, Some(r)) => {
                    return Err(format!(
                        "--rate-per-shard {r}: give between {MIN_RATE} and {MAX_RATE:e} requests a second"
                    ))
                }
                (None, None) => Rate::Total(1000.0),
            };
            if a.pipeline == 0 || a.connections == 0 {
                return Err("--connections and --pipeline must be at least 1".into());
            }
            if a.duration.is_zero() {
                return Err("--duration must be above 0".into());
            }
            if a.timeout.is_zero() {
                return Err("--timeout must be above 0".into());
            }
            let threads = a.threads.unwrap_or_else(crate::cpu::cores_available).max(1);
            let cfg = RunConfig {
                topology,
                rows_per_shard: a.target.rows_per_shard,
                connections: a.connections,
                pipeline: a.pipeline,
                duration: a.duration,
                warmup: a.warmup,
                rate,
                mix: a.mix,
                zipf: a.zipf,
                protocol: a.protocol,
                timeout: a.timeout,
                batch_window: a.batch_window,
                threads,
                value_size: a.target.value_size,
                quiet: a.quiet,
                seed: a.seed,
                start_at: a.start_at,
                label: a.label,
            };
            let report = runtime(threads)?.block_on(run::run(&cfg))?;
            finish(&report, a.json.as_deref(), a.chart.as_deref())?;
            Ok(0)
        }
        Command::Merge(a) => {
            let reports = a
                .reports
                .iter()
                .map(|p| Report::read(p).map(|r| (p.display().to_string(), r)))
                .collect::<Result<Vec<_>, _>>()?;
            let merged = crate::merge::merge(&reports)?;
            finish(&merged, a.json.as_deref(), a.chart.as_deref())?;
            Ok(0)
        }
        Command::Compare(a) => {
            let before = Report::read(&a.before)?;
            let after = Report::read(&a.after)?;
            let (bn, an) = (
                a.before.display().to_string(),
                a.after.display().to_string(),
            );
            let cmp = crate::compare::compare(&bn, &before, &an, &after)?;
            print!("{}", cmp.render(a.shards));
            if let Some(path) = &a.json {
                let text = serde_json::to_string_pretty(&cmp)
                    .map_err(|e| format!("cannot encode the comparison: {e}"))?;
                std::fs::write(path, text + "\n")
                    .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
                eprintln!("loadgen: wrote {}", path.display());
            }
            if let Some(path) = &a.chart {
                crate::chart::draw_compare(&cmp, &before, &after, path)?;
                eprintln!("loadgen: wrote {}", path.display());
            }
            Ok(0)
        }
        Command::Storm(a) => storm(a),
        Command::Chaos(a) => crate::chaos::run(*a),
        Command::Proxy(a) => crate::proxy::run(a),
    }
}

/// Seconds from the command line as a duration (positive, at most a year).
fn seconds(flag: &str, s: f64) -> Result<Duration, crate::Error> {
    if !(s > 0.0 && s <= MAX_DURATION_S) {
        return Err(format!("{flag} {s}: give a number of seconds above 0"));
    }
    Ok(Duration::from_secs_f64(s))
}

/// `loadgen storm`: checks the options, raises the open-file limit, runs, prints.
fn storm(a: StormArgs) -> Result<i32, crate::Error> {
    use crate::storm::{self, StormConfig};
    let bystander_every = match a.bystander_every_ms {
        Some(0) => None,
        Some(ms) => Some(Duration::from_millis(ms)),
        None if a.silent > 0 => Some(Duration::from_millis(200)),
        None => None,
    };
    if a.silent_from.is_some() && a.silent == 0 {
        return Err("--silent-from needs --silent M".into());
    }
    let cfg = StormConfig {
        target: a.target,
        logins: a.logins,
        silent: a.silent,
        silent_from: a.silent_from,
        bystander_every,
        duration: seconds("--duration-s", a.duration_s)?,
        tls_ca: a.tls_ca,
        server_pid: a.router_pid,
        timeout: seconds("--timeout-s", a.timeout_s)?,
        quiet: a.quiet,
    };
    if cfg.logins == 0 && !cfg.slowloris() {
        return Err("nothing to do: give --logins N, --silent M or --bystander-every-ms MS".into());
    }
    let need = (cfg.logins as u64)
        .saturating_add(cfg.silent as u64)
        .saturating_add(storm::SPARE_FILES);
    storm::raise_nofile(need)?;
    let report = runtime(crate::cpu::cores_available().max(2))?.block_on(storm::storm(&cfg))?;
    print!("{}", report.render());
    if let Some(path) = &a.json {
        report.write(path)?;
        eprintln!("loadgen: wrote {}", path.display());
    }
    Ok(if report.passed { 0 } else { 1 })
}

/// Prints the table and writes the JSON and the chart.
fn finish(
    report: &Report,
    json: Option<&std::path::Path>,
    chart: Option<&std::path::Path>,
) -> Result<(), crate::Error> {
    print!("{}", report.render());
    for w in &report.warnings {
        eprintln!("loadgen: warning: {w}");
    }
    if let Some(path) = json {
        report.write(path)?;
        eprintln!("loadgen: wrote {}", path.display());
    }
    if let Some(path) = chart {
        crate::chart::draw(report, path)?;
        eprintln!("loadgen: wrote {}", path.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("50us"), Ok(Duration::from_micros(50)));
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("3 parsecs").is_err());
    }

    #[test]
    fn times() {
        let t = parse_time("2026-12-01T21:30:00.250Z").expect("rfc3339");
        assert_eq!(parse_time("1796160600.25"), Ok(t));
        assert_eq!(parse_time("2026-12-01T22:30:00.250+01:00"), Ok(t));
        assert_eq!(parse_time("2026-12-01T16:00:00.250-05:30"), Ok(t));
        assert_eq!(
            parse_time("2026-12-01T21:30:00+00:00"),
            parse_time("2026-12-01T21:30:00Z")
        );
        for bad in [
            "tomorrow",
            "2026-12-01 21:30",
            "1e30",
            "-5",
            "2026-12-01T21:30:00+1:00",
        ] {
            assert!(parse_time(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn huge_values_are_refused_not_a_panic() {
        assert!(parse_duration("99999999999999999999h").is_err());
        assert!(parse_duration("400d").is_err());
        assert!(parse_rate("1e-300").is_err());
        assert!(parse_rate("1e300").is_err());
    }

    #[test]
    fn rates() {
        assert_eq!(parse_rate("max"), Ok(RateArg::Max));
        assert_eq!(parse_rate("2500"), Ok(RateArg::PerSecond(2500.0)));
        assert!(parse_rate("0").is_err());
        assert!(parse_rate("fast").is_err());
    }

    #[test]
    fn command_line_is_consistent() {
        Cli::command().debug_assert();
    }
}
