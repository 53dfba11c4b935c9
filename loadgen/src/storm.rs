//! `loadgen storm`: how a Postgres-protocol server (the router, Postgres, PgBouncer) copes with
//! logins rather than queries, in two phases, each optional:
//!
//! - **Login storm** (`--logins N`): N clients wait on one barrier and then all log in at the
//!   same moment, as after a fleet restart; each runs `SELECT 1` and keeps its connection until
//!   every one has finished, so the server ends up holding N logged-in clients. Counted: logged
//!   in, refused by SQLSTATE, other errors by kind, the time until the last login ended, login
//!   latency and, with `--router-pid`, the server's CPU per login and its peak memory.
//! - **Slowloris** (`--silent M`): M raw TCP connections that never send a startup message,
//!   each reopened as soon as the server closes it, for `--duration-s`, while a bystander logs
//!   in every `--bystander-every-ms` on a fresh connection. Counted: how often the server
//!   closed a silent socket (and what it said), how many were still open at the end, and the
//!   bystander's failures and login latency.
//!
//! The storm runs first, then the slowloris. The verdict (exit status 0 or 1) is whether every
//! storm login (and its `SELECT 1`) succeeded and the bystander never failed.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use tokio::io::AsyncReadExt;
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::{watch, Barrier};
use tokio_postgres::config::{Host, SslMode};
use tokio_postgres::{Client, Config, NoTls};

use crate::tls::{Rustls, TlsError};

mod report;
mod server;
mod slowloris;

pub use report::{
    latency, verdict, BystanderPhase, SlowlorisPhase, StormPhase, StormReport, Tallies, Tally,
    FORMAT,
};
pub use server::{check_nofile, parse_stat_ticks, parse_status_kib, raise_nofile, ServerUse};

use report::{add, record};
use server::{server_ticks, server_use};
use slowloris::slowloris_phase;
pub use slowloris::{describe_close, error_response, ServerError};

/// How long the bystander waits for the silent sockets to connect before it starts anyway.
pub const SILENT_CONNECT_WAIT: Duration = Duration::from_secs(5);

/// Pause before a silent socket that could not connect tries again (so a server that is down
/// does not turn the slowloris into a busy loop; one that closes a socket gets it back at once).
const SILENT_RETRY_PAUSE: Duration = Duration::from_millis(50);

/// File descriptors kept free besides the connections (runtime, stdio, the bystander).
pub const SPARE_FILES: u64 = 100;

/// What `loadgen storm` does.
#[derive(Debug, Clone)]
pub struct StormConfig {
    /// `postgres://user:pw@host:port/db` (tokio-postgres URL or key=value string).
    pub target: String,
    /// Clients of the login storm (0: no storm).
    pub logins: usize,
    /// Silent sockets of the slowloris (0: none).
    pub silent: usize,
    /// Source address the silent sockets are bound to.
    pub silent_from: Option<IpAddr>,
    /// The bystander's period (None: no bystander).
    pub bystander_every: Option<Duration>,
    /// How long the slowloris (and the bystander) lasts.
    pub duration: Duration,
    /// Log in with TLS, trusting this CA.
    pub tls_ca: Option<PathBuf>,
    /// The server's process, for its CPU time and memory.
    pub server_pid: Option<u32>,
    /// Per login (and per `SELECT 1`), and per silent connect.
    pub timeout: Duration,
    /// No progress lines on stderr.
    pub quiet: bool,
}

impl StormConfig {
    /// Whether there is a slowloris phase (silent sockets or a bystander).
    pub fn slowloris(&self) -> bool {
        self.silent > 0 || self.bystander_every.is_some()
    }
}

/// Why a login or a statement failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The SQLSTATE when the server said one, else the kind of error (`timeout`, `error
    /// communicating with the server (connection reset)`, ...).
    pub key: String,
    /// The whole message.
    pub message: String,
    /// Whether the server refused with an ErrorResponse (`key` is then its SQLSTATE).
    pub refused: bool,
}

impl Failure {
    /// From tokio-postgres's error: the server's SQLSTATE and message, or the client-side kind
    /// with the I/O error kind under it.
    pub fn from_pg(e: &tokio_postgres::Error) -> Failure {
        if let Some(db) = e.as_db_error() {
            return Failure {
                key: db.code().code().to_string(),
                message: format!("{} {}: {}", db.severity(), db.code().code(), db.message()),
                refused: true,
            };
        }
        let mut message = e.to_string();
        let mut io_kind = None;
        let mut source = std::error::Error::source(e);
        while let Some(s) = source {
            message.push_str(": ");
            message.push_str(&s.to_string());
            if io_kind.is_none() {
                io_kind = s.downcast_ref::<io::Error>().map(io::Error::kind);
            }
            source = s.source();
        }
        let key = match io_kind {
            Some(k) => format!("{e} ({k})"),
            None => e.to_string(),
        };
        Failure {
            key,
            message,
            refused: false,
        }
    }

