//! `loadgen run`: connects every lane ([`crate::plan`] says how many and where), starts them
//! together (now or at `--start-at`), collects every lane's last second once a second for the
//! progress line and the time series, and builds the report with per-shard, per-router and
//! per-host figures when the lanes are done. A lane's own loop is in [`crate::lane`].

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rand::rngs::SmallRng;
use rand::SeedableRng;
use tokio::task::JoinHandle;

use crate::cpu::{self, CpuTime};
use crate::keys::{KeyDist, ShardKeys};
use crate::lane::{Lane, Shared};
use crate::pacer::Pacer;
use crate::plan::{plan_lanes, LaneSpec};
pub use crate::plan::{Rate, RunConfig};
use crate::report::{Cpu, Host, Parts, Report, SeriesPoint};
use crate::schedule::Schedule;
use crate::stats::{LaneStats, ShardLatency, Tally, Totals};
use crate::target::{self, Mode};
use crate::workload::{self, Conn, Op};

/// How far ahead `--start-at` may be: hosts are started for one run, not scheduled for next
/// week (and a Unix time in milliseconds is a mistake, not a date 50,000 years away).
const MAX_START_AHEAD: Duration = Duration::from_secs(24 * 3600);

/// A lane's counters, shared with the once-a-second reporter.
type LaneCounters = Arc<Mutex<LaneStats>>;

/// Runs the load and builds the report.
pub async fn run(cfg: &RunConfig) -> Result<Report, crate::Error> {
    check(cfg)?;
    let map = &cfg.topology.map;
    let keys = ShardKeys::assign(map, cfg.rows_per_shard)?;
    let dist = KeyDist::new(cfg.zipf, cfg.rows_per_shard)?;
    let specs = plan_lanes(cfg);
    // Connect everything first: a wrong URL or password fails the run before it starts.
    let conns = connect_all(cfg, &specs).await?;
    let window = Window::of(cfg)?;
    let sh = Arc::new(shared(cfg, keys, dist, &window));
    let targets: Vec<usize> = specs.iter().map(|s| s.target).collect();
    let (lane_stats, handles) = spawn_lanes(cfg, specs, conns, &sh, window.start)?;
    let watched = watch(cfg, &lane_stats, handles, &window).await?;

    let (totals, by_router) = window_totals(cfg, &lane_stats, &targets, &sh)?;
    let wall = watched
        .finished
        .saturating_duration_since(window.measure_from);
    let cpu = cpu_use(cfg.threads, watched.cpu, wall, totals.counts.requests());
    let warnings = run_warnings(cfg, &cpu, &totals);
    let host = this_host(cfg, window.wall_measure_from, &totals, cpu)?;
    Report::build(Parts {
        settings: cfg.settings(),
        hosts: vec![host],
        routers: by_router,
        ranges: map.shards().iter().map(|s| s.range.to_string()).collect(),
        duration_s: cfg.duration.as_secs_f64(),
        target_qps: cfg.total_rate(),
        totals: &totals,
        series: &watched.series,
        cpu,
        warnings,
    })
}

/// Refuses settings the run cannot honour, before it connects to anything.
fn check(cfg: &RunConfig) -> Result<(), crate::Error> {
    if cfg.rows_per_shard == 0 && (cfg.mix.weight(Op::Read) > 0 || cfg.mix.weight(Op::Update) > 0) {
        return Err("--rows-per-shard must be at least 1 for reads and updates".into());
    }
    if let Some(r) = cfg.total_rate() {
        if !(crate::cli::MIN_RATE..=crate::cli::MAX_RATE * 1e3).contains(&r) {
            return Err(format!(
                "the rate must be between {} and {:e} requests a second, got {r}",
                crate::cli::MIN_RATE,
                crate::cli::MAX_RATE
            ));
        }
    }
    match cfg.start_at {
        Some(at) => check_start_at(at),
        None => Ok(()),
    }
}

