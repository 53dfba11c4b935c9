//! What a run counts: a latency histogram (HdrHistogram, microseconds, 3 significant digits),
//! successes, errors by SQLSTATE and timeouts, overall, per shard and per operation. Every
//! connection counts on its own ([`LaneStats`]); totals are merged exactly with histogram
//! addition, never by averaging percentiles.

use std::collections::BTreeMap;

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

/// An empty latency histogram.
pub fn new_hist() -> Histogram<u64> {
    Histogram::new_with_bounds(HIST_LOW_US, HIST_HIGH_US, HIST_SIGFIG)
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
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text.trim())
        .map_err(|e| format!("a histogram is not valid base64: {e}"))?;
    let h: Histogram<u64> = Deserializer::new()
        .deserialize(&mut bytes.as_slice())
        .map_err(|e| format!("a histogram is not in HdrHistogram V2 format: {e:?}"))?;
    // Re-home it in the standard bounds so histograms from any host add up.
    let mut out = new_hist();
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

/// Everything counted over a period, mergeable exactly.
#[derive(Debug, Clone)]
pub struct Totals {
    /// Latency of successful requests, µs from the intended send time.
    pub hist: Histogram<u64>,
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
            counts: Counts::default(),
            unsent: 0,
            shards: vec![Counts::default(); shards],
            ops: [Counts::default(); 3],
            errors: BTreeMap::new(),
        }
    }

    /// Counts one request; `latency_us` is used for successes only.
    pub fn record(&mut self, shard: usize, op: Op, outcome: &Outcome, latency_us: u64) {
        if *outcome == Outcome::Ok {
            self.hist.saturating_record(latency_us.max(HIST_LOW_US));
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
        self.hist
            .add(&other.hist)
            .map_err(|e| format!("cannot add histograms: {e:?}"))?;
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

/// One second of the time series, mergeable exactly.
#[derive(Debug, Clone)]
pub struct SecondTotals {
    pub hist: Histogram<u64>,
    pub counts: Counts,
}

impl Default for SecondTotals {
    fn default() -> Self {
        SecondTotals {
            hist: new_hist(),
            counts: Counts::default(),
        }
    }
}

impl SecondTotals {
    pub fn add(&mut self, other: &SecondTotals) -> Result<(), crate::Error> {
        self.hist
            .add(&other.hist)
            .map_err(|e| format!("cannot add histograms: {e:?}"))?;
        self.counts.add(&other.counts);
        Ok(())
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
    pub second: SecondTotals,
}

impl LaneStats {
    pub fn new(shards: usize) -> LaneStats {
        LaneStats {
            window: Totals::new(shards),
            second: SecondTotals::default(),
        }
    }

    /// Counts one request: always in the current second (live progress, also during
    /// warmup), and in the window totals when `measured`.
    pub fn record(
        &mut self,
        shard: usize,
        op: Op,
        outcome: &Outcome,
        latency_us: u64,
        measured: bool,
    ) {
        if *outcome == Outcome::Ok {
            self.second
                .hist
                .saturating_record(latency_us.max(HIST_LOW_US));
        }
        self.second.counts.count(outcome);
        if measured {
            self.window.record(shard, op, outcome, latency_us);
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
mod tests {
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

    #[test]
    fn totals_add_up() {
        let mut a = Totals::new(2);
        let mut b = Totals::new(2);
        a.record(0, Op::Read, &Outcome::Ok, 100);
        a.record(1, Op::Read, &Outcome::Error("57P01".into()), 0);
        b.record(1, Op::Update, &Outcome::Timeout, 0);
        b.record(1, Op::Read, &Outcome::Error("57P01".into()), 0);
        a.add(&b).expect("add");
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
