//! The report of a run (or of several merged): the JSON form (`--json`, everything including
//! the full histograms and a per-second series, so reports merge exactly) and the human table
//! printed on stdout.

use std::collections::BTreeMap;
use std::path::Path;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use crate::stats::{self, Counts, Spread, Tally, Totals};
use crate::workload::Op;

/// Bumped when the JSON changes. Format 2 added send lag, per-shard latency, per-router and
/// per-host breakdowns; format 1 reports still read (those parts are then missing).
pub const FORMAT: u32 = 2;

/// The oldest format this loadgen reads.
pub const OLDEST_FORMAT: u32 = 1;

/// How the run was set up.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Settings {
    /// `router` (through `--target`s) or `direct` (to every shard's primary).
    pub mode: String,
    /// The targets (passwords hidden), or "direct to N shard primaries".
    pub targets: String,
    pub shardmap: Option<String>,
    pub connections: usize,
    pub pipeline: usize,
    pub protocol: String,
    pub mix: String,
    /// `uniform` or `zipf S`.
    pub keys: String,
    pub rows_per_shard: usize,
    /// `max` (closed loop), or the open-loop rate asked for.
    pub rate: String,
    pub duration_s: f64,
    pub warmup_s: f64,
    pub timeout_ms: u64,
    pub threads: usize,
    /// `--start-at` (RFC 3339), when given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_at: Option<String>,
}

/// One loadgen process that contributed to the report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Host {
    /// `--label` (default: the hostname).
    #[serde(default)]
    pub label: String,
    /// The hostname.
    pub name: String,
    /// When its measured window started (Unix time, ms).
    pub started_unix_ms: u64,
    pub duration_s: f64,
    pub requests: u64,
    pub ok: u64,
    #[serde(default)]
    pub errors: u64,
    #[serde(default)]
    pub timeouts: u64,
    pub qps: f64,
    #[serde(default)]
    pub latency_us: Latency,
    /// Its latency histogram (HdrHistogram V2, base64); empty in format 1.
    #[serde(default)]
    pub histogram: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub send_lag_us: Option<Latency>,
    pub cpu: Cpu,
}

impl Host {
    /// This host's part of a run.
    pub fn new(
        label: String,
        name: String,
        started_unix_ms: u64,
        duration_s: f64,
        t: &Totals,
        cpu: Cpu,
    ) -> Result<Host, crate::Error> {
        Ok(Host {
            label,
            name,
            started_unix_ms,
            duration_s,
            requests: t.counts.requests(),
            ok: t.counts.ok,
            errors: t.counts.errors,
            timeouts: t.counts.timeouts,
            qps: t.counts.ok as f64 / duration_s.max(1e-9),
            latency_us: Latency::of(&t.hist),
            histogram: stats::encode(&t.hist)?,
            send_lag_us: (!t.send_lag.is_empty()).then(|| Latency::of(&t.send_lag)),
            cpu,
        })
    }

    /// The label, or the hostname for reports that have none.
    pub fn label(&self) -> &str {
        if self.label.is_empty() {
            &self.name
        } else {
            &self.label
        }
    }
}

/// Client CPU use over the measured window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Cpu {
    pub user_s: f64,
    pub sys_s: f64,
    /// (user + sys) / requests, in µs.
    pub us_per_query: f64,
    /// CPU seconds per wall second.
    pub cores_used: f64,
    /// Cores loadgen could use (its worker threads, at most the machine's cores).
    pub cores_available: usize,
}

/// Latency of successful requests in µs, from the intended send time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Latency {
    pub count: u64,
    pub min: u64,
    pub mean: f64,
    pub p50: u64,
    pub p90: u64,
    #[serde(default)]
    pub p95: u64,
    pub p99: u64,
    pub p999: u64,
    pub max: u64,
}

impl Latency {
    pub fn of(h: &Histogram<u64>) -> Latency {
        if h.is_empty() {
            return Latency::default();
        }
        Latency {
            count: h.len(),
            min: h.min(),
            mean: h.mean(),
            p50: h.value_at_quantile(0.50),
            p90: h.value_at_quantile(0.90),
            p95: h.value_at_quantile(0.95),
            p99: h.value_at_quantile(0.99),
            p999: h.value_at_quantile(0.999),
            max: h.max(),
        }
    }
}

/// One shard's share.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShardReport {
    pub index: usize,
    pub range: String,
    pub requests: u64,
    #[serde(flatten)]
    pub counts: Counts,
    /// Successful requests a second.
    pub qps: f64,
    /// Latency of its successful requests (1% precision); none in format 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_us: Option<Latency>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub histogram: Option<String>,
}

/// One router's share (through `--target`s).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RouterReport {
    /// The `--target` URL, password hidden.
    pub target: String,
    pub requests: u64,
    #[serde(flatten)]
    pub counts: Counts,
    pub qps: f64,
    pub latency_us: Latency,
    pub histogram: String,
}

