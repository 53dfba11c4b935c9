//! The human table of a report (`loadgen report`, and what `loadgen run` prints at its end):
//! one section after another, each its own method of [`Report`].

use std::fmt::Write as _;

use crate::report::{Latency, Report, ShardReport};

impl Report {
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
                "  send lag, µs after the intended time: p50 {}   p99 {}   p99.9 {}   max {}   (loadgen's own delay, or its connection still busy with a slow earlier reply)",
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