/// Refuses a `--start-at` that has passed or is more than [`MAX_START_AHEAD`] away.
fn check_start_at(at: SystemTime) -> Result<(), crate::Error> {
    // The bound first: humantime cannot print years after 9999 (a Unix time in ms).
    match at.duration_since(SystemTime::now()) {
        Err(_) => Err(format!(
            "--start-at {} has already passed",
            humantime::format_rfc3339_millis(at)
        )),
        Ok(ahead) if ahead > MAX_START_AHEAD => Err(format!(
            "--start-at is {:.1} days from now; give a time within a day (Unix time in seconds, not milliseconds)",
            ahead.as_secs_f64() / 86_400.0
        )),
        Ok(_) => Ok(()),
    }
}

/// Opens every lane's connection at once; the first failure, in lane order, fails the run.
async fn connect_all(cfg: &RunConfig, specs: &[LaneSpec]) -> Result<Vec<Arc<Conn>>, crate::Error> {
    let opened = futures_util::future::join_all(specs.iter().map(|s| {
        let url = s.url.clone();
        async move {
            tokio::time::timeout(
                cfg.timeout.max(Duration::from_secs(5)),
                Conn::open(&url, cfg.protocol, cfg.mix, cfg.timeout),
            )
            .await
            .map_err(|_| format!("connecting to {} timed out", target::redact(&url)))?
            .map_err(|e| {
                target::sql_err(&format!("cannot connect to {}", target::redact(&url)), &e)
            })
        }
    }))
    .await;
    let mut conns = Vec::with_capacity(opened.len());
    for c in opened {
        conns.push(Arc::new(c?));
    }
    Ok(conns)
}

/// When the lanes start, when the measured window starts and when the run ends.
struct Window {
    start: Instant,
    measure_from: Instant,
    end: Instant,
    /// `measure_from` on the wall clock, for the report's timestamps.
    wall_measure_from: SystemTime,
}

impl Window {
    /// The window of a run whose connections are open.
    fn of(cfg: &RunConfig) -> Result<Window, crate::Error> {
        let start = start_instant(cfg)?;
        let measure_from = start + cfg.warmup;
        Ok(Window {
            start,
            measure_from,
            end: measure_from + cfg.duration,
            wall_measure_from: SystemTime::now() + (measure_from - Instant::now()),
        })
    }
}

/// When the lanes start: right away, or at `--start-at` (which connecting may have overrun).
fn start_instant(cfg: &RunConfig) -> Result<Instant, crate::Error> {
    let Some(at) = cfg.start_at else {
        return Ok(Instant::now() + Duration::from_millis(20));
    };
    let wait = at.duration_since(SystemTime::now()).map_err(|_| {
        format!(
            "--start-at {}: connecting took until after it; set it later",
            humantime::format_rfc3339_millis(at)
        )
    })?;
    if !cfg.quiet {
        eprintln!(
            "loadgen: connected; starting at {} (in {:.1} s)",
            humantime::format_rfc3339_millis(at),
            wait.as_secs_f64()
        );
    }
    Ok(Instant::now() + wait)
}

/// What every lane of this run shares.
fn shared(cfg: &RunConfig, keys: ShardKeys, dist: KeyDist, window: &Window) -> Shared {
    Shared {
        map: cfg.topology.map.clone(),
        keys,
        dist,
        mix: cfg.mix,
        pipeline: cfg.pipeline.max(1),
        timeout: cfg.timeout,
        batch_window: cfg.batch_window,
        protocol: cfg.protocol,
        value: workload::value_for(cfg.seed.unwrap_or(7) as i64, cfg.value_size),
        measure_from: window.measure_from,
        end: window.end,
        shard_latency: ShardLatency::new(cfg.topology.map.shards().len()),
    }
}

