//! What the load saw, second by second: completed requests, errors by SQLSTATE, timeouts and a
//! latency histogram per second of the run, and from it the figures of each fault's window.
//!
//! Lanes record into one shared [`Timeline`] (a mutex per second would be finer, but at the
//! rates a chaos run drives, a few thousand a second, one short lock per request is noise next
//! to the round trip it measures). Latency is measured from each request's intended send time,
//! so a lane that was stuck reconnecting shows its backlog as latency, not as silence.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::stats;
use crate::table::ms;

/// One second of the run.
#[derive(Debug, Clone)]
pub struct Second {
    pub ok: u64,
    pub timeouts: u64,
    /// Errors by SQLSTATE (`08006` for a connection lost under a request, `08001` for one that
    /// could not be opened).
    pub errors: BTreeMap<String, u64>,
    pub latency: Histogram<u64>,
}

impl Default for Second {
    fn default() -> Second {
        Second::new()
    }
}

impl Second {
    pub fn new() -> Second {
        Second {
            ok: 0,
            timeouts: 0,
            errors: BTreeMap::new(),
            latency: stats::new_shard_hist(),
        }
    }

    pub fn error_count(&self) -> u64 {
        self.errors.values().sum()
    }
}

/// How one request ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    Timeout,
    Error(String),
}

/// The run's seconds, counted from the start of the load.
pub struct Timeline {
    start: Instant,
    seconds: Mutex<Vec<Second>>,
}

impl Timeline {
    pub fn new(start: Instant) -> Timeline {
        Timeline {
            start,
            seconds: Mutex::new(Vec::new()),
        }
    }

    pub fn start(&self) -> Instant {
        self.start
    }

    /// Seconds since the start of the load (0 before it).
    pub fn at(&self, t: Instant) -> f64 {
        t.saturating_duration_since(self.start).as_secs_f64()
    }

    /// Records a request that ended now, `latency` after its intended send time.
    pub fn record(&self, outcome: Outcome, latency: Duration) {
        let second = self.at(Instant::now()) as usize;
        let mut seconds = self.seconds.lock().unwrap_or_else(|e| e.into_inner());
        while seconds.len() <= second {
            seconds.push(Second::new());
        }
        let s = &mut seconds[second];
        match outcome {
            Outcome::Ok => s.ok += 1,
            Outcome::Timeout => s.timeouts += 1,
            Outcome::Error(code) => *s.errors.entry(code).or_insert(0) += 1,
        }
        let us = (latency.as_micros() as u64).clamp(stats::HIST_LOW_US, stats::HIST_HIGH_US);
        s.latency.saturating_record(us);
    }

