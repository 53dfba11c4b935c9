//! What `loadgen storm` reports: the figures of each phase (tallies by SQLSTATE or error
//! kind, latency percentiles, the server's CPU and memory), the summary printed on stdout,
//! the JSON of `--json`, and the verdict that sets the exit status.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

use super::server::ServerUse;
use crate::report::Latency;

/// Bumped when the JSON changes.
pub const FORMAT: u32 = 1;

/// How often something happened, and the first message seen for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Tally {
    pub count: u64,
    pub first_message: String,
}

/// Tallies by SQLSTATE or error kind.
pub type Tallies = BTreeMap<String, Tally>;

pub(crate) fn add(tallies: &mut Tallies, key: &str, message: &str) {
    tallies
        .entry(key.to_string())
        .and_modify(|t| t.count += 1)
        .or_insert_with(|| Tally {
            count: 1,
            first_message: message.to_string(),
        });
}

pub(crate) fn total(tallies: &Tallies) -> u64 {
    tallies.values().map(|t| t.count).sum()
}

/// A latency histogram's summary (µs, the one of `loadgen run`), or `None` when it is empty (no
/// latency rather than 0 ms).
pub fn latency(h: &Histogram<u64>) -> Option<Latency> {
    (!h.is_empty()).then(|| Latency::of(h))
}

/// p50/p99/max/mean of a summary, in ms.
fn latency_line(l: &Option<Latency>) -> String {
    let ms = |us: u64| us as f64 / 1000.0;
    match l {
        Some(l) => format!(
            "p50 {:.3} ms   p99 {:.3} ms   max {:.3} ms   mean {:.3} ms",
            ms(l.p50),
            ms(l.p99),
            ms(l.max),
            l.mean / 1000.0
        ),
        None => "-".to_string(),
    }
}

pub(crate) fn record(h: &mut Histogram<u64>, d: Duration) {
    h.saturating_record(u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1));
}

/// The login storm's figures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StormPhase {
    pub clients: usize,
    pub logged_in: u64,
    /// Refused by the server, by SQLSTATE.
    pub refused: Tallies,
    /// Other errors (no SQLSTATE: resets, closed connections, timeouts, TLS), by kind.
    pub other_errors: Tallies,
    /// `SELECT 1` failures after a successful login, by SQLSTATE or kind.
    pub query_errors: Tallies,
    /// From the barrier's release to the end of the last login (successful or not).
    pub seconds_to_last_login: f64,
    /// Successful logins per second over `seconds_to_last_login`.
    pub logins_per_second: f64,
    /// Successful logins: from when the client started connecting to when the login ended.
    pub login_latency: Option<Latency>,
    /// Failed logins: how long until they failed.
    pub failure_latency: Option<Latency>,
    /// loadgen's own CPU seconds over the phase (SCRAM costs the client a PBKDF2 per login).
    pub loadgen_cpu_s: f64,
    pub server: Option<ServerUse>,
}

impl StormPhase {
    /// Logins that did not succeed, or whose `SELECT 1` failed.
    pub fn failed(&self) -> u64 {
        total(&self.refused) + total(&self.other_errors) + total(&self.query_errors)
    }
}

/// The slowloris's figures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SlowlorisPhase {
    pub silent: usize,
    pub silent_from: Option<String>,
    pub duration_s: f64,
    /// Silent sockets connected before the bystander started, and how long that took.
    pub connected_at_start: usize,
    pub seconds_to_connect: f64,
    /// Times the server closed a silent socket (each was reopened at once).
    pub renewals: u64,
    /// What the server did when it closed them: `ErrorResponse SQLSTATE`, `closed` (no
    /// word) or the I/O error.
    pub closes: Tallies,
    /// How long the server held a silent socket before closing it.
    pub held: Option<Latency>,
    /// Connects of silent sockets that failed (each retried after 50 ms), by kind.
    pub connect_failures: Tallies,
    /// Silent sockets still open at the end.
    pub open_at_end: usize,
    pub bystander: Option<BystanderPhase>,
    pub server: Option<ServerUse>,
}

/// The bystander's figures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BystanderPhase {
    pub every_ms: f64,
    pub attempts: u64,
    pub ok: u64,
    /// Failed logins or `SELECT 1`s, by SQLSTATE or kind.
    pub failures: Tallies,
    pub login_latency: Option<Latency>,
}

/// What `loadgen storm` found.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StormReport {
    pub format: u32,
    /// The target, password hidden.
    pub target: String,
    pub tls: bool,
    pub timeout_s: f64,
    pub storm: Option<StormPhase>,
    pub slowloris: Option<SlowlorisPhase>,
    /// Every storm login and `SELECT 1` succeeded and the bystander never failed.
    pub passed: bool,
    pub verdict: String,
}

impl StormReport {
    /// Writes the report as JSON.
    pub fn write(&self, path: &Path) -> Result<(), crate::Error> {
        let text = serde_json::to_string_pretty(self)
            .map_err(|e| format!("cannot encode the report: {e}"))?;
        std::fs::write(path, text + "\n")
            .map_err(|e| format!("cannot write {}: {e}", path.display()))
    }

