//! `loadgen run`: drives load over many connections and counts what happens.
//!
//! Each connection (a "lane") has its own schedule of intended send times ([`Schedule`]),
//! keeps up to `--pipeline` requests in flight on its one tokio-postgres connection (which
//! pipelines them), and counts into its own [`LaneStats`]. A request that cannot be sent on
//! time waits for a free slot, and its latency still counts from its intended time; one whose
//! intended time is older than `--timeout` is counted as a timeout without being sent, so a
//! stalled server drains the backlog instead of building an unbounded queue. A lane whose
//! connection breaks reconnects, counting the requests that fall due meanwhile as errors
//! (`08001`) or timeouts. A reporter task collects every lane's last second once a second.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures_util::stream::{FuturesUnordered, StreamExt};
use futures_util::FutureExt;
use rand::rngs::SmallRng;
use rand::SeedableRng;
use shardmap::ShardMap;

use crate::cpu;
use crate::keys::{self, KeyDist, ShardKeys};
use crate::report::{Cpu, Host, Parts, Report, SeriesPoint, Settings};
use crate::schedule::{self, Schedule};
use crate::stats::{LaneStats, Outcome, SecondTotals, Totals};
use crate::target::{self, Mode, Topology};
use crate::workload::{self, Conn, Mix, Op, Protocol};

/// The request rate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Rate {
    /// Closed loop: every connection sends its next request as soon as a slot is free.
    Max,
    /// Open loop, requests a second over all shards.
    Total(f64),
    /// Open loop, requests a second to each shard.
    PerShard(f64),
}

/// Everything `run` needs.
#[derive(Debug, Clone)]
pub struct RunConfig {
    pub topology: Topology,
    pub rows_per_shard: usize,
    pub connections: usize,
    pub pipeline: usize,
    pub duration: Duration,
    pub warmup: Duration,
    pub rate: Rate,
    pub mix: Mix,
    pub zipf: Option<f64>,
    pub protocol: Protocol,
    pub timeout: Duration,
    pub threads: usize,
    pub value_size: usize,
    pub quiet: bool,
    pub seed: Option<u64>,
}

impl RunConfig {
    /// The total open-loop rate, if any.
    pub fn total_rate(&self) -> Option<f64> {
        match self.rate {
            Rate::Max => None,
            Rate::Total(r) => Some(r),
            Rate::PerShard(r) => Some(r * self.topology.map.shards().len() as f64),
        }
    }

    fn settings(&self) -> Settings {
        let shards = self.topology.map.shards().len();
        Settings {
            mode: match self.topology.mode {
                Mode::Direct => "direct".into(),
                Mode::Routers(_) => "router".into(),
            },
            targets: self.topology.describe(),
            shardmap: self.topology.map_path.clone(),
            connections: self.lane_count(),
            pipeline: self.pipeline,
            protocol: self.protocol.to_string(),
            mix: self.mix.to_string(),
            keys: match self.zipf {
                None => "uniform".into(),
                Some(s) => format!("zipf {s}"),
            },
            rows_per_shard: self.rows_per_shard,
            rate: match self.rate {
                Rate::Max => "max".into(),
                Rate::Total(r) => format!("{r}/s total"),
                Rate::PerShard(r) => format!("{r}/s per shard ({}/s total)", r * shards as f64),
            },
            duration_s: self.duration.as_secs_f64(),
            warmup_s: self.warmup.as_secs_f64(),
            timeout_ms: self.timeout.as_millis() as u64,
            threads: self.threads,
        }
    }

    /// Connections actually opened: direct mode needs at least one per shard.
    pub fn lane_count(&self) -> usize {
        match self.topology.mode {
            Mode::Direct => self.connections.max(self.topology.map.shards().len()),
            Mode::Routers(_) => self.connections.max(1),
        }
    }
}

/// Which shards a lane's requests go to.
#[derive(Debug, Clone, Copy)]
enum Shards {
    /// Always this one (direct mode: the connection is to its primary).
    Fixed(usize),
    /// Every shard in turn from this offset (through routers), so each gets an equal share.
    Rotate(usize),
}

#[derive(Debug, Clone)]
struct LaneSpec {
    url: String,
    shards: Shards,
    /// Open-loop rate and phase.
    rate: Option<(f64, Duration)>,
}