    /// The seconds recorded so far.
    pub fn snapshot(&self) -> Vec<Second> {
        self.seconds
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// The figures of a span of seconds.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Window {
    pub ok: u64,
    pub timeouts: u64,
    pub errors: BTreeMap<String, u64>,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

impl Window {
    /// Seconds `from..to` (clamped to what was recorded).
    pub fn of(seconds: &[Second], from: usize, to: usize) -> Window {
        let to = to.min(seconds.len());
        let mut w = Window::default();
        let mut h = stats::new_shard_hist();
        for s in seconds.get(from..to).unwrap_or(&[]) {
            w.ok += s.ok;
            w.timeouts += s.timeouts;
            for (code, n) in &s.errors {
                *w.errors.entry(code.clone()).or_insert(0) += n;
            }
            // Same bounds and precision: adding cannot fail.
            let _ = h.add(&s.latency);
        }
        if !h.is_empty() {
            w.p50_ms = ms(h.value_at_quantile(0.50));
            w.p99_ms = ms(h.value_at_quantile(0.99));
            w.max_ms = ms(h.max());
        }
        w
    }

    pub fn error_count(&self) -> u64 {
        self.errors.values().sum()
    }

    /// `08006 x3, 57P01 x1`, or `none`.
    pub fn errors_text(&self) -> String {
        if self.errors.is_empty() {
            return "none".into();
        }
        let parts: Vec<String> = self
            .errors
            .iter()
            .map(|(code, n)| format!("{code} x{n}"))
            .collect();
        parts.join(", ")
    }
}

/// Seconds in a row that must be clean for the load to count as recovered.
pub const CLEAN_SECONDS: usize = 3;

/// Whether a second is clean: no error, no timeout, at least `min_ok` completed requests and a
/// p99 within `p99_limit_ms`.
pub fn is_clean(s: &Second, min_ok: u64, p99_limit_ms: f64) -> bool {
    s.error_count() == 0
        && s.timeouts == 0
        && s.ok >= min_ok
        && ms(s.latency.value_at_quantile(0.99)) <= p99_limit_ms
}

/// Seconds from `from` until the first of [`CLEAN_SECONDS`] clean seconds in a row, all before
/// `until`; `None` when there are none.
pub fn recovery(
    seconds: &[Second],
    from: usize,
    until: usize,
    min_ok: u64,
    p99_limit_ms: f64,
) -> Option<usize> {
    let until = until.min(seconds.len());
    let mut run = 0;
    for (i, s) in seconds.iter().enumerate().take(until).skip(from) {
        if is_clean(s, min_ok, p99_limit_ms) {
            run += 1;
            if run == CLEAN_SECONDS {
                return Some(i + 1 - CLEAN_SECONDS - from);
            }
        } else {
            run = 0;
        }
    }
    None
}

/// One line per second for a spreadsheet: `second,ok,errors,timeouts,p50_ms,p99_ms,max_ms,codes`.
pub fn csv(seconds: &[Second]) -> String {
    let mut out = String::from("second,ok,errors,timeouts,p50_ms,p99_ms,max_ms,error_codes\n");
    for (i, s) in seconds.iter().enumerate() {
        let w = Window::of(seconds, i, i + 1);
        let codes = if s.errors.is_empty() {
            String::new()
        } else {
            w.errors_text().replace(", ", " ")
        };
        out.push_str(&format!(
            "{i},{},{},{},{:.3},{:.3},{:.3},{codes}\n",
            s.ok,
            s.error_count(),
            s.timeouts,
            w.p50_ms,
            w.p99_ms,
            w.max_ms
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn second(ok: u64, errors: u64, latency_us: u64) -> Second {
        let mut s = Second::new();
        s.ok = ok;
        if errors > 0 {
            s.errors.insert("08006".into(), errors);
        }
        for _ in 0..ok.max(1) {
            s.latency.saturating_record(latency_us);
        }
        s
    }

    #[test]
    fn recovery_waits_for_clean_seconds_in_a_row() {
        let s = vec![
            second(100, 0, 500),
            second(10, 5, 900_000),
            second(100, 0, 500),
            second(100, 1, 500),
            second(100, 0, 500),
            second(100, 0, 500),
            second(100, 0, 500),
        ];
        assert_eq!(recovery(&s, 1, 7, 50, 10.0), Some(3));
        assert_eq!(recovery(&s, 0, 7, 50, 10.0), Some(4));
        // The clean run must end before `until` (the next fault).
        assert_eq!(recovery(&s, 1, 6, 50, 10.0), None);
        // Too few requests a second never counts as recovered.
        assert_eq!(recovery(&s, 1, 7, 200, 10.0), None);
        // A slow second breaks the run like an error does.
        assert_eq!(recovery(&s, 1, 7, 50, 0.1), None);
    }

    #[test]
    fn a_window_sums_its_seconds() {
        let s = vec![second(10, 2, 1000), second(20, 0, 3000), second(5, 1, 100)];
        let w = Window::of(&s, 0, 2);
        assert_eq!(w.ok, 30);
        assert_eq!(w.error_count(), 2);
        assert_eq!(w.errors_text(), "08006 x2");
        assert!(w.max_ms >= 2.9 && w.max_ms <= 3.1, "{}", w.max_ms);
        assert_eq!(Window::of(&s, 5, 9), Window::default());
    }

    #[test]
    fn csv_has_a_line_per_second() {
        let s = vec![second(10, 2, 1000), second(20, 0, 3000)];
        let text = csv(&s);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[1].starts_with("0,10,2,0,"), "{}", lines[1]);
        assert!(lines[1].ends_with("08006 x2"), "{}", lines[1]);
        assert!(lines[2].ends_with(','), "{}", lines[2]);
    }
}
