//! The live progress line printed on stderr once a second during a run.

use crate::stats::Tally;

/// `[  12s] 29987.0 qps (target 30000)  p50 0.412 ms  p99 1.204 ms  errors 0  timeouts 0  cpu 41%`
///
/// `elapsed` counts from the start of the measured window (negative during warmup).
pub fn line(
    elapsed: f64,
    second: &Tally,
    seconds: f64,
    target: Option<f64>,
    cpu_share: f64,
) -> String {
    let s = seconds.max(1e-9);
    let qps = second.counts.ok as f64 / s;
    let q = |p: f64| {
        if second.hist.is_empty() {
            0.0
        } else {
            second.hist.value_at_quantile(p) as f64 / 1000.0
        }
    };
    let when = if elapsed <= 0.0 {
        " warmup".to_string()
    } else {
        format!("{elapsed:>5.0}s")
    };
    let target = match target {
        Some(t) => format!(" (target {t:.0})"),
        None => " (closed loop)".to_string(),
    };
    format!(
        "[{when}] {qps:.1} qps{target}  p50 {:.3} ms  p99 {:.3} ms  errors {}  timeouts {}  cpu {:.0}%",
        q(0.5),
        q(0.99),
        second.counts.errors,
        second.counts.timeouts,
        cpu_share * 100.0
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shows_rate_latency_and_failures() {
        let mut s = Tally::default();
        s.hist.record(400).expect("record");
        s.counts.ok = 300;
        s.counts.errors = 2;
        let l = line(3.0, &s, 1.0, Some(300.0), 0.05);
        assert!(l.contains("300.0 qps (target 300)"), "{l}");
        assert!(
            l.contains("p50 0.400 ms") && l.contains("errors 2") && l.contains("cpu 5%"),
            "{l}"
        );
        assert!(line(-1.0, &s, 1.0, None, 0.0).starts_with("[ warmup]"));
    }
}
