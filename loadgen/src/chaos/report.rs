//! The chaos run's report: the load's totals, one row per fault (errors by SQLSTATE, timeouts,
//! p50/p99/max in its window, time to recover), the invariants; as text, `chaos.json` and the
//! per-second `timeline.csv`.

use std::path::Path;

use serde::Serialize;

use super::bank::Check;
use super::faults::Applied;
use super::timeline::{self, Second, Window};
use super::ChaosArgs;

/// Seconds after a fault's command ended that still count as its window (unless the next
/// fault starts first).
pub const AFTER_S: f64 = 10.0;

/// Seconds at the start that do not count as the steady state before the faults: connections
/// open (a login and five statements prepared each, slow with a delay on every hop).
pub const WARMUP_S: usize = 3;

/// A fault and what the load saw around it.
#[derive(Debug, Clone, Serialize)]
pub struct FaultRow {
    #[serde(flatten)]
    pub fault: Applied,
    /// From the second the fault started to `AFTER_S` after it ended (or the next fault).
    pub window: Window,
    /// Seconds from the fault's start until the load was clean again (see [`recovered`]): no
    /// error, no timeout, throughput at 90% of the rate and p99 within the limit, for 3
    /// seconds in a row.
    pub recovered_after_s: Option<usize>,
}

/// Seconds from a fault's start (second `from`) until the load was clean again: 0 when no
/// second of its window (`from..to`) was unclean, else from its first unclean second to the
/// first of 3 clean seconds in a row before the next fault (`until`); `None` when there were none.
fn recovered(
    seconds: &[Second],
    from: usize,
    to: usize,
    until: usize,
    min_ok: u64,
    limit: f64,
) -> Option<usize> {
    let window = seconds.get(from..to.min(seconds.len())).unwrap_or(&[]);
    match window
        .iter()
        .position(|s| !timeline::is_clean(s, min_ok, limit))
    {
        None => Some(0),
        Some(bad) => timeline::recovery(seconds, from + bad, until, min_ok, limit).map(|r| bad + r),
    }
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub targets: usize,
    pub rate: f64,
    pub duration_s: f64,
    pub connections: usize,
    pub mix: String,
    pub total: Window,
    /// The seconds before the first fault, after [`WARMUP_S`].
    pub before_faults: Window,
    /// What counts as recovered: p99 at most this.
    pub recovered_p99_limit_ms: f64,
    pub faults: Vec<FaultRow>,
    pub invariants: Vec<Check>,
}

impl Report {
    pub fn new(
        a: &ChaosArgs,
        seconds: &[Second],
        applied: Vec<Applied>,
        checks: Vec<Check>,
    ) -> Report {
        let first_fault = applied
            .first()
            .map_or(seconds.len(), |f| f.start_s as usize);
        let before = Window::of(seconds, WARMUP_S.min(first_fault), first_fault);
        // Recovered means back to what it was before: p99 within 3x that (at least 5 ms, so
        // a quiet machine's sub-millisecond p99 does not make noise count as a fault).
        let limit = (before.p99_ms * 3.0).max(5.0);
        let min_ok = (a.rate * 0.9).floor() as u64;
        let faults = applied
            .iter()
            .enumerate()
            .map(|(i, f)| {
                let from = f.start_s as usize;
                let next = applied
                    .get(i + 1)
                    .map_or(seconds.len(), |n| (n.start_s as usize).max(from + 1));
                let to = ((f.end_s + AFTER_S).ceil() as usize).min(next);
                FaultRow {
                    fault: f.clone(),
                    window: Window::of(seconds, from, to),
                    recovered_after_s: recovered(seconds, from, to, next, min_ok, limit),
                }
            })
            .collect();
        Report {
            targets: a.targets.len(),
            rate: a.rate,
            duration_s: a.duration,
            connections: a.connections,
            mix: a.mix.to_string(),
            total: Window::of(seconds, 0, seconds.len()),
            before_faults: before,
            recovered_p99_limit_ms: limit,
            faults,
            invariants: checks,
        }
    }

