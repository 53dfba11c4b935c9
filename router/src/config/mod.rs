//! `router.toml`: where the router listens, which shard map it serves, who may log in, and
//! how it logs in to the shards, sizes its pools and limits its clients.
//!
//! Loading is a pure function of the file (so that a later reload can swap a whole [`Config`]
//! at once): [`load`] reads it, [`parse`] checks it part by part ([`sections`], on the file
//! form of [`raw`], with the shared checks of [`check`]) and returns either a ready-to-use
//! [`Config`] (typed values, paths resolved, plain passwords already turned into SCRAM
//! verifiers) or a [`ConfigError`] that lists every problem as `FILE:LINE: sentence`, in the
//! same style as shard map errors, so an operator fixes a file in one pass. The field docs
//! below are the reference that `docs/configuration.md` follows.

mod check;
mod raw;
mod sections;

#[cfg(test)]
mod tests;

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use shardmap::Problem;

use crate::auth::Secret;
use check::Checker;
use raw::RawConfig;

/// `listen` when the file does not set it: local connections only, PgBouncer's port.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:6432";

/// A checked `router.toml`.
#[derive(Debug, Clone)]
pub struct Config {
    /// The file this was loaded from, for reloads and messages.
    pub source: PathBuf,
    /// `listen`: the address clients connect to. Default `127.0.0.1:6432`.
    pub listen: SocketAddr,
    /// `shardmap`: the shard map file, resolved against the config file's directory when
    /// relative. Required.
    pub shardmap: PathBuf,
    /// `database`: the logical database name clients connect to (the `dbname` of their
    /// connection string); the shards' own database names come from the shard map. Required.
    pub database: String,
    /// `auth`: how clients prove who they are. Default `scram-sha-256`.
    pub auth: AuthMethod,
    /// `[[users]]`: who may log in, each with a SCRAM verifier (plain passwords in the file
    /// are turned into verifiers at load). At least one is required with `scram-sha-256`.
    pub users: Vec<User>,
    /// `[backend]`: how the router logs in to the shards.
    pub backend: Backend,
    /// `[pool]`: connection pools to the shards.
    pub pool: Pool,
    /// `[limits]`: limits and thresholds on clients and statements.
    pub limits: Limits,
    /// `[shutdown]`: how the router drains on SIGTERM.
    pub shutdown: Shutdown,
    /// `[reload]`: whether the router watches its files.
    pub reload: Reload,
    /// `[failover]`: how statements for a shard that cannot be reached are held.
    pub failover: Failover,
    /// `[transactions]`: transactions that touch several shards.
    pub transactions: Transactions,
    /// `[http] listen`: the address of the HTTP side port (`/metrics`, `/health`, `/ready`).
    /// Off when absent.
    pub http: Option<SocketAddr>,
    /// `[tls]`: TLS between clients and the router.
    pub tls: Tls,
    /// `router_id`: this router's number in its fleet, 0 to 127 (default 0). It is part of the
    /// BackendKeyData every client gets, so a cancel request that reaches another router of
    /// the fleet can be forwarded here.
    pub router_id: u8,
    /// `[[peers]]`: the other routers of the fleet, by id, with the address they listen on.
    pub peers: Vec<Peer>,
    /// `reuse_port`: let another process listen on `listen` too (SO_REUSEPORT; the kernel then
    /// spreads new clients over both). Default false: the router refuses to start when the
    /// address is taken, because a forgotten second router would silently get half the logins.
    /// Only read at start.
    pub reuse_port: bool,
    /// `[log] format`: how log lines are written. Read at start only.
    pub log_format: LogFormat,
    /// `[hints] allow = "admins"`: only users with `admin = true` may pin a statement to a
    /// shard by hand (`/* shard: .. */`, `/* sharding_key: .. */`, `SET shardgate.shard`,
    /// `SET shardgate.sharding_key`); others get `42501`. Default `"everyone"`.
    pub hints_for_admins_only: bool,
}

/// One `[[peers]]` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    pub id: u8,
    pub address: SocketAddr,
}

/// Highest router id: ids live in the top 7 bits of the (positive) BackendKeyData process id.
pub const MAX_ROUTER_ID: i64 = 127;

impl Config {
    /// The `[[users]]` entry named `name` (the user of a client's startup message).
    pub fn user(&self, name: &str) -> Option<&User> {
        // Users are few; a scan per login is cheaper than keeping an index in sync.
        self.users.iter().find(|u| u.name == name)
    }
}