fn plan_lanes(cfg: &RunConfig) -> Vec<LaneSpec> {
    let n = cfg.lane_count();
    let shards = cfg.topology.map.shards().len();
    let total = cfg.total_rate();
    match cfg.topology.mode {
        Mode::Direct => {
            let per_shard_rate = total.map(|t| t / shards as f64);
            (0..n)
                .map(|i| {
                    let shard = i % shards;
                    let j = i / shards;
                    let lanes_of_shard = n / shards + usize::from(shard < n % shards);
                    let rate = per_shard_rate.map(|r| {
                        let (lane_rate, phase) = schedule::split(r, lanes_of_shard)[j];
                        // Shards start staggered so their requests do not arrive in bursts.
                        let stagger = total.map_or(0.0, |t| shard as f64 / t);
                        (lane_rate, phase + Duration::from_secs_f64(stagger))
                    });
                    LaneSpec {
                        url: cfg.topology.url_for(i, shard).to_string(),
                        shards: Shards::Fixed(shard),
                        rate,
                    }
                })
                .collect()
        }
        Mode::Routers(_) => {
            let parts = total.map(|t| schedule::split(t, n));
            (0..n)
                .map(|i| LaneSpec {
                    url: cfg.topology.url_for(i, 0).to_string(),
                    shards: Shards::Rotate(i % shards),
                    rate: parts.as_ref().map(|p| p[i]),
                })
                .collect()
        }
    }
}

/// What every lane shares.
struct Shared {
    map: ShardMap,
    keys: ShardKeys,
    dist: KeyDist,
    mix: Mix,
    pipeline: usize,
    timeout: Duration,
    protocol: Protocol,
    value: String,
    measure_from: Instant,
    end: Instant,
}

/// A finished request.
struct Done {
    shard: usize,
    op: Op,
    intended: Instant,
    finished: Instant,
    outcome: Outcome,
}

async fn request(
    conn: Arc<Conn>,
    sh: Arc<Shared>,
    shard: usize,
    op: Op,
    id: i64,
    intended: Instant,
) -> Done {
    let deadline = intended + sh.timeout;
    let r = tokio::time::timeout_at(deadline.into(), conn.exec(op, id, &sh.value)).await;
    let outcome = match r {
        Ok(Ok(())) => Outcome::Ok,
        Ok(Err(e)) => Outcome::Error(target::error_code(&e, false)),
        Err(_) => Outcome::Timeout,
    };
    Done {
        shard,
        op,
        intended,
        finished: Instant::now(),
        outcome,
    }
}

struct Lane {
    spec: LaneSpec,
    sh: Arc<Shared>,
    conn: Option<Arc<Conn>>,
    rng: SmallRng,
    seq: usize,
    schedule: Option<Schedule>,
    stats: Arc<Mutex<LaneStats>>,
}

impl Lane {
    /// The next request's shard, operation and key.
    fn pick(&mut self) -> (usize, Op, i64) {
        let shards = self.sh.keys.shards();
        let shard = match self.spec.shards {
            Shards::Fixed(s) => s,
            Shards::Rotate(offset) => (offset + self.seq) % shards,
        };
        self.seq = self.seq.wrapping_add(1);
        let op = self.sh.mix.pick(&mut self.rng);
        let id = match op {
            Op::Insert => keys::insert_key(&self.sh.map, shard, &mut self.rng),
            Op::Read | Op::Update => {
                let n = self.sh.keys.per_shard();
                let i = self.sh.dist.index(&mut self.rng, n);
                self.sh.keys.get(shard, i)
            }
        };
        (shard, op, id)
    }

    fn record(
        &self,
        shard: usize,
        op: Op,
        outcome: &Outcome,
        intended: Instant,
        finished: Instant,
    ) {
        let latency = finished.saturating_duration_since(intended).as_micros() as u64;
        let measured = intended >= self.sh.measure_from;
        if let Ok(mut s) = self.stats.lock() {
            s.record(shard, op, outcome, latency, measured);
        }
    }

    fn record_done(&self, d: Done) {
        self.record(d.shard, d.op, &d.outcome, d.intended, d.finished);
    }