/// One second of the measured window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SecondReport {
    /// Wall-clock second (Unix time) this second started at; merge aligns hosts on it.
    pub unix_s: u64,
    /// Seconds since the window started, at the end of this second.
    pub t: u64,
    /// Length (1 except perhaps the last).
    pub seconds: f64,
    #[serde(flatten)]
    pub counts: Counts,
    pub qps: f64,
    pub p50_us: u64,
    pub p99_us: u64,
    #[serde(default)]
    pub p999_us: u64,
    pub max_us: u64,
    /// This second's latency histogram (HdrHistogram V2, base64).
    pub histogram: String,
}

/// A full report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub format: u32,
    pub loadgen_version: String,
    pub settings: Settings,
    pub hosts: Vec<Host>,
    /// Length of the measured window (warmup excluded).
    pub duration_s: f64,
    /// The open-loop rate asked for (all hosts together); none for closed loop.
    pub target_qps: Option<f64>,
    /// Successful requests a second.
    pub qps: f64,
    pub requests: u64,
    #[serde(flatten)]
    pub counts: Counts,
    /// Scheduled in the window but never sent (connections still busy at the end).
    pub unsent: u64,
    pub errors_per_s: f64,
    pub errors_per_million: f64,
    pub timeouts_per_million: f64,
    pub errors_by_sqlstate: BTreeMap<String, u64>,
    pub ops: BTreeMap<String, Counts>,
    /// Spread of the per-shard QPS.
    pub shard_qps: Spread,
    pub shards: Vec<ShardReport>,
    /// Per router (through `--target`s; empty straight to the shards).
    #[serde(default)]
    pub routers: Vec<RouterReport>,
    pub latency_us: Latency,
    /// The whole window's latency histogram (HdrHistogram V2, base64, µs).
    pub histogram: String,
    /// Open loop: how late requests left, µs after their intended time (none in closed loop).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub send_lag_us: Option<Latency>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub send_lag_histogram: Option<String>,
    pub cpu: Cpu,
    pub series: Vec<SecondReport>,
    pub warnings: Vec<String>,
}

/// One second of raw series data.
#[derive(Debug, Clone)]
pub struct SeriesPoint {
    pub unix_s: u64,
    pub t: u64,
    pub seconds: f64,
    pub totals: Tally,
}

/// A report's raw data, for merging.
pub struct Raw {
    pub totals: Totals,
    pub series: Vec<SeriesPoint>,
    pub routers: Vec<(String, Tally)>,
}

/// Everything a report is computed from.
pub struct Parts<'a> {
    pub settings: Settings,
    pub hosts: Vec<Host>,
    /// Per router (target, counts and latency).
    pub routers: Vec<(String, Tally)>,
    pub ranges: Vec<String>,
    pub duration_s: f64,
    pub target_qps: Option<f64>,
    pub totals: &'a Totals,
    pub series: &'a [SeriesPoint],
    pub cpu: Cpu,
    pub warnings: Vec<String>,
}