/// `auth`: how clients authenticate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthMethod {
    /// `"scram-sha-256"`: a password checked with SCRAM-SHA-256, as Postgres does.
    ScramSha256,
    /// `"trust"`: anyone who can reach `listen` gets in as any user. Never the default.
    Trust,
}

/// One `[[users]]` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    /// `name`: the user name clients log in as.
    pub name: String,
    /// `password`: a plain password or a Postgres `SCRAM-SHA-256$...` verifier (as in
    /// `pg_authid`); after loading always [`Secret::Scram`].
    pub secret: Secret,
    /// `admin`: may also log in to the admin console (the database `shardgate`). Default
    /// false.
    pub admin: bool,
}

/// `[backend]`: the credentials and session settings of the router's connections to shards.
#[derive(Clone, PartialEq, Eq)]
pub struct Backend {
    /// `user`: the Postgres user, for shards whose primary URL names none. Default `postgres`.
    pub user: String,
    /// `password`: the plain password, for shards whose primary URL gives none. Default none
    /// (for `trust` or peer setups). A SCRAM verifier cannot be used to log in.
    pub password: Option<String>,
    /// `application_name`: shown in `pg_stat_activity` on the shards. Default `shardgate`.
    pub application_name: String,
    /// `sslmode`: TLS toward the shards. Default `disable`.
    pub sslmode: SslMode,
    /// `ca`: PEM file of the certificate authorities the shards' certificates must chain to.
    /// Required with `sslmode = "verify-full"`, and only used there.
    pub ca: Option<FileSetting>,
}

/// `[backend] sslmode`: whether and how the router encrypts its connections to the shards, with
/// the meaning libpq gives these names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    /// `"disable"`: plain TCP.
    Disable,
    /// `"require"`: TLS, without checking the server's certificate (protects against
    /// eavesdropping, not against an impostor). A server that refuses TLS is not used.
    Require,
    /// `"verify-full"`: TLS, the certificate must chain to `ca` and name the shard's host (an IP
    /// address host must be an IP address in the certificate).
    VerifyFull,
}

impl SslMode {
    /// The name as written in the config (and as libpq spells it).
    pub fn name(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Require => "require",
            SslMode::VerifyFull => "verify-full",
        }
    }
}

/// `[tls]`: TLS between clients and the router. The files are read when the router starts and
/// again at every reload (see `crate::tls`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tls {
    /// `mode`: default `disable`.
    pub mode: TlsMode,
    /// `cert`: PEM file with the router's certificate, then any intermediates. Required unless
    /// `mode = "disable"`.
    pub cert: Option<FileSetting>,
    /// `key`: PEM file with the certificate's private key (PKCS#8, PKCS#1 or SEC1). Required
    /// unless `mode = "disable"`.
    pub key: Option<FileSetting>,
}

/// `[tls] mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsMode {
    /// `"disable"`: an SSLRequest is answered `N`; clients log in over plain TCP.
    Disable,
    /// `"allow"`: TLS for clients that ask for it (libpq's default `sslmode=prefer` does),
    /// plain TCP for the others.
    Allow,
    /// `"require"`: a client that logs in without TLS is refused with `28000`. Cancel requests
    /// are still accepted in plain TCP (libpq sends them that way).
    Require,
}

impl TlsMode {
    /// The name as written in the config.
    pub fn name(self) -> &'static str {
        match self {
            TlsMode::Disable => "disable",
            TlsMode::Allow => "allow",
            TlsMode::Require => "require",
        }
    }
}

/// A file named in the config, resolved against the config file's directory, with the line of
/// its setting: files are read after the config is checked (and again at each reload), and a
/// problem with one is reported at that line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileSetting {
    pub path: PathBuf,
    pub line: usize,
}

// Config is logged with `{:?}`: never print the backend password.
impl fmt::Debug for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Backend")
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("application_name", &self.application_name)
            .field("sslmode", &self.sslmode)
            .field("ca", &self.ca)
            .finish()
    }
}

