//! `loadgen compare BEFORE.json AFTER.json`: the table operators make when they swap a
//! component in: the same workload before and after, with the change and the ratio, overall
//! and per shard (worst shards first).
//!
//! Every latency figure is read from the reports' histograms, not from their summaries, so any
//! percentile can be compared (p95 also for format-1 reports, which did not print it) and the
//! figures are exactly those of the reports. Computing the comparison is pure; printing and
//! drawing it are separate.

use std::fmt::Write as _;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use crate::report::Report;
use crate::stats;

/// Which way is better for a metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Better {
    Higher,
    Lower,
}

/// One line of the overall table. A latency figure is `None` for a run without successes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Row {
    pub metric: String,
    pub unit: String,
    pub before: Option<f64>,
    pub after: Option<f64>,
    /// after - before.
    pub change: Option<f64>,
    /// after / before (none when before is 0 or either is unknown).
    pub ratio: Option<f64>,
    pub better: Better,
}

impl Row {
    fn new(
        metric: &str,
        unit: &str,
        before: Option<f64>,
        after: Option<f64>,
        better: Better,
    ) -> Row {
        let both = before.zip(after);
        Row {
            metric: metric.into(),
            unit: unit.into(),
            before,
            after,
            change: both.map(|(b, a)| a - b),
            ratio: both.filter(|(b, _)| *b != 0.0).map(|(b, a)| a / b),
            better,
        }
    }

    /// Whether `after` is worse than `before` by more than `tolerance` (a fraction); unknown
    /// figures are never called worse.
    pub fn worse_by(&self, tolerance: f64) -> bool {
        match (self.better, self.ratio) {
            (Better::Lower, Some(r)) => r > 1.0 + tolerance,
            (Better::Higher, Some(r)) => r < 1.0 - tolerance,
            (Better::Lower, None) => self.before == Some(0.0) && self.after > Some(0.0),
            (Better::Higher, None) => false,
        }
    }
}

/// One side of a shard's comparison.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct ShardSide {
    pub qps: f64,
    pub requests: u64,
    /// None without successes, or for reports without per-shard latency (format 1).
    pub p50_us: Option<u64>,
    pub p99_us: Option<u64>,
    pub max_us: Option<u64>,
    /// Errors and timeouts per million requests.
    pub failed_per_million: f64,
}

/// One shard, before and after.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShardRow {
    pub index: usize,
    pub range: String,
    pub before: ShardSide,
    pub after: ShardSide,
    /// after p99 / before p99, when both are known.
    pub p99_ratio: Option<f64>,
    /// after qps / before qps.
    pub qps_ratio: Option<f64>,
}

/// What a report was, in a line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Side {
    pub file: String,
    pub targets: String,
    pub mode: String,
    pub rate: String,
    pub protocol: String,
    pub mix: String,
    pub connections: usize,
    pub duration_s: f64,
    pub hosts: Vec<String>,
}

impl Side {
    fn of(file: &str, r: &Report) -> Side {
        let s = &r.settings;
        Side {
            file: file.into(),
            targets: s.targets.clone(),
            mode: s.mode.clone(),
            rate: s.rate.clone(),
            protocol: s.protocol.clone(),
            mix: s.mix.clone(),
            connections: s.connections,
            duration_s: r.duration_s,
            hosts: r.hosts.iter().map(|h| h.label().to_string()).collect(),
        }
    }
}

/// The whole comparison (what `--json` writes).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Comparison {
    pub before: Side,
    pub after: Side,
    pub overall: Vec<Row>,
    /// Worst first: highest p99 ratio, or lowest throughput ratio where latency per shard is
    /// not known. Empty when the two runs used different shard maps.
    pub shards: Vec<ShardRow>,
    /// Differences in set-up a reader should know about.
    pub notes: Vec<String>,
}

/// The quantiles of the overall table, with their names.
pub const QUANTILES: [(&str, f64); 6] = [
    ("p50", 0.50),
    ("p90", 0.90),
    ("p95", 0.95),
    ("p99", 0.99),
    ("p99.9", 0.999),
    ("max", 1.0),
];

fn quantile_ms(h: &Histogram<u64>, q: f64) -> Option<f64> {
    if h.is_empty() {
        None
    } else if q >= 1.0 {
        Some(h.max() as f64 / 1000.0)
    } else {
        Some(h.value_at_quantile(q) as f64 / 1000.0)
    }
}

fn failed_per_million(errors: u64, timeouts: u64, requests: u64) -> f64 {
    if requests == 0 {
        0.0
    } else {
        (errors + timeouts) as f64 * 1e6 / requests as f64
    }
}