/// Starts a task per lane; returns their counters and the tasks.
fn spawn_lanes(
    cfg: &RunConfig,
    specs: Vec<LaneSpec>,
    conns: Vec<Arc<Conn>>,
    sh: &Arc<Shared>,
    start: Instant,
) -> Result<(Vec<LaneCounters>, Vec<JoinHandle<()>>), crate::Error> {
    let shards = sh.map.shards().len();
    let mut lane_stats = Vec::with_capacity(specs.len());
    let mut handles = Vec::with_capacity(specs.len());
    for (i, (spec, conn)) in specs.into_iter().zip(conns).enumerate() {
        let pacer = Pacer::new().map_err(|e| format!("cannot create a timer (timerfd): {e}"))?;
        let stats = Arc::new(Mutex::new(LaneStats::new(shards)));
        lane_stats.push(stats.clone());
        let rng = match cfg.seed {
            Some(s) => SmallRng::seed_from_u64(s.wrapping_mul(1_000_003).wrapping_add(i as u64)),
            None => SmallRng::from_os_rng(),
        };
        let lane = Lane {
            schedule: spec.rate.map(|(r, phase)| Schedule::new(start, r, phase)),
            spec,
            sh: sh.clone(),
            conn: Some(conn),
            rng,
            seq: 0,
            stats,
        };
        handles.push(tokio::spawn(lane.drive(pacer)));
    }
    Ok((lane_stats, handles))
}

/// What [`watch`] saw of the running lanes.
struct Watched {
    /// The measured seconds, the last one including what finished after its tick.
    series: Vec<SeriesPoint>,
    /// When the last lane finished.
    finished: Instant,
    /// loadgen's CPU time over the measured window.
    cpu: CpuTime,
}

/// Reports every second while the lanes run, and waits for them to finish.
async fn watch(
    cfg: &RunConfig,
    lane_stats: &[LaneCounters],
    handles: Vec<JoinHandle<()>>,
    window: &Window,
) -> Result<Watched, crate::Error> {
    let measure_from = window.measure_from;
    let cpu_at_start = tokio::spawn(async move {
        tokio::time::sleep_until(measure_from.into()).await;
        cpu::now()
    });
    let reporter = tokio::spawn(report_seconds(
        lane_stats.to_vec(),
        window.start,
        measure_from,
        window.end,
        window.wall_measure_from,
        cfg.total_rate(),
        if cfg.quiet { None } else { Some(cfg.threads) },
    ));
    for h in handles {
        h.await
            .map_err(|e| format!("a connection task failed: {e}"))?;
    }
    let finished = Instant::now();
    let cpu_end = cpu::now();
    let mut series = reporter
        .await
        .map_err(|e| format!("the progress reporter failed: {e}"))?;
    let cpu_start = cpu_at_start.await.unwrap_or_default();

    // Requests that finished after the last tick belong to the last second.
    let rest = collect_second(lane_stats)?;
    if let Some(last) = series.last_mut() {
        last.totals.add(&rest)?;
    }
    Ok(Watched {
        series,
        finished,
        cpu: cpu_end.since(&cpu_start),
    })
}

/// The measured window over all lanes, and each router's share of it.
fn window_totals(
    cfg: &RunConfig,
    lane_stats: &[LaneCounters],
    targets: &[usize],
    sh: &Shared,
) -> Result<(Totals, Vec<(String, Tally)>), crate::Error> {
    let mut totals = Totals::new(sh.map.shards().len());
    let mut by_router = match &cfg.topology.mode {
        Mode::Direct => Vec::new(),
        Mode::Routers(urls) => urls
            .iter()
            .map(|u| (target::redact(u), Tally::default()))
            .collect(),
    };
    for (s, &t) in lane_stats.iter().zip(targets) {
        let s = s
            .lock()
            .map_err(|_| "a connection's counters were poisoned".to_string())?;
        totals.add(&s.window)?;
        if let Some((_, tally)) = by_router.get_mut(t) {
            tally.add(&Tally::of(&s.window))?;
        }
    }
    totals.shard_hists = sh.shard_latency.take()?;
    Ok((totals, by_router))
}

/// loadgen's CPU use: `used` over `wall` for `requests` requests on up to `threads` cores.
fn cpu_use(threads: usize, used: CpuTime, wall: Duration, requests: u64) -> Cpu {
    let wall = wall.as_secs_f64().max(1e-9);
    Cpu {
        user_s: used.user.as_secs_f64(),
        sys_s: used.sys.as_secs_f64(),
        us_per_query: if requests == 0 {
            0.0
        } else {
            used.total().as_secs_f64() * 1e6 / requests as f64
        },
        cores_used: used.total().as_secs_f64() / wall,
        cores_available: threads.min(cpu::cores_available()).max(1),
    }
}

