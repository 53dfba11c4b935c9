//! One connection's loop (a "lane"): it takes its requests from its schedule of intended send
//! times ([`Schedule`]), waits for them with its own high-resolution timer ([`Pacer`]), keeps
//! up to `--pipeline` requests in flight on its one tokio-postgres connection (which pipelines
//! them), and counts into its own [`LaneStats`].
//!
//! A request that cannot be sent on time waits for a free slot, and its latency still counts
//! from its intended time; one whose intended time is older than `--timeout` is counted as a
//! timeout without being sent, so a stalled server drains the backlog instead of building an
//! unbounded queue. A lane whose connection breaks reconnects, counting the requests that
//! fall due meanwhile as errors (`08001`) or timeouts.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::stream::{FuturesUnordered, StreamExt};
use futures_util::FutureExt;
use rand::rngs::SmallRng;
use shardmap::ShardMap;

use crate::keys::{self, KeyDist, ShardKeys};
use crate::pacer::Pacer;
use crate::plan::LaneSpec;
use crate::schedule::Schedule;
use crate::stats::{LaneStats, Outcome, Sample, ShardLatency};
use crate::target;
use crate::workload::{Conn, Mix, Op, Protocol};

/// What every lane shares.
pub(crate) struct Shared {
    pub(crate) map: ShardMap,
    pub(crate) keys: ShardKeys,
    pub(crate) dist: KeyDist,
    pub(crate) mix: Mix,
    pub(crate) pipeline: usize,
    pub(crate) timeout: Duration,
    pub(crate) batch_window: Duration,
    pub(crate) protocol: Protocol,
    pub(crate) value: String,
    pub(crate) measure_from: Instant,
    pub(crate) end: Instant,
    pub(crate) shard_latency: ShardLatency,
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

pub(crate) struct Lane {
    pub(crate) spec: LaneSpec,
    pub(crate) sh: Arc<Shared>,
    pub(crate) conn: Option<Arc<Conn>>,
    pub(crate) rng: SmallRng,
    /// Requests picked so far.
    pub(crate) seq: u64,
    pub(crate) schedule: Option<Schedule>,
    pub(crate) stats: Arc<Mutex<LaneStats>>,
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

    pub(crate) async fn drive(mut self, pacer: Pacer) {
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