/// Compares two reports (`names` are used in messages and the header).
pub fn compare(
    before_name: &str,
    before: &Report,
    after_name: &str,
    after: &Report,
) -> Result<Comparison, crate::Error> {
    let hb = stats::decode(&before.histogram).map_err(|e| format!("{before_name}: {e}"))?;
    let ha = stats::decode(&after.histogram).map_err(|e| format!("{after_name}: {e}"))?;
    let mut overall = vec![Row::new(
        "throughput",
        "qps",
        Some(before.qps),
        Some(after.qps),
        Better::Higher,
    )];
    for (name, q) in QUANTILES {
        overall.push(Row::new(
            name,
            "ms",
            quantile_ms(&hb, q),
            quantile_ms(&ha, q),
            Better::Lower,
        ));
    }
    let mean = |h: &Histogram<u64>| (!h.is_empty()).then(|| h.mean() / 1000.0);
    overall.push(Row::new("mean", "ms", mean(&hb), mean(&ha), Better::Lower));
    overall.push(Row::new(
        "errors",
        "per million",
        Some(before.errors_per_million),
        Some(after.errors_per_million),
        Better::Lower,
    ));
    overall.push(Row::new(
        "timeouts",
        "per million",
        Some(before.timeouts_per_million),
        Some(after.timeouts_per_million),
        Better::Lower,
    ));
    if let (Some(b), Some(a)) = (&before.send_lag_us, &after.send_lag_us) {
        overall.push(Row::new(
            "send lag p99",
            "µs",
            Some(b.p99 as f64),
            Some(a.p99 as f64),
            Better::Lower,
        ));
    }

    let mut notes = Vec::new();
    let (sb, sa) = (&before.settings, &after.settings);
    for (what, b, a) in [
        ("rate", &sb.rate, &sa.rate),
        ("protocol", &sb.protocol, &sa.protocol),
        ("mix", &sb.mix, &sa.mix),
        ("keys", &sb.keys, &sa.keys),
    ] {
        if b != a {
            notes.push(format!("the runs differ in {what}: {b} before, {a} after"));
        }
    }
    if (before.duration_s - after.duration_s).abs() > 0.5 {
        notes.push(format!(
            "the measured windows differ: {:.1} s before, {:.1} s after (maxima over longer windows tend to be higher)",
            before.duration_s, after.duration_s
        ));
    }

    let same_map = before.shards.len() == after.shards.len()
        && before
            .shards
            .iter()
            .zip(&after.shards)
            .all(|(b, a)| b.range == a.range);
    let mut shards = Vec::new();
    if same_map {
        for (b, a) in before.shards.iter().zip(&after.shards) {
            let side = |s: &crate::report::ShardReport| {
                let l = s.latency_us.filter(|l| l.count > 0);
                ShardSide {
                    qps: s.qps,
                    requests: s.requests,
                    p50_us: l.map(|l| l.p50),
                    p99_us: l.map(|l| l.p99),
                    max_us: l.map(|l| l.max),
                    failed_per_million: failed_per_million(
                        s.counts.errors,
                        s.counts.timeouts,
                        s.requests,
                    ),
                }
            };
            let (bs, as_) = (side(b), side(a));
            let p99_ratio = match (bs.p99_us, as_.p99_us) {
                (Some(x), Some(y)) if x > 0 => Some(y as f64 / x as f64),
                _ => None,
            };
            shards.push(ShardRow {
                index: b.index,
                range: b.range.clone(),
                before: bs,
                after: as_,
                p99_ratio,
                qps_ratio: (bs.qps > 0.0).then(|| as_.qps / bs.qps),
            });
        }
        // Worst first: a shard that stopped answering, then the most new failures, then
        // the highest p99 ratio, then the lowest throughput ratio.
        let worse = |r: &ShardRow| {
            let dead = r.after.requests > 0 && r.after.qps == 0.0 && r.before.qps > 0.0;
            (
                u8::from(dead),
                r.after.failed_per_million - r.before.failed_per_million,
                r.p99_ratio.unwrap_or(0.0),
                -r.qps_ratio.unwrap_or(1.0),
            )
        };
        shards.sort_by(|x, y| {
            let (wx, wy) = (worse(x), worse(y));
            wy.0.cmp(&wx.0)
                .then(wy.1.total_cmp(&wx.1))
                .then(wy.2.total_cmp(&wx.2))
                .then(wy.3.total_cmp(&wx.3))
                .then(x.index.cmp(&y.index))
        });
        let unmeasured = |r: &Report| r.shards.iter().any(|s| s.latency_us.is_none());
        if unmeasured(before) || unmeasured(after) {
            notes.push(
                "per-shard latency is missing from a report (written by a loadgen before format 2): shards are ordered by failures and throughput".into(),
            );
        }
    } else {
        notes.push(format!(
            "the runs used different shard maps ({} and {} shards): no per-shard comparison",
            before.shards.len(),
            after.shards.len()
        ));
    }
    Ok(Comparison {
        before: Side::of(before_name, before),
        after: Side::of(after_name, after),
        overall,
        shards,
        notes,
    })
}

impl Comparison {
    /// The overall row called `metric`.
    pub fn row(&self, metric: &str) -> Option<&Row> {
        self.overall.iter().find(|r| r.metric == metric)
    }

