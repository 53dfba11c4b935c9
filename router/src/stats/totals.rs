//! The router's totals since it started, folded from the workers' logs: requests and errors by
//! route kind and by shard, latency and checkout-wait histograms with Prometheus's fixed
//! buckets, errors by SQLSTATE class, client bytes; and per shard an HdrHistogram of the last
//! minute (six ten-second slots) for the p50/p99 of `SHOW STATS`.
//!
//! Pure data: folding and reading are plain functions of their inputs, tested without threads.

use std::collections::BTreeMap;
use std::time::Duration;

use hdrhistogram::Histogram;

use super::local::Log;
use super::{RouteKind, NO_SHARD};

/// Upper bounds of the latency buckets, in seconds (the last bucket is +Inf).
pub const BUCKETS: [f64; 16] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
];

/// A Prometheus histogram: counts per bucket, their number and sum.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Buckets {
    /// Observations per bucket of [`BUCKETS`] (not cumulative; above the last: `count` minus
    /// their sum).
    counts: [u64; BUCKETS.len()],
    pub count: u64,
    /// Seconds.
    pub sum: f64,
}

impl Buckets {
    pub fn observe(&mut self, d: Duration) {
        let secs = d.as_secs_f64();
        if let Some(i) = BUCKETS.iter().position(|&le| secs <= le) {
            self.counts[i] += 1;
        }
        self.count += 1;
        self.sum += secs;
    }

    /// `(upper bound, observations in that bucket)` for each bucket, the last bounded by
    /// `f64::MAX` (+Inf), as `prometheus-client` encodes them (it sums them up itself).
    pub fn per_bucket(&self) -> Vec<(f64, u64)> {
        let below: u64 = self.counts.iter().sum();
        BUCKETS
            .iter()
            .copied()
            .zip(self.counts)
            .chain([(f64::MAX, self.count - below)])
            .collect()
    }
}

/// Requests ending with ReadyForQuery, by outcome, and how long they took.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Requests {
    pub ok: u64,
    pub failed: u64,
    pub latency: Buckets,
}

impl Requests {
    fn add(&mut self, failed: bool, elapsed: Duration) {
        if failed {
            self.failed += 1;
        } else {
            self.ok += 1;
        }
        self.latency.observe(elapsed);
    }
}

/// Seconds per slot of the last-minute histograms, and how many slots make the minute.
const SLOT_SECS: u64 = 10;
const SLOTS: usize = 6;
/// The last-minute histograms' range and precision: 1 µs to 60 s, two significant digits.
const HIGHEST_MICROS: u64 = 60_000_000;

/// The latencies of the last minute, in slots of ten seconds (allocated when first used).
#[derive(Clone, Debug, Default)]
pub struct Window {
    slots: Vec<(u64, Histogram<u32>)>,
}

impl Window {
    fn record(&mut self, now_secs: u64, micros: u64) {
        let epoch = now_secs / SLOT_SECS;
        let i = (epoch % SLOTS as u64) as usize;
        if self.slots.is_empty() {
            let Ok(empty) = Histogram::new_with_bounds(1, HIGHEST_MICROS, 2) else {
                return;
            };
            self.slots = vec![(u64::MAX, empty); SLOTS];
        }
        let (slot_epoch, h) = &mut self.slots[i];
        if *slot_epoch != epoch {
            h.reset();
            *slot_epoch = epoch;
        }
        h.saturating_record(micros.clamp(1, HIGHEST_MICROS));
    }

    /// The slots of the minute up to `now_secs`, merged; `None` when nothing was recorded.
    pub fn last_minute(&self, now_secs: u64) -> Option<Histogram<u32>> {
        let epoch = now_secs / SLOT_SECS;
        let mut merged: Option<Histogram<u32>> = None;
        for (slot_epoch, h) in &self.slots {
            if *slot_epoch > epoch || epoch - slot_epoch >= SLOTS as u64 || h.is_empty() {
                continue;
            }
            match &mut merged {
                Some(m) => {
                    // Same bounds and precision by construction: adding cannot fail.
                    let _ = m.add(h);
                }
                None => merged = Some(h.clone()),
            }
        }
        merged
    }
}

/// One shard's single-shard requests.
#[derive(Clone, Debug, Default)]
pub struct Shard {
    pub requests: Requests,
    /// Checkout waits of the requests that took a connection from the pool.
    pub wait: Buckets,
    pub window: Window,
}

#[derive(Clone, Debug, Default)]
pub struct Totals {
    /// By stats id ([`super::Stats::shard_id`]).
    pub shards: Vec<Shard>,
    pub kinds: [Requests; RouteKind::ALL.len()],
    /// Errors sent to clients by SQLSTATE class.
    pub errors: BTreeMap<[u8; 2], u64>,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub dropped: u64,
}