/// `[pool]`: one pool per (host, port, database) of the shard map's primaries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pool {
    /// `max_size`: most connections per pool. Default 20; at least 1.
    pub max_size: usize,
    /// `min_idle`: idle connections each pool keeps open. Default 0; at most `max_size`.
    pub min_idle: usize,
    /// `connect_timeout_ms`: how long opening a backend connection (TCP and login) may take.
    /// Default 2000; more than 0.
    pub connect_timeout: Duration,
    /// `checkout_timeout_ms`: how long a statement waits for a free connection before the
    /// client gets `53300`. Default 5000; more than 0.
    pub checkout_timeout: Duration,
    /// `idle_timeout_ms`: idle connections above `min_idle` are closed after this long.
    /// Default 600000 (10 minutes); 0 = never.
    pub idle_timeout: Option<Duration>,
    /// `pause_timeout_ms`: how long a statement waits for a shard the admin console paused
    /// (`PAUSE`) before the client gets `57P03`. Default 60000; more than 0.
    pub pause_timeout: Duration,
    /// `warm_connections`: pooled connections each worker opens to every primary at start, and
    /// to the primaries a reload brings before the reload takes effect. Default 0 with sharing
    /// (`shared_connections` above 0: the shared connections are warmed instead), 1 without;
    /// 0 = open them on demand; at most `max_size`.
    pub warm_connections: usize,
    /// `warm_timeout_ms`: how long the start's readiness and a reload wait for the warming.
    /// Default 10000; more than 0.
    pub warm_timeout: Duration,
    /// `shared_connections`: connections per router and primary on which the autocommit
    /// statements of all clients are pipelined (`backend::mux`). Default 2; 0 = off: every
    /// statement borrows a pooled connection of its own.
    pub shared_connections: usize,
}

/// `[limits]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// `max_clients`: client connections beyond this are refused with `53300`. Default 10000;
    /// at least 1.
    pub max_clients: usize,
    /// `statement_timeout_ms`: a statement on one shard running longer is cancelled on its
    /// shard (`57014`); statements on several shards are not bounded by it yet.
    /// Default 0 = none.
    pub statement_timeout: Option<Duration>,
    /// `plan_cache_size`: routing plans of distinct statement texts kept. Default 10000;
    /// 0 = no cache.
    pub plan_cache_size: usize,
    /// `slow_statement_ms`: statements slower than this are logged with their shard and
    /// timings. Default 1000; 0 = no slow-statement log.
    pub slow_statement: Option<Duration>,
    /// `max_merge_groups`: how many groups (of a GROUP BY, DISTINCT or aggregate read across
    /// shards) the router may hold while it combines them; more is refused with `54000`, so
    /// one read cannot take the router's memory. Default 1000000.
    pub max_merge_groups: usize,
    /// `max_logins`: connections still logging in (TLS, startup, password) at once; once this
    /// many are, a new one closes the oldest ([`crate::routing::door`]), so a storm of logins
    /// all gets in and silent sockets cannot lock anyone out. Default 10000; at least 1.
    pub max_logins: usize,
    /// `max_logins_per_address`: connections logging in at once from one IP address; once an
    /// address has this many, its own oldest is closed for its next one. Default 0 (no limit).
    pub max_logins_per_address: usize,
    /// `max_logins_per_address_exempt`: addresses and networks (a load balancer's) that
    /// `max_logins_per_address` does not apply to.
    pub max_logins_per_address_exempt: Vec<ipnet::IpNet>,
    /// `startup_timeout_ms`: how long the router waits for a new connection's first packet
    /// (SSLRequest or StartupMessage), for the TLS ClientHello, and for the StartupMessage after
    /// TLS, before it closes the connection. Default 10000; more than 0.
    pub startup_timeout: Duration,
    /// `login_timeout_ms`: how long a connection may take from accept to logged in (TLS and
    /// authentication included, like Postgres's `authentication_timeout`) before it is closed.
    /// Default 60000 (Postgres's); more than 0.
    pub login_timeout: Duration,
    /// `max_prepared_bytes`: the bytes of statement text (plus a fixed cost per statement) one
    /// session's prepared statements may hold; a Parse or PREPARE past it is refused with
    /// `54000`. Default 64 MiB; at least 1024.
    pub max_prepared_bytes: usize,
    /// `max_merge_bytes`: the bytes one merged read across shards (grouped or sorted) may hold
    /// in the router; more is refused with `54000`. Default 64 MiB; at least 1024.
    pub max_merge_bytes: usize,
    /// `merge_memory_bytes`: the bytes all merged reads in progress together may hold; the read
    /// that would pass it is refused with `54000`. Default 256 MiB; at least 1024.
    pub merge_memory_bytes: usize,
    /// `plan_cache_bytes`: the bytes of statement text (plus a fixed cost per entry) the
    /// shared plan cache may keep, besides `plan_cache_size` entries. Default 64 MiB; 0 = no
    /// cache. Texts longer than [`crate::planner::MAX_CACHED_TEXT`] are never cached.
    pub plan_cache_bytes: usize,
    /// `max_message_bytes`: the longest message a client may send (a Query, a Parse, a Bind,
    /// a CopyData); a longer one is refused with `54000` and the connection is closed without
    /// reading it. It also bounds the extended-protocol messages held for one batch. Default
    /// 64 MiB (Postgres allows 1 GiB); at least 1024.
    pub max_message_bytes: usize,
    /// `max_plan_bytes`: the longest statement text (literals taken out, each comment counted as one
    /// space) the router parses to route it; a longer one is refused with `54000`. Parsing
    /// costs tens of times a text's size in memory and holds the worker thread meanwhile.
    /// Default 1 MiB; at least 1024.
    pub max_plan_bytes: usize,
}

