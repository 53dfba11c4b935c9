//! loadgen's own CPU use (user + system time of this process, from getrusage), so a report
//! can say what each query cost the client and whether the client was the bottleneck.

use std::time::Duration;

/// CPU time used by this process so far.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CpuTime {
    pub user: Duration,
    pub sys: Duration,
}

impl CpuTime {
    /// User + system time.
    pub fn total(&self) -> Duration {
        self.user + self.sys
    }

    /// The time used since `earlier`.
    pub fn since(&self, earlier: &CpuTime) -> CpuTime {
        CpuTime {
            user: self.user.saturating_sub(earlier.user),
            sys: self.sys.saturating_sub(earlier.sys),
        }
    }
}

/// CPU time of this process (all threads) so far; zero if the kernel refuses to say.
pub fn now() -> CpuTime {
    // SAFETY: getrusage writes into the zeroed struct we own and reads nothing else.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    if rc != 0 {
        return CpuTime::default();
    }
    let tv = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec.max(0) as u64) + Duration::from_micros(t.tv_usec.max(0) as u64)
    };
    CpuTime {
        user: tv(usage.ru_utime),
        sys: tv(usage.ru_stime),
    }
}

/// Cores this process may run on (its CPU affinity), at least 1.
pub fn cores_available() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Warnings when loadgen itself, not the target, limited the run: `cores_used` is CPU seconds
/// per wall second, `cores` what loadgen could use (its worker threads, at most the machine's
/// cores), `achieved`/`target` the rates (no target for closed loop).
pub fn bottleneck_warnings(
    cores_used: f64,
    cores: usize,
    achieved: f64,
    target: Option<f64>,
) -> Vec<String> {
    let mut out = Vec::new();
    let cores = cores.max(1) as f64;
    let share = cores_used / cores;
    let short = target.is_some_and(|t| t > 0.0 && achieved < 0.98 * t);
    if short && share >= 0.7 {
        out.push(format!(
            "loadgen is the bottleneck: it reached {:.0}% of its target rate while using {:.2} of {} cores ({:.0}%); add loadgen hosts (and merge their reports), raise --pipeline, or give it more --threads",
            100.0 * achieved / target.unwrap_or(1.0),
            cores_used,
            cores,
            100.0 * share
        ));
    } else if share >= 0.85 {
        out.push(format!(
            "loadgen used {:.2} of {} cores ({:.0}%): it may be limiting the result; add loadgen hosts or raise --pipeline",
            cores_used,
            cores,
            100.0 * share
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_grows_with_work() {
        let a = now();
        let mut x = 0u64;
        for i in 0..20_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        let b = now();
        assert!(b.since(&a).total() > Duration::ZERO);
    }

    #[test]
    fn warns_only_when_saturated() {
        assert!(bottleneck_warnings(0.2, 2, 1000.0, Some(1000.0)).is_empty());
        let w = bottleneck_warnings(1.9, 2, 500.0, Some(1000.0));
        assert!(w[0].contains("bottleneck"), "{w:?}");
        let w = bottleneck_warnings(1.9, 2, 5000.0, None);
        assert!(w[0].contains("may be limiting"), "{w:?}");
    }
}