impl Totals {
    /// Adds a worker's log at `now_secs` (seconds since the epoch) and empties it.
    pub fn fold(&mut self, log: &mut Log, now_secs: u64) {
        for r in &log.requests {
            self.bytes_in += r.bytes_in;
            self.bytes_out += r.bytes_out;
            self.kinds[r.kind as usize].add(r.failed, r.elapsed);
            if r.shard == NO_SHARD {
                continue;
            }
            let id = r.shard as usize;
            if self.shards.len() <= id {
                self.shards.resize_with(id + 1, Shard::default);
            }
            let shard = &mut self.shards[id];
            shard.requests.add(r.failed, r.elapsed);
            if let Some(waited) = r.waited {
                shard.wait.observe(waited);
            }
            let micros = u64::try_from(r.elapsed.as_micros()).unwrap_or(u64::MAX);
            shard.window.record(now_secs, micros);
        }
        for class in &log.errors {
            *self.errors.entry(*class).or_default() += 1;
        }
        self.bytes_in += log.bytes_in;
        self.bytes_out += log.bytes_out;
        self.dropped += log.dropped;
        log.clear();
    }

    /// The shard with stats id `id` (empty when it has served nothing).
    pub fn shard(&self, id: u32) -> Shard {
        self.shards.get(id as usize).cloned().unwrap_or_default()
    }

    /// Counters and histograms without the last-minute windows (what a scrape renders).
    pub fn without_windows(&self) -> Totals {
        Totals {
            shards: self
                .shards
                .iter()
                .map(|s| Shard {
                    requests: s.requests.clone(),
                    wait: s.wait.clone(),
                    window: Window::default(),
                })
                .collect(),
            kinds: self.kinds.clone(),
            errors: self.errors.clone(),
            bytes_in: self.bytes_in,
            bytes_out: self.bytes_out,
            dropped: self.dropped,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::meter::Request;
    use std::time::Instant;

    fn request(kind: RouteKind, shard: u32, failed: bool, ms: u64) -> Request {
        Request {
            started: Instant::now(),
            kind,
            shard,
            failed,
            waited: (shard != NO_SHARD).then(|| Duration::from_micros(50)),
            elapsed: Duration::from_millis(ms),
            bytes_in: 1,
            bytes_out: 2,
        }
    }

    #[test]
    fn folds_requests_by_kind_and_shard() {
        let mut log = Log::default();
        log.requests
            .push(request(RouteKind::SingleShard, 2, false, 1));
        log.requests
            .push(request(RouteKind::SingleShard, 2, true, 3));
        log.requests
            .push(request(RouteKind::Scatter, NO_SHARD, false, 20));
        log.errors.push(*b"23");
        log.bytes_in = 10;
        let mut t = Totals::default();
        t.fold(&mut log, 1_000);
        assert!(log.requests.is_empty() && log.bytes_in == 0);
        let single = &t.kinds[RouteKind::SingleShard as usize];
        assert_eq!((single.ok, single.failed), (1, 1));
        assert_eq!(t.kinds[RouteKind::Scatter as usize].ok, 1);
        let shard = t.shard(2);
        assert_eq!((shard.requests.ok, shard.requests.failed), (1, 1));
        assert_eq!(shard.wait.count, 2);
        assert_eq!(t.shard(0).requests.ok, 0);
        assert_eq!(t.errors.get(b"23"), Some(&1));
        assert_eq!((t.bytes_in, t.bytes_out), (13, 6));
        // 1 ms falls in the 1 ms bucket, 3 ms in the 5 ms one, none above 10 s.
        let buckets = shard.requests.latency.per_bucket();
        let at = |le: f64| buckets.iter().find(|(b, _)| *b == le).map(|(_, n)| *n);
        assert_eq!(
            (at(0.0005), at(0.001), at(0.005)),
            (Some(0), Some(1), Some(1))
        );
        assert_eq!(buckets.last(), Some(&(f64::MAX, 0)));
    }

    #[test]
    fn the_window_keeps_one_minute() {
        let mut w = Window::default();
        for ms in 1..=100 {
            w.record(1_000, ms * 1_000);
        }
        let h = w.last_minute(1_005).expect("recorded");
        assert_eq!(h.len(), 100);
        let p99 = h.value_at_quantile(0.99);
        assert!((98_000..=100_000).contains(&p99), "{p99}");
        w.record(1_030, 5);
        assert_eq!(w.last_minute(1_035).map(|h| h.len()), Some(101));
        // A minute later only the newer slot counts; later still, nothing.
        assert_eq!(w.last_minute(1_065).map(|h| h.len()), Some(1));
        assert!(w.last_minute(2_000).is_none());
    }
}