impl Report {
    /// Computes the report's figures from raw counts and histograms.
    pub fn build(p: Parts<'_>) -> Result<Report, crate::Error> {
        let d = p.duration_s.max(1e-9);
        let t = p.totals;
        let shards: Vec<ShardReport> = t
            .shards
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let hist = t.shard_hists.get(i);
                Ok(ShardReport {
                    index: i,
                    range: p.ranges.get(i).cloned().unwrap_or_default(),
                    requests: c.requests(),
                    counts: *c,
                    qps: c.ok as f64 / d,
                    latency_us: hist.map(Latency::of),
                    histogram: hist.map(stats::encode).transpose()?,
                })
            })
            .collect::<Result<Vec<_>, crate::Error>>()?;
        let routers = p
            .routers
            .iter()
            .map(|(target, tally)| {
                Ok(RouterReport {
                    target: target.clone(),
                    requests: tally.counts.requests(),
                    counts: tally.counts,
                    qps: tally.counts.ok as f64 / d,
                    latency_us: Latency::of(&tally.hist),
                    histogram: stats::encode(&tally.hist)?,
                })
            })
            .collect::<Result<Vec<_>, crate::Error>>()?;
        let per_shard: Vec<f64> = shards.iter().map(|s| s.qps).collect();
        let requests = t.counts.requests();
        let per_million = |n: u64| {
            if requests == 0 {
                0.0
            } else {
                n as f64 * 1e6 / requests as f64
            }
        };
        let series = p
            .series
            .iter()
            .map(|s| {
                Ok(SecondReport {
                    unix_s: s.unix_s,
                    t: s.t,
                    seconds: s.seconds,
                    counts: s.totals.counts,
                    qps: s.totals.counts.ok as f64 / s.seconds.max(1e-9),
                    p50_us: quantile(&s.totals.hist, 0.5),
                    p99_us: quantile(&s.totals.hist, 0.99),
                    p999_us: quantile(&s.totals.hist, 0.999),
                    max_us: s.totals.hist.max(),
                    histogram: stats::encode(&s.totals.hist)?,
                })
            })
            .collect::<Result<Vec<_>, crate::Error>>()?;
        Ok(Report {
            format: FORMAT,
            loadgen_version: env!("CARGO_PKG_VERSION").to_string(),
            settings: p.settings,
            hosts: p.hosts,
            duration_s: p.duration_s,
            target_qps: p.target_qps,
            qps: t.counts.ok as f64 / d,
            requests,
            counts: t.counts,
            unsent: t.unsent,
            errors_per_s: t.counts.errors as f64 / d,
            errors_per_million: per_million(t.counts.errors),
            timeouts_per_million: per_million(t.counts.timeouts),
            errors_by_sqlstate: t.errors.clone(),
            ops: Op::ALL
                .into_iter()
                .filter(|o| t.ops[o.index()].requests() > 0)
                .map(|o| (o.name().to_string(), t.ops[o.index()]))
                .collect(),
            shard_qps: Spread::of(&per_shard),
            shards,
            routers,
            latency_us: Latency::of(&t.hist),
            histogram: stats::encode(&t.hist)?,
            send_lag_us: (!t.send_lag.is_empty()).then(|| Latency::of(&t.send_lag)),
            send_lag_histogram: if t.send_lag.is_empty() {
                None
            } else {
                Some(stats::encode(&t.send_lag)?)
            },
            cpu: p.cpu,
            series,
            warnings: p.warnings,
        })
    }

    /// The raw data back (for merging): window totals, the series and the routers' shares.
    pub fn raw(&self) -> Result<Raw, crate::Error> {
        let mut totals = Totals::new(self.shards.len());
        totals.hist = stats::decode(&self.histogram)?;
        if let Some(h) = &self.send_lag_histogram {
            totals.send_lag = stats::decode(h)?;
        }
        // Per-shard latency only when every shard has it (format 2).
        if !self.shards.is_empty() && self.shards.iter().all(|s| s.histogram.is_some()) {
            totals.shard_hists = self
                .shards
                .iter()
                .map(|s| stats::decode_shard(s.histogram.as_deref().unwrap_or_default()))
                .collect::<Result<Vec<_>, _>>()?;
        }
        totals.counts = self.counts;
        totals.unsent = self.unsent;
        for s in &self.shards {
            if let Some(c) = totals.shards.get_mut(s.index) {
                *c = s.counts;
            }
        }
        for op in Op::ALL {
            if let Some(c) = self.ops.get(op.name()) {
                totals.ops[op.index()] = *c;
            }
        }
        totals.errors = self.errors_by_sqlstate.clone();
        let series = self
            .series
            .iter()
            .map(|s| {
                Ok(SeriesPoint {
                    unix_s: s.unix_s,
                    t: s.t,
                    seconds: s.seconds,
                    totals: Tally {
                        hist: stats::decode(&s.histogram)?,
                        counts: s.counts,
                    },
                })
            })
            .collect::<Result<Vec<_>, crate::Error>>()?;
        let routers = self
            .routers
            .iter()
            .map(|r| {
                Ok((
                    r.target.clone(),
                    Tally {
                        hist: stats::decode(&r.histogram)?,
                        counts: r.counts,
                    },
                ))
            })
            .collect::<Result<Vec<_>, crate::Error>>()?;
        Ok(Raw {
            totals,
            series,
            routers,
        })
    }

    /// Reads a `--json` report.
    pub fn read(path: &Path) -> Result<Report, crate::Error> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let r: Report = serde_json::from_str(&text)
            .map_err(|e| format!("{} is not a loadgen JSON report: {e}", path.display()))?;
        if !(OLDEST_FORMAT..=FORMAT).contains(&r.format) {
            return Err(format!(
                "{} is report format {}, this loadgen reads formats {OLDEST_FORMAT} to {FORMAT}",
                path.display(),
                r.format
            ));
        }
        Ok(r)
    }

    /// Writes the JSON report.
    pub fn write(&self, path: &Path) -> Result<(), crate::Error> {
        let text = serde_json::to_string_pretty(self)
            .map_err(|e| format!("cannot encode the report: {e}"))?;
        std::fs::write(path, text + "\n")
            .map_err(|e| format!("cannot write {}: {e}", path.display()))
    }
}

fn quantile(h: &Histogram<u64>, q: f64) -> u64 {
    if h.is_empty() {
        0
    } else {
        h.value_at_quantile(q)
    }
}