/// `[shutdown]`: on SIGTERM (or Ctrl-C) the router drains: `/ready` says no at once, clients
/// keep being served for `drain_grace_ms` (so a load balancer notices and sends no more), then
/// the listener closes, clients at rest are closed between statements with `57P01`, clients in
/// a transaction may finish it for up to `drain_timeout_ms`, and the process exits 0.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shutdown {
    /// `drain_grace_ms`: default 0 (a single router); behind a load balancer, its health
    /// check interval or more.
    pub drain_grace: Duration,
    /// `drain_timeout_ms`: default 30000; more than 0.
    pub drain_timeout: Duration,
}

/// `[reload]`: `SIGHUP` and the admin command `RELOAD` always reload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reload {
    /// `watch`: also reload when `router.toml`, the shard map file or a TLS file it names
    /// (`[tls] cert`/`key`, `[backend] ca`) changes. Default off.
    pub watch: bool,
    /// `watch_interval_ms`: how often the files are looked at. Default 1000; more than 0.
    pub watch_interval: Duration,
}

/// `[failover]`: a statement for a shard whose primary cannot be reached (restarting, failing
/// over, refusing logins for a moment) waits for it instead of failing at once: it runs as soon
/// as the primary answers again or a reloaded shard map names a new one. A statement that
/// Postgres aborted at a shutdown (57P01/57P02/57P03 before anything of it reached the client,
/// outside a transaction) is sent again the same way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failover {
    /// `hold_ms`: how long a statement may wait for its shard. Default 5000; 0 = fail at once
    /// (08006/08001), as without holding.
    pub hold: Duration,
    /// `hold_max_statements`: statements held per shard (per router) at most; more fail at
    /// once. Default 1000; at least 1.
    pub hold_max_statements: usize,
}

/// A test-only fault: the router stops (abort, like a crash) at this point of a two-phase
/// commit (`[transactions] test_fault`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TwoPhaseFault {
    /// Every participant is prepared; the decision is not made.
    AfterPrepare,
    /// The coordinator committed (the decision); the others are still prepared.
    AfterDecision,
}

/// `[transactions]`: what a transaction may do once it needs a second shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transactions {
    /// `cross_shard`: `"multi"` (default) lets a transaction, or an extended-protocol batch,
    /// run statements on several shards, each shard joining with a transaction of its own, all
    /// committed at the client's COMMIT (or Sync) once every statement succeeded: not atomic if
    /// a shard fails (or the router stops) between those COMMITs. `"two_phase"` is the same,
    /// committed atomically with two-phase commit (every shard needs
    /// `max_prepared_transactions` > 0; the router refuses to start otherwise), and every
    /// router resolves prepared transactions a stopped router left behind. `"refuse"` keeps a
    /// transaction on the shard of its first statement (0A000 for another).
    pub cross_shard: CrossShard,
    /// `recovery_interval_ms`: how often a router in two-phase mode looks for prepared
    /// transactions left in doubt (also once at start). Default 10000.
    pub recovery_interval: Duration,
    /// `recovery_grace_ms`: how old a prepared transaction must be before recovery resolves
    /// it (its own router finishes it within milliseconds). Default 5000.
    pub recovery_grace: Duration,
    /// `test_fault`: for tests only: `"after_prepare"` or `"after_decision"` stops the router
    /// (as a crash) at that point of every two-phase commit.
    pub test_fault: Option<TwoPhaseFault>,
    /// `lock_timeout_ms`: the `lock_timeout` a transaction gets on every shard once it spans
    /// several (unless the client set its own), so that a deadlock across shards, which no
    /// single Postgres can see, ends with an error (55P03) instead of hanging. Default 10000;
    /// 0 leaves `lock_timeout` alone.
    pub lock_timeout: Option<Duration>,
    /// `scatter_writes`: `"allow"` (default) runs UPDATE and DELETE of a sharded table without
    /// a key on every shard, as one Postgres would run them: all or nothing, except when a
    /// shard fails between the COMMITs (the error then names the shards on each side).
    /// `"refuse"` answers them with 0A000. A session chooses for itself with `SET
    /// shardgate.allow_scatter_writes = on | off`. (`[limits] allow_scatter_writes = true |
    /// false`, the older spelling, is still read when this is not set.)
    pub scatter_writes: bool,
}