/// The run's warnings: loadgen as the bottleneck, requests never sent.
fn run_warnings(cfg: &RunConfig, cpu: &Cpu, totals: &Totals) -> Vec<String> {
    let achieved = totals.counts.ok as f64 / cfg.duration.as_secs_f64().max(1e-9);
    let mut warnings = cpu::bottleneck_warnings(
        cpu.cores_used,
        cpu.cores_available,
        achieved,
        cfg.total_rate(),
    );
    if totals.unsent > 0 {
        warnings.push(format!(
            "{} requests scheduled in the window were never sent: their connections were down when the run ended (see the errors)",
            totals.unsent
        ));
    }
    warnings
}

/// This host's part of the report.
fn this_host(
    cfg: &RunConfig,
    wall_measure_from: SystemTime,
    totals: &Totals,
    cpu: Cpu,
) -> Result<Host, crate::Error> {
    let started_unix_ms = wall_measure_from
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let name = hostname();
    Host::new(
        cfg.label.clone().unwrap_or_else(|| name.clone()),
        name,
        started_unix_ms,
        cfg.duration.as_secs_f64(),
        totals,
        cpu,
    )
}

/// Takes (and clears) every lane's current second.
fn collect_second(lanes: &[LaneCounters]) -> Result<Tally, crate::Error> {
    let mut sum = Tally::default();
    for l in lanes {
        let mut s = l
            .lock()
            .map_err(|_| "a connection's counters were poisoned".to_string())?;
        sum.add(&s.second)?;
        s.second.clear();
    }
    Ok(sum)
}

/// Once a second: collect, print the progress line (unless `threads` is None: quiet), and
/// keep the measured seconds as the time series.
async fn report_seconds(
    lanes: Vec<LaneCounters>,
    start: Instant,
    measure_from: Instant,
    end: Instant,
    wall_measure_from: SystemTime,
    target: Option<f64>,
    print_for_threads: Option<usize>,
) -> Vec<SeriesPoint> {
    let mut series = Vec::new();
    let warm = measure_from.saturating_duration_since(start).as_secs_f64();
    let mut k = (-warm).floor() as i64 + 1;
    let at = |k: i64| {
        if k >= 0 {
            measure_from + Duration::from_secs(k as u64)
        } else {
            measure_from - Duration::from_secs(k.unsigned_abs())
        }
    };
    let mut prev = start;
    let mut cpu_prev = cpu::now();
    let base_unix = wall_measure_from
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    loop {
        let tick = at(k).min(end);
        tokio::time::sleep_until(tick.into()).await;
        let second = match collect_second(&lanes) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("loadgen: {e}");
                break;
            }
        };
        let seconds = tick.saturating_duration_since(prev).as_secs_f64();
        let cpu_now = cpu::now();
        if let Some(threads) = print_for_threads {
            let share = cpu_now.since(&cpu_prev).total().as_secs_f64()
                / seconds.max(1e-9)
                / threads.min(cpu::cores_available()).max(1) as f64;
            let elapsed = if tick > measure_from {
                tick.duration_since(measure_from).as_secs_f64()
            } else {
                -(measure_from.duration_since(tick).as_secs_f64())
            };
            eprintln!(
                "{}",
                crate::progress::line(elapsed, &second, seconds, target, share)
            );
        }
        cpu_prev = cpu_now;
        if tick > measure_from {
            let t = tick.duration_since(measure_from).as_secs_f64().ceil() as u64;
            series.push(SeriesPoint {
                unix_s: base_unix + t.saturating_sub(1),
                t,
                seconds,
                totals: second,
            });
        }
        prev = tick;
        if tick >= end {
            break;
        }
        k += 1;
    }
    series
}

/// This machine's name, for reports from several hosts.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".into())
}