    /// The human table; `shards_shown` shards at most (worst first).
    pub fn render(&self, shards_shown: usize) -> String {
        let mut o = String::new();
        for (name, s) in [("before", &self.before), ("after", &self.after)] {
            let _ = writeln!(
                o,
                "{name:<7} {}: {} ({}), rate {}, {} connections, protocol {}, mix {}, {:.1} s",
                s.file, s.targets, s.mode, s.rate, s.connections, s.protocol, s.mix, s.duration_s
            );
        }
        let _ = writeln!(o);
        let _ = writeln!(
            o,
            "  {:<26} {:>12} {:>12} {:>12} {:>8}",
            "", "before", "after", "change", "ratio"
        );
        for r in &self.overall {
            let digits = if r.unit == "ms" { 3 } else { 1 };
            let name = format!("{} ({})", r.metric, r.unit);
            let num = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.digits$}"));
            let _ = writeln!(
                o,
                "  {:<26} {:>12} {:>12} {:>12} {:>8}{}",
                name,
                num(r.before),
                num(r.after),
                r.change
                    .map_or("-".to_string(), |v| format!("{v:+.digits$}")),
                r.ratio.map_or("-".to_string(), |x| format!("{x:.3}")),
                if r.worse_by(0.05) { "  worse" } else { "" }
            );
        }
        if !self.shards.is_empty() && shards_shown > 0 {
            let shown = shards_shown.min(self.shards.len());
            let _ = writeln!(o);
            let _ = writeln!(
                o,
                "per shard, worst first{}",
                if shown < self.shards.len() {
                    format!(" ({shown} of {}; all are in --json)", self.shards.len())
                } else {
                    String::new()
                }
            );
            let _ = writeln!(
                o,
                "  {:>5}  {:<14} {:>10} {:>10} {:>9} {:>9} {:>9} {:>9} {:>7} {:>9} {:>9}",
                "shard",
                "range",
                "qps bef",
                "qps aft",
                "p50 bef",
                "p50 aft",
                "p99 bef",
                "p99 aft",
                "p99 x",
                "fail/M b",
                "fail/M a"
            );
            let ms = |v: Option<u64>| {
                v.map_or("-".to_string(), |us| format!("{:.3}", us as f64 / 1000.0))
            };
            for s in &self.shards[..shown] {
                let _ = writeln!(
                    o,
                    "  {:>5}  {:<14} {:>10.1} {:>10.1} {:>9} {:>9} {:>9} {:>9} {:>7} {:>9.1} {:>9.1}",
                    s.index,
                    s.range,
                    s.before.qps,
                    s.after.qps,
                    ms(s.before.p50_us),
                    ms(s.after.p50_us),
                    ms(s.before.p99_us),
                    ms(s.after.p99_us),
                    s.p99_ratio.map_or("-".to_string(), |x| format!("{x:.2}")),
                    s.before.failed_per_million,
                    s.after.failed_per_million
                );
            }
        }
        for n in &self.notes {
            let _ = writeln!(o, "note: {n}");
        }
        o
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shard_that_stopped_answering_comes_first() {
        use crate::merge::tests::report_of;
        // Before: both shards answer; after: shard 0 answers faster, shard 1 only fails.
        let before = report_of(&[(0, 500), (1, 500), (0, 600), (1, 600)], 100);
        let after = report_of(&[(0, 100), (0, 120)], 100);
        let cmp = compare("b", &before, "a", &after).expect("compare");
        let order: Vec<usize> = cmp.shards.iter().map(|s| s.index).collect();
        assert_eq!(order, [1, 0]);
        assert_eq!(cmp.shards[0].after.p99_us, None, "no successes, no latency");
        assert_eq!(cmp.shards[0].p99_ratio, None);
        // And a run without any success has no latency rows to call better or worse.
        let nothing = report_of(&[], 100);
        let cmp = compare("b", &before, "a", &nothing).expect("compare");
        let p99 = cmp.row("p99").expect("p99");
        assert_eq!((p99.after, p99.ratio), (None, None));
        assert!(cmp.row("throughput").is_some_and(|r| r.worse_by(0.05)));
        assert!(!cmp.render(10).contains("NaN"));
    }

    #[test]
    fn ratios_and_direction() {
        let r = Row::new("p99", "ms", Some(2.0), Some(3.0), Better::Lower);
        assert_eq!((r.change, r.ratio), (Some(1.0), Some(1.5)));
        assert!(r.worse_by(0.05));
        let q = Row::new("throughput", "qps", Some(100.0), Some(99.0), Better::Higher);
        assert!(!q.worse_by(0.05));
        let errors = |b, a| Row::new("errors", "per million", Some(b), Some(a), Better::Lower);
        assert!(errors(0.0, 3.0).worse_by(0.05));
        assert_eq!(errors(0.0, 0.0).ratio, None);
        assert!(!errors(0.0, 0.0).worse_by(0.05));
        // No successes on one side: no latency to compare, nothing called worse.
        let none = Row::new("p99", "ms", None, Some(3.0), Better::Lower);
        assert_eq!((none.change, none.ratio), (None, None));
        assert!(!none.worse_by(0.05));
    }
}