    /// Counts every open-loop request due by `now` as failed with `outcome` (the connection
    /// is down); in closed loop counts one.
    fn fail_due(&mut self, now: Instant, outcome: &Outcome) {
        match self.schedule.take() {
            Some(mut sched) => {
                while sched.peek() <= now && sched.peek() < self.sh.end {
                    let intended = sched.take();
                    let (shard, op, _) = self.pick();
                    self.record(shard, op, outcome, intended, now);
                }
                self.schedule = Some(sched);
            }
            None => {
                let (shard, op, _) = self.pick();
                self.record(shard, op, outcome, now, now);
            }
        }
    }

    /// Opens the connection again, counting what falls due meanwhile. Returns when connected
    /// or when the run is over.
    async fn reconnect(&mut self) {
        self.conn = None;
        loop {
            let now = Instant::now();
            if now >= self.sh.end {
                return;
            }
            let give_up = (now + self.sh.timeout).min(self.sh.end);
            let attempt = tokio::time::timeout_at(
                give_up.into(),
                Conn::open(&self.spec.url, self.sh.protocol, self.sh.timeout),
            )
            .await;
            let failure = match attempt {
                Ok(Ok(conn)) => {
                    self.conn = Some(Arc::new(conn));
                    return;
                }
                Ok(Err(e)) => Outcome::Error(target::error_code(&e, true)),
                Err(_) => Outcome::Timeout,
            };
            self.fail_due(Instant::now(), &failure);
            let pause = (Instant::now() + Duration::from_millis(100)).min(self.sh.end);
            tokio::time::sleep_until(pause.into()).await;
            self.fail_due(Instant::now(), &failure);
        }
    }

    async fn drive(mut self) {
        let sh = self.sh.clone();
        let mut in_flight = FuturesUnordered::new();
        let mut issuing = true;
        loop {
            while let Some(Some(done)) = in_flight.next().now_or_never() {
                self.record_done(done);
            }
            let now = Instant::now();
            let connected = self.conn.as_ref().is_some_and(|c| !c.is_closed());
            // Open loop keeps sending what was due before the end (or counts it as timed
            // out); closed loop and a lane without a connection stop at the end.
            if now >= sh.end && (self.schedule.is_none() || !connected) {
                issuing = false;
            }
            if issuing && !connected && in_flight.is_empty() {
                self.reconnect().await;
                continue;
            }
            if issuing && connected {
                while in_flight.len() < sh.pipeline {
                    let intended = match &self.schedule {
                        Some(s) => s.peek(),
                        None => now,
                    };
                    if intended > now {
                        break;
                    }
                    if intended >= sh.end {
                        issuing = false;
                        break;
                    }
                    if let Some(s) = self.schedule.as_mut() {
                        s.take();
                    }
                    let (shard, op, id) = self.pick();
                    if now >= intended + sh.timeout {
                        // Too late to be answered in time: a timeout, without sending it.
                        self.record(shard, op, &Outcome::Timeout, intended, now);
                        continue;
                    }
                    if let Some(conn) = &self.conn {
                        in_flight.push(request(conn.clone(), sh.clone(), shard, op, id, intended));
                    }
                }
            }
            if !issuing && in_flight.is_empty() {
                break;
            }
            let wake = match &self.schedule {
                Some(s) if issuing && connected && in_flight.len() < sh.pipeline => {
                    Some(s.peek().min(sh.end))
                }
                _ if issuing => Some(sh.end),
                _ => None,
            };
            tokio::select! {
                biased;
                Some(done) = in_flight.next(), if !in_flight.is_empty() => self.record_done(done),
                _ = tokio::time::sleep_until(wake.unwrap_or(now).into()), if wake.is_some() => {}
            }
        }
        if let Some(s) = &self.schedule {
            let left = s.left_before(sh.end);
            if let Ok(mut st) = self.stats.lock() {
                st.window.unsent += left;
            }
        }
    }
}

