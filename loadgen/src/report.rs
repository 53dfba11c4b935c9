//! The report of a run (or of several merged): the JSON form (`--json`, everything including
//! the full histograms and a per-second series, so reports merge exactly) and the human table
//! printed on stdout.

use std::collections::BTreeMap;
use std::fmt::Write as _;
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

    /// The human table.
    pub fn render(&self) -> String {
        let mut o = String::new();
        self.render_heading(&mut o);
        self.render_throughput(&mut o);
        self.render_latency(&mut o);
        self.render_errors(&mut o);
        self.render_shards(&mut o);
        self.render_routers(&mut o);
        self.render_hosts(&mut o);
        self.render_cpu_and_warnings(&mut o);
        o
    }

    /// The table's first lines: what was run against what, and how.
    fn render_heading(&self, o: &mut String) {
        let s = &self.settings;
        let _ = writeln!(
            o,
            "loadgen report: {} host{}, {} ({}), {} shard{}",
            self.hosts.len(),
            if self.hosts.len() == 1 { "" } else { "s" },
            s.targets,
            s.mode,
            self.shards.len(),
            if self.shards.len() == 1 { "" } else { "s" },
        );
        let _ = writeln!(
            o,
            "  {} connections x pipeline {}, protocol {}, mix {}, keys {}, rate {}, {:.1} s measured after {:.1} s warmup, timeout {} ms",
            s.connections, s.pipeline, s.protocol, s.mix, s.keys, s.rate, self.duration_s, s.warmup_s, s.timeout_ms
        );
        let _ = writeln!(o);
    }

    /// The table's throughput section: overall, its spread over shards and per operation.
    fn render_throughput(&self, o: &mut String) {
        let _ = writeln!(o, "throughput");
        match self.target_qps {
            Some(t) if t > 0.0 => {
                let _ = writeln!(
                    o,
                    "  achieved       {:>12.1} qps   target {:.1} qps ({:.2}%)",
                    self.qps,
                    t,
                    100.0 * self.qps / t
                );
            }
            _ => {
                let _ = writeln!(o, "  achieved       {:>12.1} qps   (closed loop)", self.qps);
            }
        }
        let _ = writeln!(
            o,
            "  requests       {:>12}       ok {}  errors {}  timeouts {}  unsent {}",
            self.requests, self.counts.ok, self.counts.errors, self.counts.timeouts, self.unsent
        );
        let q = &self.shard_qps;
        let _ =
            writeln!(
            o,
            "  per shard      min {:.1}  max {:.1}  mean {:.1}  stddev {:.1} qps ({:.2}% of mean)",
            q.min,
            q.max,
            q.mean,
            q.stddev,
            if q.mean > 0.0 { 100.0 * q.stddev / q.mean } else { 0.0 }
        );
        if self.ops.len() > 1 {
            let ops: Vec<String> = self
                .ops
                .iter()
                .map(|(name, c)| {
                    format!("{name} {} ok/{} err/{} timeout", c.ok, c.errors, c.timeouts)
                })
                .collect();
            let _ = writeln!(o, "  by operation   {}", ops.join(", "));
        }
        let _ = writeln!(o);
    }

    /// The table's latency section, with the send lag in open loop.
    fn render_latency(&self, o: &mut String) {
        let l = &self.latency_us;
        let _ = writeln!(
            o,
            "latency, ms from the intended send time ({} successful requests)",
            l.count
        );
        let _ = writeln!(
            o,
            "  p50 {:.3}   p90 {:.3}   p99 {:.3}   p99.9 {:.3}   max {:.3}   mean {:.3}",
            ms(l.p50),
            ms(l.p90),
            ms(l.p99),
            ms(l.p999),
            ms(l.max),
            l.mean / 1000.0
        );
        if let Some(g) = &self.send_lag_us {
            let _ = writeln!(
                o,
                "  send lag, µs after the intended time: p50 {}   p99 {}   p99.9 {}   max {}   (the rest of the latency is the target's)",
                g.p50, g.p99, g.p999, g.max
            );
        }
        let _ = writeln!(o);
    }

    /// The table's errors and timeouts section.
    fn render_errors(&self, o: &mut String) {
        let _ = writeln!(
            o,
            "errors          {:.2}/s   {:.1} per million requests   timeouts {} ({:.1} per million)",
            self.errors_per_s, self.errors_per_million, self.counts.timeouts, self.timeouts_per_million
        );
        if !self.errors_by_sqlstate.is_empty() {
            let codes: Vec<String> = self
                .errors_by_sqlstate
                .iter()
                .map(|(c, n)| format!("{c} x{n}"))
                .collect();
            let _ = writeln!(o, "  by SQLSTATE   {}", codes.join(", "));
        }
        let _ = writeln!(o);
    }

    /// The table's per-shard section.
    fn render_shards(&self, o: &mut String) {
        let shown = self.shards_shown();
        let _ = writeln!(
            o,
            "per shard{}",
            if shown.len() < self.shards.len() {
                " (the 5 slowest and 5 fastest; all are in --json)"
            } else {
                ""
            }
        );
        let _ = writeln!(
            o,
            "  {:>5}  {:<18} {:>12} {:>12} {:>8} {:>8} {:>9} {:>9}",
            "shard", "range", "qps", "ok", "errors", "timeouts", "p50 ms", "p99 ms"
        );
        let lat = |l: &Option<Latency>, f: fn(&Latency) -> u64| {
            l.as_ref()
                .map_or("-".to_string(), |l| format!("{:.3}", ms(f(l))))
        };
        for sh in shown {
            let _ = writeln!(
                o,
                "  {:>5}  {:<18} {:>12.1} {:>12} {:>8} {:>8} {:>9} {:>9}",
                sh.index,
                sh.range,
                sh.qps,
                sh.counts.ok,
                sh.counts.errors,
                sh.counts.timeouts,
                lat(&sh.latency_us, |l| l.p50),
                lat(&sh.latency_us, |l| l.p99)
            );
        }
        let _ = writeln!(o);
    }

    /// The shards the table lists: all of them, or of many only the 5 slowest and 5 fastest.
    fn shards_shown(&self) -> Vec<&ShardReport> {
        if self.shards.len() <= 32 {
            return self.shards.iter().collect();
        }
        let mut by_qps: Vec<&ShardReport> = self.shards.iter().collect();
        by_qps.sort_by(|a, b| a.qps.total_cmp(&b.qps));
        let mut v: Vec<&ShardReport> = by_qps.iter().take(5).copied().collect();
        v.extend(by_qps.iter().rev().take(5).rev().copied());
        v
    }

    /// The table's per-router section, when the run went through routers.
    fn render_routers(&self, o: &mut String) {
        if self.routers.is_empty() {
            return;
        }
        let _ = writeln!(o, "per router");
        let _ = writeln!(
            o,
            "  {:<40} {:>12} {:>8} {:>8} {:>9} {:>9} {:>9}",
            "target", "qps", "errors", "timeouts", "p50 ms", "p99 ms", "max ms"
        );
        for r in &self.routers {
            let _ = writeln!(
                o,
                "  {:<40} {:>12.1} {:>8} {:>8} {:>9.3} {:>9.3} {:>9.3}",
                r.target,
                r.qps,
                r.counts.errors,
                r.counts.timeouts,
                ms(r.latency_us.p50),
                ms(r.latency_us.p99),
                ms(r.latency_us.max)
            );
        }
        let _ = writeln!(o);
    }

    /// The table's per-host section, for a report merged from several hosts.
    fn render_hosts(&self, o: &mut String) {
        if self.hosts.len() <= 1 {
            return;
        }
        let _ = writeln!(o, "per host");
        let _ = writeln!(
            o,
            "  {:<24} {:>12} {:>8} {:>8} {:>9} {:>9} {:>12} {:>8}",
            "label", "qps", "errors", "timeouts", "p50 ms", "p99 ms", "lag p99 µs", "cpu µs/q"
        );
        for h in &self.hosts {
            let _ = writeln!(
                o,
                "  {:<24} {:>12.1} {:>8} {:>8} {:>9.3} {:>9.3} {:>12} {:>8.1}",
                h.label(),
                h.qps,
                h.errors,
                h.timeouts,
                ms(h.latency_us.p50),
                ms(h.latency_us.p99),
                h.send_lag_us.map_or("-".to_string(), |g| g.p99.to_string()),
                h.cpu.us_per_query
            );
        }
        let _ = writeln!(o);
    }

    /// The table's last lines: loadgen's own CPU use, then the warnings.
    fn render_cpu_and_warnings(&self, o: &mut String) {
        let c = &self.cpu;
        let _ = writeln!(
            o,
            "loadgen cpu     user {:.2} s + sys {:.2} s = {:.1} µs per request; {:.2} of {} cores",
            c.user_s, c.sys_s, c.us_per_query, c.cores_used, c.cores_available
        );
        for w in &self.warnings {
            let _ = writeln!(o, "warning: {w}");
        }
    }
}

/// Microseconds as milliseconds, for the human table and the charts.
pub(crate) fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

fn quantile(h: &Histogram<u64>, q: f64) -> u64 {
    if h.is_empty() {
        0
    } else {
        h.value_at_quantile(q)
    }
}