    /// The summary printed on stdout.
    pub fn render(&self) -> String {
        let mut out = format!(
            "loadgen storm: {}, {}, timeout {:.1} s\n",
            self.target,
            if self.tls { "TLS" } else { "plain TCP" },
            self.timeout_s
        );
        if let Some(s) = &self.storm {
            out += &render_storm(s);
        }
        if let Some(s) = &self.slowloris {
            out += &render_slowloris(s);
        }
        out += &format!("\n{}\n", self.verdict);
        out
    }
}

fn render_tallies(out: &mut String, label: &str, tallies: &Tallies) {
    let n = total(tallies);
    *out += &format!("  {label:<18}{n:>8}\n");
    for (key, t) in tallies {
        *out += &format!("  {:<18}{:>8}  {key}: {}\n", "", t.count, t.first_message);
    }
}

fn render_server(out: &mut String, s: &Option<ServerUse>) {
    let Some(s) = s else { return };
    let mib = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1} MiB"));
    *out += &format!(
        "  {:<18}pid {}: cpu {:.2} s (user {:.2} + sys {:.2})",
        "server", s.pid, s.cpu_s, s.cpu_user_s, s.cpu_sys_s
    );
    if let (Some(per), Some(rate)) = (s.cpu_us_per_login, s.logins_per_core_second) {
        *out += &format!(" = {per:.0} µs per login, {rate:.0} logins/s per core");
    }
    *out += &format!(
        "\n  {:<18}peak RSS {} (VmHWM: the process's lifetime peak), RSS at the end {}\n",
        "",
        mib(s.vm_hwm_mib),
        mib(s.vm_rss_mib)
    );
}

fn render_storm(s: &StormPhase) -> String {
    let mut out = format!("\nlogin storm: {} clients at once\n", s.clients);
    out += &format!("  {:<18}{:>8} of {}\n", "logged in", s.logged_in, s.clients);
    render_tallies(&mut out, "refused", &s.refused);
    render_tallies(&mut out, "other errors", &s.other_errors);
    render_tallies(&mut out, "SELECT 1 failed", &s.query_errors);
    out += &format!(
        "  {:<18}{:.3} s after the start   {:.1} logins/s\n",
        "last login ended", s.seconds_to_last_login, s.logins_per_second
    );
    out += &format!(
        "  {:<18}{}\n",
        "login latency",
        latency_line(&s.login_latency)
    );
    if s.failure_latency.is_some() {
        out += &format!(
            "  {:<18}{}\n",
            "failed after",
            latency_line(&s.failure_latency)
        );
    }
    out += &format!(
        "  {:<18}{:.2} s of CPU ({:.0} µs per client)\n",
        "loadgen",
        s.loadgen_cpu_s,
        s.loadgen_cpu_s * 1e6 / s.clients.max(1) as f64
    );
    render_server(&mut out, &s.server);
    out
}

fn render_slowloris(s: &SlowlorisPhase) -> String {
    let from = s
        .silent_from
        .as_ref()
        .map_or(String::new(), |f| format!(" from {f}"));
    let by = s
        .bystander
        .as_ref()
        .map_or(", no bystander".to_string(), |b| {
            format!(", a bystander logging in every {} ms", b.every_ms)
        });
    let mut out = if s.silent > 0 {
        format!(
            "\nslowloris: {} silent connections{from} for {:.1} s{by}\n",
            s.silent, s.duration_s
        )
    } else {
        format!("\nno silent connections, for {:.1} s{by}\n", s.duration_s)
    };
    if s.silent > 0 {
        out += &format!(
            "  {:<18}{:>8} of {} in {:.2} s (before the bystander started)\n",
            "silent connected", s.connected_at_start, s.silent, s.seconds_to_connect
        );
        out += &format!(
            "  {:<18}{:>8}   held for {}\n",
            "closed by server",
            s.renewals,
            latency_line(&s.held)
        );
        for (key, t) in &s.closes {
            out += &format!("  {:<18}{:>8}  {key}: {}\n", "", t.count, t.first_message);
        }
        render_tallies(&mut out, "connect failures", &s.connect_failures);
        out += &format!(
            "  {:<18}{:>8} of {}\n",
            "open at the end", s.open_at_end, s.silent
        );
    }
    if let Some(b) = &s.bystander {
        out += &format!(
            "  {:<18}{:>8} attempts, {} ok, {} failed\n",
            "bystander",
            b.attempts,
            b.ok,
            total(&b.failures)
        );
        for (key, t) in &b.failures {
            out += &format!("  {:<18}{:>8}  {key}: {}\n", "", t.count, t.first_message);
        }
        out += &format!(
            "  {:<18}{}\n",
            "login latency",
            latency_line(&b.login_latency)
        );
    }
    render_server(&mut out, &s.server);
    out
}

