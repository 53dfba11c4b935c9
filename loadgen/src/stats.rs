//! What a run counts: a latency histogram (HdrHistogram, microseconds, 3 significant digits),
//! successes, errors by SQLSTATE and timeouts, overall, per shard and per operation, and how
//! late each open-loop request left (send lag). Every connection counts on its own
//! ([`LaneStats`]) except per-shard latency ([`ShardLatency`], shared); totals are merged
//! exactly with histogram addition, never by averaging percentiles.

use std::collections::BTreeMap;
use std::sync::Mutex;

use base64::Engine;
use hdrhistogram::serialization::{Deserializer, Serializer, V2Serializer};
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use crate::workload::Op;

/// Smallest recordable latency: 1 µs.
pub const HIST_LOW_US: u64 = 1;
/// Largest recordable latency: one hour (larger values are recorded as one hour).
pub const HIST_HIGH_US: u64 = 3_600_000_000;
/// Significant decimal digits kept (values are exact to 0.1%).
pub const HIST_SIGFIG: u8 = 3;

/// Significant digits of per-shard histograms (1%): at 512 shards the 3-digit ones would
/// take 96 MB, these take 13 MB.
pub const SHARD_HIST_SIGFIG: u8 = 2;

/// An empty latency histogram.
pub fn new_hist() -> Histogram<u64> {
    Histogram::new_with_bounds(HIST_LOW_US, HIST_HIGH_US, HIST_SIGFIG)
        .expect("constant histogram bounds are valid")
}

/// An empty per-shard latency histogram.
pub fn new_shard_hist() -> Histogram<u64> {
    Histogram::new_with_bounds(HIST_LOW_US, HIST_HIGH_US, SHARD_HIST_SIGFIG)
        .expect("constant histogram bounds are valid")
}

/// A histogram in HdrHistogram's V2 format, base64: any HdrHistogram library reads it back
/// exactly.
pub fn encode(h: &Histogram<u64>) -> Result<String, crate::Error> {
    let mut buf = Vec::new();
    V2Serializer::new()
        .serialize(h, &mut buf)
        .map_err(|e| format!("cannot serialize a histogram: {e:?}"))?;
    Ok(base64::engine::general_purpose::STANDARD.encode(buf))
}

/// Reads [`encode`]'s output.
pub fn decode(text: &str) -> Result<Histogram<u64>, crate::Error> {
    decode_into(text, new_hist())
}

/// Reads [`encode`]'s output of a per-shard histogram.
pub fn decode_shard(text: &str) -> Result<Histogram<u64>, crate::Error> {
    decode_into(text, new_shard_hist())
}

fn decode_into(text: &str, mut out: Histogram<u64>) -> Result<Histogram<u64>, crate::Error> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text.trim())
        .map_err(|e| format!("a histogram is not valid base64: {e}"))?;
    let h: Histogram<u64> = Deserializer::new()
        .deserialize(&mut bytes.as_slice())
        .map_err(|e| format!("a histogram is not in HdrHistogram V2 format: {e:?}"))?;
    // Re-home it in the standard bounds so histograms from any host add up.
    out.add(&h)
        .map_err(|e| format!("a histogram does not fit loadgen's bounds: {e:?}"))?;
    Ok(out)
}

/// Successes, errors and timeouts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    pub ok: u64,
    pub errors: u64,
    pub timeouts: u64,
}

impl Counts {
    pub fn requests(&self) -> u64 {
        self.ok + self.errors + self.timeouts
    }

    pub fn add(&mut self, other: &Counts) {
        self.ok += other.ok;
        self.errors += other.errors;
        self.timeouts += other.timeouts;
    }

    fn count(&mut self, outcome: &Outcome) {
        match outcome {
            Outcome::Ok => self.ok += 1,
            Outcome::Error(_) => self.errors += 1,
            Outcome::Timeout => self.timeouts += 1,
        }
    }
}

/// How one request ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    /// Failed with this SQLSTATE (or loadgen's stand-in, see [`crate::target::error_code`]).
    Error(String),
    /// No answer within `--timeout` of its intended send time.
    Timeout,
}

/// One finished (or given up) request, as counted.
#[derive(Debug, Clone, Copy)]
pub struct Sample<'a> {
    pub shard: usize,
    pub op: Op,
    pub outcome: &'a Outcome,
    /// µs from the intended send time to the answer (used for successes only).
    pub latency_us: u64,
    /// µs from the intended send time to the moment loadgen sent it (open loop, sent
    /// requests only).
    pub lag_us: Option<u64>,
}