    /// From asking for TLS: a refusal at the door keeps its SQLSTATE.
    pub fn from_tls(e: &TlsError) -> Failure {
        let (key, refused) = match e {
            TlsError::Refused(r) => (r.code.clone(), true),
            TlsError::NotOffered => ("server does not support TLS".to_string(), false),
            TlsError::Unexpected(_) => ("unexpected answer to the SSLRequest".to_string(), false),
            TlsError::Io(stage, io) => (format!("{stage} ({})", io.kind()), false),
        };
        Failure {
            key,
            message: e.to_string(),
            refused,
        }
    }

    /// Nothing within `timeout`.
    pub fn timeout(what: &str, timeout: Duration) -> Failure {
        Failure {
            key: "timeout".to_string(),
            message: format!("{what}: no answer within {:.1} s", timeout.as_secs_f64()),
            refused: false,
        }
    }
}

/// `url` with its password hidden, also when it is not a valid URL (a bad port, say) or is a
/// key=value string.
pub fn hide_password(url: &str) -> String {
    let shown = crate::target::redact(url);
    if shown != url.trim() {
        return shown;
    }
    if let Some((scheme, rest)) = url.split_once("://") {
        if let (Some(at), Some(colon)) = (rest.rfind('@'), rest.find(':')) {
            if colon < at {
                return format!("{scheme}://{}:***{}", &rest[..colon], &rest[at..]);
            }
        }
        return url.to_string();
    }
    url.split_whitespace()
        .map(|kv| match kv.split_once('=') {
            Some(("password", _)) => "password=***".to_string(),
            _ => kv.to_string(),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The connection settings of `--target` (`tls`: whether `--tls-ca` is given).
pub fn parse_target(url: &str, tls: bool) -> Result<Config, crate::Error> {
    let mut config: Config = url.parse().map_err(|e| {
        format!(
            "--target {}: {e}; write postgres://USER:PASSWORD@HOST:PORT/DB",
            hide_password(url)
        )
    })?;
    if config.get_hosts().is_empty() {
        return Err(format!("--target {}: names no host", hide_password(url)));
    }
    if config.get_application_name().is_none() {
        config.application_name("loadgen storm");
    }
    if !tls && config.get_ssl_mode() == SslMode::Require {
        return Err("--target asks for sslmode=require: give --tls-ca FILE (the CA that signed the server's certificate)".into());
    }
    // With --tls-ca loadgen asks for TLS itself (crate::tls) and hands tokio-postgres the
    // encrypted stream; without it, plain TCP.
    config.ssl_mode(SslMode::Disable);
    Ok(config)
}

/// The target's first host and its first TCP address (for TLS and the silent sockets).
async fn tcp_address(config: &Config) -> Result<(String, SocketAddr), crate::Error> {
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let host = match config.get_hosts().first() {
        Some(Host::Tcp(h)) => h.clone(),
        _ => {
            return Err(
                "--tls-ca and --silent need a TCP host in --target (not a Unix socket)".into(),
            )
        }
    };
    let first = tokio::net::lookup_host((host.as_str(), port))
        .await
        .map_err(|e| format!("cannot resolve {host}: {e}"))?
        .next();
    match first {
        Some(addr) => Ok((host, addr)),
        None => Err(format!("{host} has no address")),
    }
}

/// Where and how to log in.
#[derive(Clone)]
struct Dialer {
    /// tokio-postgres's settings (always `sslmode=disable`: TLS is done here).
    config: Arc<Config>,
    /// With `--tls-ca`: the TLS settings, the server's address and the name its certificate
    /// must carry (the host of the URL).
    tls: Option<(Rustls, SocketAddr, String)>,
}

impl Dialer {
    /// Logs in (at most `timeout`, TCP, TLS and authentication included) and spawns the
    /// connection.
    async fn login(&self, timeout: Duration) -> Result<Client, Failure> {
        let connect = async {
            match &self.tls {
                None => {
                    let (client, connection) = self
                        .config
                        .connect(NoTls)
                        .await
                        .map_err(|e| Failure::from_pg(&e))?;
                    tokio::spawn(async move {
                        let _ = connection.await;
                    });
                    Ok(client)
                }
                Some((tls, addr, host)) => {
                    let stream = tls
                        .connect(*addr, host)
                        .await
                        .map_err(|e| Failure::from_tls(&e))?;
                    let (client, connection) = self
                        .config
                        .connect_raw(stream, NoTls)
                        .await
                        .map_err(|e| Failure::from_pg(&e))?;
                    tokio::spawn(async move {
                        let _ = connection.await;
                    });
                    Ok(client)
                }
            }
        };
        match tokio::time::timeout(timeout, connect).await {
            Ok(r) => r,
            Err(_) => Err(Failure::timeout("login", timeout)),
        }
    }
}

/// `SELECT 1` on a logged-in client.
async fn select_one(client: &Client, timeout: Duration) -> Result<(), Failure> {
    match tokio::time::timeout(timeout, client.simple_query("SELECT 1")).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(Failure::from_pg(&e)),
        Err(_) => Err(Failure::timeout("SELECT 1", timeout)),
    }
}

/// Prints `line()` on stderr once a second until the returned handle is aborted.
fn ticker<F>(quiet: bool, line: F) -> Option<tokio::task::JoinHandle<()>>
where
    F: Fn() -> String + Send + 'static,
{
    if quiet {
        return None;
    }
    Some(tokio::spawn(async move {
        let mut second = 0u64;
        let mut every = tokio::time::interval(Duration::from_secs(1));
        every.tick().await;
        loop {
            every.tick().await;
            second += 1;
            eprintln!("[{second:>4}s] {}", line());
        }
    }))
}

/// One storm client's result.
struct StormLogin {
    began: Instant,
    ended: Instant,
    client: Result<Client, Failure>,
    query: Option<Failure>,
}

/// The login storm.
async fn storm_phase(cfg: &StormConfig, dialer: &Dialer) -> Result<StormPhase, crate::Error> {
    let n = cfg.logins;
    let barrier = Arc::new(Barrier::new(n + 1));
    let ok = Arc::new(AtomicUsize::new(0));
    let refused = Arc::new(AtomicUsize::new(0));
    let other = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::with_capacity(n);
    for _ in 0..n {
        let (barrier, dialer) = (barrier.clone(), dialer.clone());
        let (ok, refused, other) = (ok.clone(), refused.clone(), other.clone());
        let timeout = cfg.timeout;
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let began = Instant::now();
            let client = dialer.login(timeout).await;
            let ended = Instant::now();
            let counter = match &client {
                Ok(_) => &ok,
                Err(f) if f.refused => &refused,
                Err(_) => &other,
            };
            counter.fetch_add(1, Ordering::Relaxed);
            let query = match &client {
                Ok(c) => select_one(c, timeout).await.err(),
                Err(_) => None,
            };
            StormLogin {
                began,
                ended,
                client,
                query,
            }
        }));
    }
    let server_before = cfg.server_pid.map(server_ticks).transpose()?;
    let cpu_before = crate::cpu::now();
    if !cfg.quiet {
        eprintln!("loadgen storm: {n} clients log in at once ...");
    }
    barrier.wait().await;
    let start = Instant::now();
    let progress = {
        let (ok, refused, other) = (ok.clone(), refused.clone(), other.clone());
        ticker(cfg.quiet, move || {
            let (o, r, e) = (
                ok.load(Ordering::Relaxed),
                refused.load(Ordering::Relaxed),
                other.load(Ordering::Relaxed),
            );
            format!(
                "logged in {o}  refused {r}  other errors {e}  still logging in {}",
                n.saturating_sub(o + r + e)
            )
        })
    };
    let mut results = Vec::with_capacity(n);
    for t in tasks {
        results.push(t.await.map_err(|e| format!("a storm client failed: {e}"))?);
    }
    if let Some(p) = progress {
        p.abort();
    }
    let cpu = crate::cpu::now().since(&cpu_before).total().as_secs_f64();
    let mut phase = StormPhase {
        clients: n,
        logged_in: 0,
        refused: Tallies::new(),
        other_errors: Tallies::new(),
        query_errors: Tallies::new(),
        seconds_to_last_login: 0.0,
        logins_per_second: 0.0,
        login_latency: None,
        failure_latency: None,
        loadgen_cpu_s: cpu,
        server: None,
    };
    let (mut ok_hist, mut failed_hist) = (crate::stats::new_hist(), crate::stats::new_hist());
    let mut last = start;
    for r in &results {
        last = last.max(r.ended);
        let took = r.ended.saturating_duration_since(r.began);
        match &r.client {
            Ok(_) => {
                phase.logged_in += 1;
                record(&mut ok_hist, took);
            }
            Err(f) => {
                let into = if f.refused {
                    &mut phase.refused
                } else {
                    &mut phase.other_errors
                };
                add(into, &f.key, &f.message);
                record(&mut failed_hist, took);
            }
        }
        if let Some(f) = &r.query {
            add(&mut phase.query_errors, &f.key, &f.message);
        }
    }
    let span = last.saturating_duration_since(start).as_secs_f64();
    phase.seconds_to_last_login = span;
    phase.logins_per_second = if span > 0.0 {
        phase.logged_in as f64 / span
    } else {
        0.0
    };
    phase.login_latency = latency(&ok_hist);
    phase.failure_latency = latency(&failed_hist);
    // Measured while the storm's clients are still logged in.
    phase.server = match (cfg.server_pid, server_before) {
        (Some(pid), Some(before)) => Some(server_use(pid, before, Some(phase.logged_in))?),
        _ => None,
    };
    drop(results);
    Ok(phase)
}

