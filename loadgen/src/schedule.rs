//! When each request is meant to be sent (open loop).
//!
//! Request `i` of a connection is due at `start + phase + i / rate`, whatever happened to the
//! requests before it. Latency is measured from this intended time, not from when the request
//! actually left, so a server that stalls shows up as latency for every request it held up
//! (coordinated-omission correction) instead of as a quietly lower rate.

use std::time::{Duration, Instant};

/// The intended send times of one connection's requests.
#[derive(Debug, Clone)]
pub struct Schedule {
    start: Instant,
    phase_ns: f64,
    period_ns: f64,
    next: u64,
}

impl Schedule {
    /// `rate` requests a second from `start + phase`.
    pub fn new(start: Instant, rate: f64, phase: Duration) -> Schedule {
        Schedule {
            start,
            phase_ns: phase.as_nanos() as f64,
            period_ns: 1e9 / rate.max(1e-9),
            next: 0,
        }
    }

    /// The intended time of request `i`.
    pub fn at(&self, i: u64) -> Instant {
        let ns = self.phase_ns + i as f64 * self.period_ns;
        self.start + Duration::from_nanos(ns.min(1e18) as u64)
    }

    /// The intended time of the next request not yet taken.
    pub fn peek(&self) -> Instant {
        self.at(self.next)
    }

    /// Takes the next request's intended time.
    pub fn take(&mut self) -> Instant {
        let t = self.peek();
        self.next += 1;
        t
    }

    /// Requests due in `[from, end)` that were never taken.
    pub fn left_between(&self, from: Instant, end: Instant) -> u64 {
        let due_before = |t: Instant| {
            let span = t.saturating_duration_since(self.start).as_nanos() as f64 - self.phase_ns;
            if span <= 0.0 {
                0
            } else {
                (span / self.period_ns).ceil() as u64
            }
        };
        due_before(end).saturating_sub(self.next.max(due_before(from)))
    }
}

/// Open-loop rates and phases of `n` connections sharing `rate` requests a second: each gets
/// `rate / n`, and their phases interleave so requests are evenly spread in time.
pub fn split(rate: f64, n: usize) -> Vec<(f64, Duration)> {
    let n = n.max(1);
    (0..n)
        .map(|i| {
            (
                rate / n as f64,
                Duration::from_secs_f64(i as f64 / rate.max(1e-9)),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intended_times_do_not_drift() {
        let t0 = Instant::now();
        let mut s = Schedule::new(t0, 3.0, Duration::ZERO);
        let times: Vec<Duration> = (0..4).map(|_| s.take() - t0).collect();
        assert_eq!(times[3], Duration::from_secs(1));
        assert!(times[1] > Duration::from_millis(333) && times[1] < Duration::from_millis(334));
        assert_eq!(s.at(3000) - t0, Duration::from_secs(1000));
    }

    #[test]
    fn counts_what_was_left_unsent() {
        let t0 = Instant::now();
        let mut s = Schedule::new(t0, 10.0, Duration::ZERO);
        for _ in 0..5 {
            s.take();
        }
        // Due before 1 s: requests 0..=9; 5 taken.
        let second = t0 + Duration::from_secs(1);
        assert_eq!(s.left_between(t0, second), 5);
        // Of those due from 0.7 s (7, 8, 9), none was taken.
        assert_eq!(s.left_between(t0 + Duration::from_millis(700), second), 3);
        assert_eq!(s.left_between(second, second), 0);
    }

    #[test]
    fn connections_share_and_interleave() {
        let parts = split(100.0, 4);
        assert_eq!(parts.len(), 4);
        assert!(parts.iter().all(|(r, _)| (*r - 25.0).abs() < 1e-9));
        assert_eq!(parts[2].1, Duration::from_millis(20));
    }
}