    /// Every invariant held and every fault was applied.
    pub fn passed(&self) -> bool {
        self.invariants.iter().all(|c| c.held)
            && self.faults.iter().all(|f| f.fault.failure.is_none())
    }

    pub fn render(&self) -> String {
        let t = &self.total;
        let mut out = format!(
            "chaos: {} routers, {}/s for {} s over {} connections ({})\n\
             load: {} ok, {} errors ({}), {} timeouts; p50 {:.2} ms, p99 {:.2} ms, max {:.1} ms\n\
             before the first fault: p50 {:.2} ms, p99 {:.2} ms, max {:.1} ms\n\n",
            self.targets,
            self.rate,
            self.duration_s,
            self.connections,
            self.mix,
            t.ok,
            t.error_count(),
            t.errors_text(),
            t.timeouts,
            t.p50_ms,
            t.p99_ms,
            t.max_ms,
            self.before_faults.p50_ms,
            self.before_faults.p99_ms,
            self.before_faults.max_ms,
        );
        out.push_str(&format!(
            "{:<18} {:>7} {:>6} {:>8} {:>8} {:>9} {:>9} {:>10}  errors\n",
            "fault", "at s", "took s", "timeouts", "p50 ms", "p99 ms", "max ms", "recovered"
        ));
        for f in &self.faults {
            let w = &f.window;
            let recovered = match f.recovered_after_s {
                Some(s) => format!("{s} s"),
                None => "not".into(),
            };
            out.push_str(&format!(
                "{:<18} {:>7.1} {:>6.1} {:>8} {:>8.2} {:>9.2} {:>9.1} {:>10}  {}{}\n",
                f.fault.name,
                f.fault.start_s,
                f.fault.end_s - f.fault.start_s,
                w.timeouts,
                w.p50_ms,
                w.p99_ms,
                w.max_ms,
                recovered,
                w.errors_text(),
                f.fault
                    .failure
                    .as_deref()
                    .map(|e| format!("  FAULT FAILED: {e}"))
                    .unwrap_or_default()
            ));
        }
        out.push_str(&format!(
            "(recovered: 0 when the window was clean, else seconds from the fault's start to 3 clean seconds in a row before the next fault: no error or timeout, >= 90% of the rate, p99 <= {:.1} ms)\n\ninvariants:\n",
            self.recovered_p99_limit_ms
        ));
        for c in &self.invariants {
            let mark = if c.held { "held  " } else { "BROKEN" };
            out.push_str(&format!("  {mark} {}: {}\n", c.name, c.detail));
        }
        out.push_str(if self.passed() {
            "chaos: PASSED\n"
        } else {
            "chaos: FAILED\n"
        });
        out
    }

    /// Writes `chaos.json` and `timeline.csv` into `dir`.
    pub fn write(&self, dir: &Path, seconds: &[Second]) -> Result<(), String> {
        let json = serde_json::to_string_pretty(self)
            .map_err(|e| format!("cannot encode the report: {e}"))?;
        let write = |name: &str, text: String| {
            let path = dir.join(name);
            std::fs::write(&path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))
        };
        write("chaos.json", json + "\n")?;
        write("timeline.csv", timeline::csv(seconds))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn second(ok: u64, errors: u64) -> Second {
        let mut s = Second::new();
        s.ok = ok;
        if errors > 0 {
            s.errors.insert("08006".into(), errors);
        }
        s.latency.saturating_record(500);
        s
    }

    #[test]
    fn recovery_counts_from_the_fault_to_clean_seconds_before_the_next() {
        let clean = || second(100, 0);
        let bad = || second(10, 3);
        // Clean through its window: 0, even if something else breaks later.
        let s = vec![clean(), clean(), clean(), bad(), clean(), clean(), clean()];
        assert_eq!(recovered(&s, 0, 3, 7, 90, 5.0), Some(0));
        // Its first unclean second comes late (a split's cut-over): counted from the start.
        assert_eq!(recovered(&s, 0, 5, 7, 90, 5.0), Some(4));
        // Not clean again before the next fault starts.
        assert_eq!(recovered(&s, 0, 5, 6, 90, 5.0), None);
    }
}