/// Runs the storm, then the slowloris, as `cfg` asks.
pub async fn storm(cfg: &StormConfig) -> Result<StormReport, crate::Error> {
    let mut config = parse_target(&cfg.target, cfg.tls_ca.is_some())?;
    let tls = cfg.tls_ca.as_deref().map(Rustls::trusting).transpose()?;
    if let Some(pid) = cfg.server_pid {
        server_ticks(pid)?;
    }
    // One TCP host is resolved once here, not by each of thousands of clients (TLS and the
    // silent sockets need its address anyway); several hosts or a Unix socket are left to
    // tokio-postgres.
    let one_tcp_host = matches!(config.get_hosts(), [Host::Tcp(_)]);
    let address = if one_tcp_host || tls.is_some() || cfg.silent > 0 {
        Some(tcp_address(&config).await?)
    } else {
        None
    };
    if let Some((_, addr)) = &address {
        if one_tcp_host && config.get_hostaddrs().is_empty() {
            config.hostaddr(addr.ip());
        }
    }
    let dialer = Dialer {
        config: Arc::new(config),
        tls: match (tls, &address) {
            (Some(tls), Some((host, addr))) => Some((tls, *addr, host.clone())),
            _ => None,
        },
    };
    let storm = if cfg.logins > 0 {
        Some(storm_phase(cfg, &dialer).await?)
    } else {
        None
    };
    let slowloris = if cfg.slowloris() {
        if storm.is_some() {
            // Let the storm's connections close before the next phase.
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        Some(slowloris_phase(cfg, &dialer, address.map(|(_, a)| a)).await?)
    } else {
        None
    };
    let (passed, verdict) = verdict(storm.as_ref(), slowloris.as_ref());
    Ok(StormReport {
        format: FORMAT,
        target: hide_password(&cfg.target),
        tls: cfg.tls_ca.is_some(),
        timeout_s: cfg.timeout.as_secs_f64(),
        storm,
        slowloris,
        passed,
        verdict,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_responses_of_a_closing_server() {
        let mut msg = vec![b'E'];
        let body = b"SFATAL\0VFATAL\0C08P01\0Mtimeout expired\0\0";
        msg.extend_from_slice(&(4 + body.len() as u32).to_be_bytes());
        msg.extend_from_slice(body);
        assert_eq!(
            error_response(&msg),
            Some(ServerError {
                severity: "FATAL".to_string(),
                code: "08P01".to_string(),
                message: "timeout expired".to_string()
            })
        );
        let (key, message) = describe_close(&msg, None);
        assert_eq!(key, "ErrorResponse 08P01, then closed");
        assert_eq!(message, "FATAL 08P01: timeout expired");
        assert_eq!(describe_close(&[], None).0, "closed");
        let reset = io::Error::from(io::ErrorKind::ConnectionReset);
        assert_eq!(describe_close(&[], Some(&reset)).0, "connection reset");
        assert!(describe_close(b"N", None).0.starts_with("other bytes"));
        assert_eq!(error_response(b"E\0\0"), None);
    }

    #[test]
    fn targets_and_tls() {
        let c = parse_target("postgres://app:pw@127.0.0.1:6432/app", false).expect("url");
        assert_eq!(c.get_ssl_mode(), SslMode::Disable);
        assert_eq!(c.get_application_name(), Some("loadgen storm"));
        let c = parse_target("postgres://app:pw@localhost:6432/app?sslmode=require", true)
            .expect("url");
        assert_eq!(c.get_ssl_mode(), SslMode::Disable);
        let err =
            parse_target("postgres://app:pw@h/app?sslmode=require", false).expect_err("no CA");
        assert!(err.contains("--tls-ca"), "{err}");
        let err = parse_target("postgres://app:secret@h:x/app", false).expect_err("bad port");
        assert!(!err.contains("secret"), "{err}");
        assert_eq!(
            hide_password("postgres://app:secret@h:x/app"),
            "postgres://app:***@h:x/app"
        );
        assert_eq!(
            hide_password("host=h password=secret user=app"),
            "host=h password=*** user=app"
        );
        assert_eq!(
            hide_password("postgres://app:secret@h:5432/app"),
            "postgres://app:***@h:5432/app"
        );
    }
}
