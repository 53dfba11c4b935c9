//! `loadgen run`: drives load over many connections and counts what happens.
//!
//! Each connection (a "lane") has its own schedule of intended send times ([`Schedule`]),
//! waits for them with its own high-resolution timer ([`Pacer`]), keeps up to `--pipeline`
//! requests in flight on its one tokio-postgres connection (which pipelines them), and counts
//! into its own [`LaneStats`]. Through routers, the lanes' requests interleave into one schedule
//! for the whole run whose every block of N consecutive requests visits each of the N shards
//! once ([`Shards::Interleaved`]), so every shard gets its rate exactly. A request that cannot
//! be sent on time waits for a free slot, and its latency still counts from its intended time; one whose
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
use crate::pacer::Pacer;
use crate::report::{Cpu, Host, Parts, Report, SeriesPoint, Settings};
use crate::schedule::{self, Schedule};
use crate::stats::{LaneStats, Outcome, Sample, ShardLatency, Tally, Totals};
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
    /// Open loop: requests due within this much of a wake-up are sent with it (see
    /// `--batch-window`).
    pub batch_window: Duration,
    pub threads: usize,
    pub value_size: usize,
    pub quiet: bool,
    pub seed: Option<u64>,
    /// When the load starts (wall clock), so several hosts start together; `None`: now.
    pub start_at: Option<SystemTime>,
    /// This host's name in reports (default: its hostname).
    pub label: Option<String>,
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
            start_at: self
                .start_at
                .map(|t| humantime::format_rfc3339_millis(t).to_string()),
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
    /// Through routers: lane `lane` of `lanes` sends requests `lane, lane + lanes, ...` of the
    /// run's single interleaved schedule, and request `k` goes to shard [`block_shard`]`(k)`:
    /// every block of `shards` consecutive requests visits every shard once, so over any
    /// window every shard's count is within two of every other's, and each lane still reaches
    /// every shard over time (a plain `k mod shards` would pin a lane to `shards / gcd` of them).
    Interleaved { lane: u64, lanes: u64 },
}

impl Shards {
    /// The shard of the lane's `seq`-th request, of `shards`.
    fn of(self, seq: u64, shards: usize) -> usize {
        match self {
            Shards::Fixed(s) => s,
            Shards::Interleaved { lane, lanes } => {
                block_shard(lane.wrapping_add(seq.wrapping_mul(lanes)), shards)
            }
        }
    }
}

/// The shard of the run's `k`-th request: block `k / shards` is the shards in order, rotated by
/// an offset that a hash of the block number picks.
fn block_shard(k: u64, shards: usize) -> usize {
    let n = shards.max(1) as u64;
    let offset = splitmix64(k / n) % n;
    ((k % n + offset) % n) as usize
}