/// Everything counted over a period, mergeable exactly.
#[derive(Debug, Clone)]
pub struct Totals {
    /// Latency of successful requests, µs from the intended send time.
    pub hist: Histogram<u64>,
    /// Send lag of open-loop requests, µs (empty in closed loop).
    pub send_lag: Histogram<u64>,
    /// Latency per shard ([`SHARD_HIST_SIGFIG`] digits); empty when not measured (reports of
    /// older loadgens).
    pub shard_hists: Vec<Histogram<u64>>,
    pub counts: Counts,
    /// Requests scheduled in the window that were never sent (the connection was still busy
    /// when the run ended).
    pub unsent: u64,
    pub shards: Vec<Counts>,
    pub ops: [Counts; 3],
    pub errors: BTreeMap<String, u64>,
}

impl Totals {
    pub fn new(shards: usize) -> Totals {
        Totals {
            hist: new_hist(),
            send_lag: new_hist(),
            shard_hists: Vec::new(),
            counts: Counts::default(),
            unsent: 0,
            shards: vec![Counts::default(); shards],
            ops: [Counts::default(); 3],
            errors: BTreeMap::new(),
        }
    }

    /// Counts one request (not its shard's latency: see [`ShardLatency`]).
    pub fn record(&mut self, s: &Sample<'_>) {
        let Sample {
            shard, op, outcome, ..
        } = *s;
        if *outcome == Outcome::Ok {
            self.hist.saturating_record(s.latency_us.max(HIST_LOW_US));
        }
        if let Some(lag) = s.lag_us {
            self.send_lag.saturating_record(lag);
        }
        if let Outcome::Error(code) = outcome {
            match self.errors.get_mut(code.as_str()) {
                Some(n) => *n += 1,
                None => {
                    self.errors.insert(code.clone(), 1);
                }
            }
        }
        self.counts.count(outcome);
        if let Some(s) = self.shards.get_mut(shard) {
            s.count(outcome);
        }
        self.ops[op.index()].count(outcome);
    }

    /// Adds `other` (exactly: histograms are added bucket by bucket).
    pub fn add(&mut self, other: &Totals) -> Result<(), crate::Error> {
        add_hist(&mut self.hist, &other.hist)?;
        add_hist(&mut self.send_lag, &other.send_lag)?;
        for (i, h) in other.shard_hists.iter().enumerate() {
            if self.shard_hists.len() <= i {
                self.shard_hists.push(new_shard_hist());
            }
            add_hist(&mut self.shard_hists[i], h)?;
        }
        self.counts.add(&other.counts);
        self.unsent += other.unsent;
        if self.shards.len() < other.shards.len() {
            self.shards.resize(other.shards.len(), Counts::default());
        }
        for (a, b) in self.shards.iter_mut().zip(&other.shards) {
            a.add(b);
        }
        for (a, b) in self.ops.iter_mut().zip(&other.ops) {
            a.add(b);
        }
        for (code, n) in &other.errors {
            *self.errors.entry(code.clone()).or_insert(0) += n;
        }
        Ok(())
    }
}

fn add_hist(to: &mut Histogram<u64>, h: &Histogram<u64>) -> Result<(), crate::Error> {
    to.add(h)
        .map_err(|e| format!("cannot add histograms: {e:?}"))
}

/// Latency of successful requests per shard over the measured window, shared by every
/// connection of a run (through routers each connection reaches every shard, and a histogram
/// per connection and shard would not fit at 512 shards). One lock per shard, so connections
/// rarely wait for each other.
#[derive(Debug)]
pub struct ShardLatency {
    hists: Vec<Mutex<Histogram<u64>>>,
}

impl ShardLatency {
    pub fn new(shards: usize) -> ShardLatency {
        ShardLatency {
            hists: (0..shards).map(|_| Mutex::new(new_shard_hist())).collect(),
        }
    }

    pub fn record(&self, shard: usize, latency_us: u64) {
        if let Some(Ok(mut h)) = self.hists.get(shard).map(Mutex::lock) {
            h.saturating_record(latency_us.max(HIST_LOW_US));
        }
    }

    /// The histograms, one per shard.
    pub fn take(&self) -> Result<Vec<Histogram<u64>>, crate::Error> {
        self.hists
            .iter()
            .map(|m| {
                m.lock()
                    .map(|h| h.clone())
                    .map_err(|_| "a shard's latency counter was poisoned".to_string())
            })
            .collect()
    }
}