/// `[log] format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// One line of text per event (with colours only on a terminal).
    #[default]
    Text,
    /// One JSON object per line, for a fleet's log pipeline.
    Json,
}

/// `[transactions] cross_shard`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrossShard {
    Multi,
    TwoPhase,
    Refuse,
}

/// Every problem found in one config file; shown as `FILE:LINE: sentence`, one per line
/// (just `FILE: sentence` when the problem has no line, e.g. a missing setting).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The file the config came from.
    pub origin: String,
    /// Sorted by line.
    pub problems: Vec<Problem>,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        shardmap::error::write_problems(f, &self.origin, &self.problems)
    }
}

impl std::error::Error for ConfigError {}

/// Reads and checks a config file.
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
        origin: path.display().to_string(),
        problems: vec![Problem {
            line: 0,
            message: format!("cannot read the config file: {e}"),
        }],
    })?;
    parse(&text, path)
}

/// Checks config text. `origin` is the file it came from: it names the file in errors, and
/// relative paths in the config are relative to its directory.
pub fn parse(text: &str, origin: &Path) -> Result<Config, ConfigError> {
    let mut check = Checker {
        text,
        problems: Vec::new(),
    };
    let raw: RawConfig = match toml::from_str(text) {
        Ok(raw) => raw,
        Err(e) => {
            let line = e.span().map_or(0, |s| check.line(s));
            check.add(line, e.message().trim());
            return check.finish(origin, None);
        }
    };
    let listen = sections::listen(&raw, &mut check);
    let shardmap = sections::shardmap(&raw, origin, &mut check);
    let database = sections::database(&raw, &mut check);
    let auth = sections::auth(&raw, &mut check);
    let (router_id, peers) = sections::fleet(&raw, &mut check);
    let users = sections::users(&raw, auth, &mut check);
    let backend = sections::backend(&raw.backend, origin, &mut check);
    let tls = sections::tls(raw.tls.as_ref(), origin, &mut check);
    let pool = sections::pool(&raw.pool, &mut check);
    let limits = sections::limits(&raw.limits, &mut check);
    let shutdown = sections::shutdown(&raw.shutdown, &mut check);
    let reload = sections::reload(&raw.reload, &mut check);
    let http = sections::http(&raw.http, &mut check);
    let failover = sections::failover(&raw.failover, &mut check);
    let log_format = sections::log_format(&raw.log, &mut check);
    let hints_for_admins_only = sections::hints_for_admins_only(&raw.hints, &mut check);
    let transactions = sections::transactions(
        &raw.transactions,
        raw.limits.allow_scatter_writes,
        &mut check,
    );
    if !check.problems.is_empty() {
        return check.finish(origin, None);
    }
    // Only now, with the file known good, pay for PBKDF2 on each plain password: logins then
    // cost one HMAC chain instead.
    let users = users
        .into_iter()
        .map(|(u, _)| User {
            name: u.name,
            secret: u.secret.into_scram(),
            admin: u.admin,
        })
        .collect();
    let config = Config {
        source: origin.to_path_buf(),
        listen,
        shardmap,
        database,
        auth: auth.unwrap_or(AuthMethod::ScramSha256),
        users,
        backend,
        pool,
        limits,
        shutdown,
        reload,
        failover,
        transactions,
        http,
        tls,
        router_id,
        peers,
        reuse_port: raw.reuse_port.unwrap_or(false),
        log_format,
        hints_for_admins_only,
    };
    check.finish(origin, Some(config))
}