/// PASS or FAIL and why.
pub fn verdict(storm: Option<&StormPhase>, slow: Option<&SlowlorisPhase>) -> (bool, String) {
    let mut fails = Vec::new();
    let mut oks = Vec::new();
    if let Some(s) = storm {
        let failed = s.failed();
        if failed == 0 && s.logged_in as usize == s.clients {
            oks.push(format!("all {} storm logins succeeded", s.clients));
        } else {
            let mut why: Vec<String> = Vec::new();
            for (k, t) in s.refused.iter().chain(&s.other_errors) {
                why.push(format!("{k} x{}", t.count));
            }
            for (k, t) in &s.query_errors {
                why.push(format!("SELECT 1 {k} x{}", t.count));
            }
            fails.push(format!(
                "{} of {} storm logins failed ({})",
                s.clients as u64 - s.logged_in + total(&s.query_errors),
                s.clients,
                why.join(", ")
            ));
        }
    }
    if let Some(b) = slow.and_then(|s| s.bystander.as_ref()) {
        let failed = total(&b.failures);
        if failed == 0 && b.attempts > 0 {
            oks.push(format!(
                "the bystander logged in {} of {} times",
                b.ok, b.attempts
            ));
        } else if b.attempts == 0 {
            fails.push("the bystander made no attempt".to_string());
        } else {
            let why: Vec<String> = b
                .failures
                .iter()
                .map(|(k, t)| format!("{k} x{}", t.count))
                .collect();
            fails.push(format!(
                "the bystander failed {failed} of {} times ({})",
                b.attempts,
                why.join(", ")
            ));
        }
    }
    if fails.is_empty() {
        let what = if oks.is_empty() {
            "nothing to check".to_string()
        } else {
            oks.join("; ")
        };
        (true, format!("PASS (exit 0): {what}"))
    } else {
        (false, format!("FAIL (exit 1): {}", fails.join("; ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn phase(clients: usize, logged_in: u64) -> StormPhase {
        StormPhase {
            clients,
            logged_in,
            refused: Tallies::new(),
            other_errors: Tallies::new(),
            query_errors: Tallies::new(),
            seconds_to_last_login: 1.0,
            logins_per_second: logged_in as f64,
            login_latency: None,
            failure_latency: None,
            loadgen_cpu_s: 0.5,
            server: None,
        }
    }

    #[test]
    fn verdicts() {
        let good = phase(100, 100);
        let (ok, text) = verdict(Some(&good), None);
        assert!(ok, "{text}");
        assert!(
            text.starts_with("PASS") && text.contains("all 100"),
            "{text}"
        );

        let mut bad = phase(100, 60);
        for _ in 0..40 {
            add(&mut bad.refused, "53300", "FATAL 53300: sorry, too many");
        }
        let (ok, text) = verdict(Some(&bad), None);
        assert!(!ok);
        assert!(
            text.contains("40 of 100") && text.contains("53300 x40"),
            "{text}"
        );
        assert_eq!(bad.refused["53300"].count, 40);
        assert_eq!(
            bad.refused["53300"].first_message,
            "FATAL 53300: sorry, too many"
        );

        let mut by = BystanderPhase {
            every_ms: 200.0,
            attempts: 10,
            ok: 9,
            failures: Tallies::new(),
            login_latency: None,
        };
        add(
            &mut by.failures,
            "timeout",
            "login: no answer within 60.0 s",
        );
        let slow = SlowlorisPhase {
            silent: 5,
            silent_from: None,
            duration_s: 2.0,
            connected_at_start: 5,
            seconds_to_connect: 0.01,
            renewals: 0,
            closes: Tallies::new(),
            held: None,
            connect_failures: Tallies::new(),
            open_at_end: 5,
            bystander: Some(by),
            server: None,
        };
        let (ok, text) = verdict(Some(&good), Some(&slow));
        assert!(!ok);
        assert!(text.contains("bystander failed 1 of 10"), "{text}");
        let report = StormReport {
            format: FORMAT,
            target: "postgres://app:***@h/app".into(),
            tls: false,
            timeout_s: 60.0,
            storm: Some(bad),
            slowloris: Some(slow),
            passed: ok,
            verdict: text,
        };
        let shown = report.render();
        assert!(
            shown.contains("53300: FATAL 53300: sorry, too many"),
            "{shown}"
        );
        assert!(shown.contains("open at the end"), "{shown}");
        assert!(shown.contains("FAIL (exit 1)"), "{shown}");
        let json = serde_json::to_value(&report).expect("json");
        assert_eq!(json["storm"]["refused"]["53300"]["count"], 40);
    }

    #[test]
    fn latency_of_nothing_is_none() {
        assert_eq!(latency(&crate::stats::new_hist()), None);
        let mut h = crate::stats::new_hist();
        record(&mut h, Duration::from_millis(3));
        record(&mut h, Duration::ZERO);
        let l = latency(&h).expect("two");
        assert_eq!(l.count, 2);
        assert!(l.max.abs_diff(3000) < 10, "{l:?}");
    }
}