/// Successes, errors and timeouts with the latency histogram: one second of the time series,
/// or one router's or one host's share; mergeable exactly.
#[derive(Debug, Clone)]
pub struct Tally {
    pub hist: Histogram<u64>,
    pub counts: Counts,
}

impl Default for Tally {
    fn default() -> Self {
        Tally {
            hist: new_hist(),
            counts: Counts::default(),
        }
    }
}

impl Tally {
    pub fn add(&mut self, other: &Tally) -> Result<(), crate::Error> {
        add_hist(&mut self.hist, &other.hist)?;
        self.counts.add(&other.counts);
        Ok(())
    }

    /// The counts and latency of `t`.
    pub fn of(t: &Totals) -> Tally {
        Tally {
            hist: t.hist.clone(),
            counts: t.counts,
        }
    }

    /// Empties it, keeping the allocation.
    pub fn clear(&mut self) {
        self.hist.reset();
        self.counts = Counts::default();
    }
}

/// What one connection counted: its share of the measured window, and the current second
/// (which the progress reporter takes once a second).
#[derive(Debug)]
pub struct LaneStats {
    pub window: Totals,
    pub second: Tally,
}

impl LaneStats {
    pub fn new(shards: usize) -> LaneStats {
        LaneStats {
            window: Totals::new(shards),
            second: Tally::default(),
        }
    }

    /// Counts one request: always in the current second (live progress, also during
    /// warmup), and in the window totals when `measured`.
    pub fn record(&mut self, s: &Sample<'_>, measured: bool) {
        if *s.outcome == Outcome::Ok {
            self.second
                .hist
                .saturating_record(s.latency_us.max(HIST_LOW_US));
        }
        self.second.counts.count(s.outcome);
        if measured {
            self.window.record(s);
        }
    }
}

/// Min, max, mean and (population) standard deviation of some values.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Spread {
    pub min: f64,
    pub max: f64,
    pub mean: f64,
    pub stddev: f64,
}

impl Spread {
    pub fn of(values: &[f64]) -> Spread {
        if values.is_empty() {
            return Spread::default();
        }
        let n = values.len() as f64;
        let mean = values.iter().sum::<f64>() / n;
        let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
        Spread {
            min: values.iter().copied().fold(f64::INFINITY, f64::min),
            max: values.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            mean,
            stddev: var.sqrt(),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn histograms_round_trip_exactly() {
        let mut h = new_hist();
        for v in [1u64, 17, 250, 999, 1000, 1001, 123_456, 9_000_000] {
            h.record_n(v, v % 7 + 1).expect("record");
        }
        let back = decode(&encode(&h).expect("encode")).expect("decode");
        assert_eq!(back, h);
        assert_eq!(back.value_at_quantile(0.99), h.value_at_quantile(0.99));
    }

    pub fn sample(shard: usize, op: Op, outcome: &Outcome, latency_us: u64) -> Sample<'_> {
        Sample {
            shard,
            op,
            outcome,
            latency_us,
            lag_us: None,
        }
    }

    #[test]
    fn totals_add_up() {
        let mut a = Totals::new(2);
        let mut b = Totals::new(2);
        let err = Outcome::Error("57P01".into());
        a.record(&sample(0, Op::Read, &Outcome::Ok, 100));
        a.record(&sample(1, Op::Read, &err, 0));
        b.record(&sample(1, Op::Update, &Outcome::Timeout, 0));
        b.record(&Sample {
            lag_us: Some(40),
            ..sample(1, Op::Read, &err, 0)
        });
        b.shard_hists = vec![new_shard_hist(), new_shard_hist()];
        b.shard_hists[1].record(250).expect("record");
        a.add(&b).expect("add");
        assert_eq!(a.send_lag.len(), 1);
        assert_eq!(a.shard_hists.len(), 2);
        assert_eq!(a.shard_hists[1].len(), 1);
        assert_eq!(
            a.counts,
            Counts {
                ok: 1,
                errors: 2,
                timeouts: 1
            }
        );
        assert_eq!(
            a.shards[1],
            Counts {
                ok: 0,
                errors: 2,
                timeouts: 1
            }
        );
        assert_eq!(a.errors["57P01"], 2);
        assert_eq!(a.hist.len(), 1);
    }

    #[test]
    fn spread_of_values() {
        let s = Spread::of(&[2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]);
        assert_eq!((s.min, s.max, s.mean, s.stddev), (2.0, 9.0, 5.0, 2.0));
    }
}