/// SplitMix64's finaliser: a well-mixed 64-bit value from a counter.
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[derive(Debug, Clone)]
struct LaneSpec {
    url: String,
    /// Index of the router (`--target`) it goes to; in direct mode, of its shard.
    target: usize,
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
                        target: shard,
                        shards: Shards::Fixed(shard),
                        rate,
                    }
                })
                .collect()
        }
        Mode::Routers(ref targets) => {
            let parts = total.map(|t| schedule::split(t, n));
            (0..n)
                .map(|i| LaneSpec {
                    url: cfg.topology.url_for(i, 0).to_string(),
                    target: i % targets.len().max(1),
                    shards: Shards::Interleaved {
                        lane: i as u64,
                        lanes: n as u64,
                    },
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
    batch_window: Duration,
    protocol: Protocol,
    value: String,
    measure_from: Instant,
    end: Instant,
    shard_latency: ShardLatency,
}

/// A finished request.
struct Done {
    shard: usize,
    op: Op,
    intended: Instant,
    /// When it was handed to the connection.
    sent: Instant,
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
    let sent = Instant::now();
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
        sent,
        finished: Instant::now(),
        outcome,
    }
}

struct Lane {
    spec: LaneSpec,
    sh: Arc<Shared>,
    conn: Option<Arc<Conn>>,
    rng: SmallRng,
    /// Requests picked so far.
    seq: u64,
    schedule: Option<Schedule>,
    stats: Arc<Mutex<LaneStats>>,
}

impl Lane {
    /// The next request's shard, operation and key.
    fn pick(&mut self) -> (usize, Op, i64) {
        let shard = self.spec.shards.of(self.seq, self.sh.keys.shards());
        self.seq += 1;
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

    /// Counts a request; `sent` is when it left (`None`: never sent).
    fn record(
        &self,
        shard: usize,
        op: Op,
        outcome: &Outcome,
        intended: Instant,
        sent: Option<Instant>,
        finished: Instant,
    ) {
        let micros = |d: Duration| d.as_micros().min(u64::MAX as u128) as u64;
        // A request sent early (within the batch window) is timed from when it left: its
        // latency is never flattered by the head start.
        let from = sent.map_or(intended, |t| t.min(intended));
        let latency_us = micros(finished.saturating_duration_since(from));
        let measured = intended >= self.sh.measure_from;
        // In closed loop a request is "intended" when it is sent: no lag to speak of.
        let lag_us = sent
            .filter(|_| self.schedule.is_some())
            .map(|t| micros(t.saturating_duration_since(intended)));
        let sample = Sample {
            shard,
            op,
            outcome,
            latency_us,
            lag_us,
        };
        if let Ok(mut s) = self.stats.lock() {
            s.record(&sample, measured);
        }
        if measured && *outcome == Outcome::Ok {
            self.sh.shard_latency.record(shard, latency_us);
        }
    }

    fn record_done(&self, d: Done) {
        self.record(
            d.shard,
            d.op,
            &d.outcome,
            d.intended,
            Some(d.sent),
            d.finished,
        );
    }

    /// Counts every open-loop request due by `now` as failed with `outcome` (the connection
    /// is down); in closed loop counts one.
    fn fail_due(&mut self, now: Instant, outcome: &Outcome) {
        match self.schedule.take() {
            Some(mut sched) => {
                while sched.peek() <= now && sched.peek() < self.sh.end {
                    let intended = sched.take();
                    let (shard, op, _) = self.pick();
                    self.record(shard, op, outcome, intended, None, now);
                }
                self.schedule = Some(sched);
            }
            None => {
                let (shard, op, _) = self.pick();
                self.record(shard, op, outcome, now, None, now);
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
                Conn::open(
                    &self.spec.url,
                    self.sh.protocol,
                    self.sh.mix,
                    self.sh.timeout,
                ),
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

    async fn drive(mut self, pacer: Pacer) {
        let sh = self.sh.clone();
        let mut in_flight = FuturesUnordered::new();
        let mut issuing = true;
        loop {
            // Every turn spends from tokio's cooperative budget, so a lane whose waits all
            // complete at once still yields to the connection tasks it waits for.
            tokio::task::consume_budget().await;
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
                    // The end first: past it, a request due after the end must stop the
                    // lane, not leave it waking for a time that is already gone.
                    if intended >= sh.end {
                        issuing = false;
                        break;
                    }
                    if intended > now + sh.batch_window {
                        break;
                    }
                    if let Some(s) = self.schedule.as_mut() {
                        s.take();
                    }
                    let (shard, op, id) = self.pick();
                    if now >= intended + sh.timeout {
                        // Too late to be answered in time: a timeout, without sending it.
                        self.record(shard, op, &Outcome::Timeout, intended, None, now);
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
            // When to look again without an answer: the next intended time if a slot is free
            // (precisely, on the pacer), else the end of the run (closed loop stops issuing
            // then; tokio's millisecond timer is good enough for that); past the end, only
            // answers matter.
            let wake = match &self.schedule {
                Some(s) if issuing && connected && in_flight.len() < sh.pipeline => {
                    Some(Wake::Send(s.peek()))
                }
                _ if issuing && now < sh.end => Some(Wake::End),
                _ => None,
            };
            tokio::select! {
                biased;
                Some(done) = in_flight.next(), if !in_flight.is_empty() => self.record_done(done),
                _ = wait(&pacer, wake, sh.end), if wake.is_some() => {}
                else => tokio::task::yield_now().await,
            }
        }
        if let Some(s) = &self.schedule {
            let left = s.left_between(sh.measure_from, sh.end);
            if let Ok(mut st) = self.stats.lock() {
                st.window.unsent += left;
            }
        }
    }
}

/// What a lane waits for when no answer comes first.
#[derive(Debug, Clone, Copy)]
enum Wake {
    /// The intended time of its next request.
    Send(Instant),
    /// The end of the run.
    End,
}

/// Waits for `wake`: a send time on the lane's precise timer (tokio's, should the timerfd
/// fail), the end on tokio's.
async fn wait(pacer: &Pacer, wake: Option<Wake>, end: Instant) {
    let precise = match wake {
        Some(Wake::Send(t)) => t,
        Some(Wake::End) => return tokio::time::sleep_until(end.into()).await,
        None => return,
    };
    if pacer.sleep_until(precise).await.is_err() {
        tokio::time::sleep_until(precise.into()).await;
    }
}

/// How far ahead `--start-at` may be: hosts are started for one run, not scheduled for next
/// week (and a Unix time in milliseconds is a mistake, not a date 50,000 years away).
const MAX_START_AHEAD: Duration = Duration::from_secs(24 * 3600);

/// Runs the load and builds the report.
pub async fn run(cfg: &RunConfig) -> Result<Report, crate::Error> {
    let map = cfg.topology.map.clone();
    let shards = map.shards().len();
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
    if let Some(at) = cfg.start_at {
        let shown = humantime::format_rfc3339_millis(at);
        match at.duration_since(SystemTime::now()) {
            Err(_) => return Err(format!("--start-at {shown} has already passed")),
            Ok(ahead) if ahead > MAX_START_AHEAD => {
                return Err(format!(
                    "--start-at {shown} is {:.1} days from now; give a time within a day (Unix time in seconds, not milliseconds)",
                    ahead.as_secs_f64() / 86_400.0
                ))
            }
            Ok(_) => {}
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

    let start = match cfg.start_at {
        None => Instant::now() + Duration::from_millis(20),
        Some(at) => {
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
            Instant::now() + wait
        }
    };
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
        batch_window: cfg.batch_window,
        protocol: cfg.protocol,
        value: workload::value_for(cfg.seed.unwrap_or(7) as i64, cfg.value_size),
        measure_from,
        end,
        shard_latency: ShardLatency::new(shards),
    });
    let targets: Vec<usize> = specs.iter().map(|s| s.target).collect();
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
    let mut by_router = match &cfg.topology.mode {
        Mode::Direct => Vec::new(),
        Mode::Routers(urls) => urls
            .iter()
            .map(|u| (target::redact(u), Tally::default()))
            .collect(),
    };
    for (s, &t) in lane_stats.iter().zip(&targets) {
        let s = s
            .lock()
            .map_err(|_| "a connection's counters were poisoned".to_string())?;
        totals.add(&s.window)?;
        if let Some((_, tally)) = by_router.get_mut(t) {
            tally.add(&Tally::of(&s.window))?;
        }
    }
    totals.shard_hists = sh.shard_latency.take()?;

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
            "{} requests scheduled in the window were never sent: their connections were down when the run ended (see the errors)",
            totals.unsent
        ));
    }
    let started_unix_ms = wall_measure_from
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let name = hostname();
    let host = Host::new(
        cfg.label.clone().unwrap_or_else(|| name.clone()),
        name,
        started_unix_ms,
        duration_s,
        &totals,
        cpu,
    )?;
    Report::build(Parts {
        settings: cfg.settings(),
        hosts: vec![host],
        routers: by_router,
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
fn collect_second(lanes: &[Arc<Mutex<LaneStats>>]) -> Result<Tally, crate::Error> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use shardmap::{KeyType, Table};

    fn config(shards: usize, targets: usize, connections: usize, rate: Rate) -> RunConfig {
        let urls: Vec<String> = (0..shards)
            .map(|i| format!("postgres://u@10.0.0.1:5432/shard_{i}"))
            .collect();
        let map = ShardMap::even_split(&urls, vec![Table::new("kv", "id", KeyType::BigInt)])
            .expect("map");
        let mode = if targets == 0 {
            Mode::Direct
        } else {
            Mode::Routers(
                (0..targets)
                    .map(|i| format!("postgres://u@10.0.1.{i}:6432/app"))
                    .collect(),
            )
        };
        RunConfig {
            topology: Topology {
                map,
                map_path: None,
                mode,
            },
            rows_per_shard: 10,
            connections,
            pipeline: 1,
            duration: Duration::from_secs(10),
            warmup: Duration::from_millis(1300),
            rate,
            mix: Mix::default(),
            zipf: None,
            protocol: Protocol::Prepared,
            timeout: Duration::from_secs(1),
            batch_window: Duration::ZERO,
            threads: 1,
            value_size: 8,
            quiet: true,
            seed: None,
            start_at: None,
            label: None,
        }
    }

    /// Requests per shard whose intended time falls in the measured window, as `run` counts
    /// them.
    fn per_shard_in_window(cfg: &RunConfig) -> Vec<u64> {
        let shards = cfg.topology.map.shards().len();
        let start = Instant::now();
        let (from, end) = (start + cfg.warmup, start + cfg.warmup + cfg.duration);
        let mut counts = vec![0u64; shards];
        for spec in plan_lanes(cfg) {
            let Some((rate, phase)) = spec.rate else {
                continue;
            };
            let mut sched = Schedule::new(start, rate, phase);
            let mut seq = 0;
            while sched.peek() < end {
                let at = sched.take();
                let shard = spec.shards.of(seq, shards);
                seq += 1;
                if at >= from {
                    counts[shard] += 1;
                }
            }
        }
        counts
    }

    #[test]
    fn every_shard_gets_its_rate_within_half_a_percent() {
        // The case (512 shards, 20/s each through a router) and awkward ratios of
        // connections to shards and routers.
        for (shards, targets, conns) in [
            (512, 1, 8),
            (512, 3, 64),
            (64, 3, 48),
            (7, 2, 12),
            (4, 1, 8),
            (5, 0, 12),
        ] {
            let cfg = config(shards, targets, conns, Rate::PerShard(20.0));
            let counts = per_shard_in_window(&cfg);
            let want = 20.0 * cfg.duration.as_secs_f64();
            // Within two of each other (a partial block at each end of the window).
            let (lo, hi) = (
                counts.iter().min().copied().unwrap_or(0),
                counts.iter().max().copied().unwrap_or(0),
            );
            assert!(hi - lo <= 2, "{shards} shards: {lo}..{hi}");
            for (i, &n) in counts.iter().enumerate() {
                assert!(
                    (n as f64 - want).abs() <= want * 0.005,
                    "{shards} shards, {targets} routers, {conns} connections: shard {i} got {n} of {want}"
                );
            }
        }
    }

    #[test]
    fn every_lane_reaches_every_shard() {
        // 64 connections over 512 shards: k mod 512 would give each only 8 shards.
        let cfg = config(512, 1, 64, Rate::PerShard(20.0));
        for spec in plan_lanes(&cfg).iter().take(4) {
            let mut seen = vec![false; 512];
            for seq in 0..20_000 {
                seen[spec.shards.of(seq, 512)] = true;
            }
            let reached = seen.iter().filter(|s| **s).count();
            assert!(reached > 500, "a lane reached only {reached} of 512 shards");
        }
    }

    #[test]
    fn lanes_spread_over_routers() {
        let cfg = config(16, 3, 7, Rate::Total(700.0));
        let lanes = plan_lanes(&cfg);
        let per_router: Vec<usize> = (0..3)
            .map(|t| lanes.iter().filter(|l| l.target == t).count())
            .collect();
        assert_eq!(per_router, [3, 2, 2]);
        assert!(lanes
            .iter()
            .all(|l| l.url.ends_with(&format!("10.0.1.{}:6432/app", l.target))));
    }
}