/// Runs the load and builds the report.
pub async fn run(cfg: &RunConfig) -> Result<Report, crate::Error> {
    let map = cfg.topology.map.clone();
    let shards = map.shards().len();
    if cfg.rows_per_shard == 0 && (cfg.mix.weight(Op::Read) > 0 || cfg.mix.weight(Op::Update) > 0) {
        return Err("--rows-per-shard must be at least 1 for reads and updates".into());
    }
    if let Some(r) = cfg.total_rate() {
        if !(r > 0.0 && r.is_finite()) {
            return Err(format!(
                "the rate must be above 0 requests a second, got {r}"
            ));
        }
    }
    let keys = ShardKeys::assign(&map, cfg.rows_per_shard)?;
    let dist = KeyDist::new(cfg.zipf, cfg.rows_per_shard)?;
    let specs = plan_lanes(cfg);

    // Connect everything first: a wrong URL or password fails the run before it starts.
    let opened = futures_util::future::join_all(specs.iter().map(|s| {
        let url = s.url.clone();
        async move {
            tokio::time::timeout(
                cfg.timeout.max(Duration::from_secs(5)),
                Conn::open(&url, cfg.protocol, cfg.timeout),
            )
            .await
            .map_err(|_| format!("connecting to {} timed out", target::redact(&url)))?
            .map_err(|e| format!("cannot connect to {}: {e}", target::redact(&url)))
        }
    }))
    .await;
    let mut conns = Vec::with_capacity(opened.len());
    for c in opened {
        conns.push(Arc::new(c?));
    }

    let start = Instant::now() + Duration::from_millis(20);
    let measure_from = start + cfg.warmup;
    let end = measure_from + cfg.duration;
    let wall_measure_from = SystemTime::now() + (measure_from - Instant::now());
    let sh = Arc::new(Shared {
        map: map.clone(),
        keys,
        dist,
        mix: cfg.mix,
        pipeline: cfg.pipeline.max(1),
        timeout: cfg.timeout,
        protocol: cfg.protocol,
        value: workload::value_for(cfg.seed.unwrap_or(7) as i64, cfg.value_size),
        measure_from,
        end,
    });
    let mut lane_stats = Vec::with_capacity(specs.len());
    let mut handles = Vec::with_capacity(specs.len());
    for (i, (spec, conn)) in specs.into_iter().zip(conns).enumerate() {
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
        handles.push(tokio::spawn(lane.drive()));
    }

    let cpu_at_start = tokio::spawn(async move {
        tokio::time::sleep_until(measure_from.into()).await;
        cpu::now()
    });
    let reporter = tokio::spawn(report_seconds(
        lane_stats.clone(),
        start,
        measure_from,
        end,
        wall_measure_from,
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
    let rest = collect_second(&lane_stats)?;
    if let Some(last) = series.last_mut() {
        last.totals.add(&rest)?;
    }
    let mut totals = Totals::new(shards);
    for s in &lane_stats {
        let s = s
            .lock()
            .map_err(|_| "a connection's counters were poisoned".to_string())?;
        totals.add(&s.window)?;
    }

    let used = cpu_end.since(&cpu_start);
    let wall = finished
        .saturating_duration_since(measure_from)
        .as_secs_f64()
        .max(1e-9);
    let requests = totals.counts.requests();
    let cores = cfg.threads.min(cpu::cores_available()).max(1);
    let cpu = Cpu {
        user_s: used.user.as_secs_f64(),
        sys_s: used.sys.as_secs_f64(),
        us_per_query: if requests == 0 {
            0.0
        } else {
            used.total().as_secs_f64() * 1e6 / requests as f64
        },
        cores_used: used.total().as_secs_f64() / wall,
        cores_available: cores,
    };
    let duration_s = cfg.duration.as_secs_f64();
    let achieved = totals.counts.ok as f64 / duration_s.max(1e-9);
    let mut warnings = cpu::bottleneck_warnings(cpu.cores_used, cores, achieved, cfg.total_rate());
    if totals.unsent > 0 {
        warnings.push(format!(
            "{} requests scheduled in the window were never sent: the connections were busy; the target is slower than the rate asked for, or raise --connections / --pipeline",
            totals.unsent
        ));
    }
    let started_unix_ms = wall_measure_from
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let host = Host {
        name: hostname(),
        started_unix_ms,
        duration_s,
        requests,
        ok: totals.counts.ok,
        qps: achieved,
        cpu,
    };
    Report::build(Parts {
        settings: cfg.settings(),
        hosts: vec![host],
        ranges: map.shards().iter().map(|s| s.range.to_string()).collect(),
        duration_s,
        target_qps: cfg.total_rate(),
        totals: &totals,
        series: &series,
        cpu,
        warnings,
    })
}

/// Takes (and clears) every lane's current second.
fn collect_second(lanes: &[Arc<Mutex<LaneStats>>]) -> Result<SecondTotals, crate::Error> {
    let mut sum = SecondTotals::default();
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
    lanes: Vec<Arc<Mutex<LaneStats>>>,
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
