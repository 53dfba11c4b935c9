//! `router.toml`: where the router listens, which shard map it serves, who may log in, and
//! how it logs in to the shards, sizes its pools and limits its clients.
//!
//! Read once at start and again on `SIGHUP`/`RELOAD`, which swap the whole [`Config`]
//! atomically, so loading is a pure function of the file: [`load`] reads it, [`parse`]
//! checks every field and returns either a ready-to-use [`Config`] (typed values, paths
//! resolved, plain passwords already turned into SCRAM verifiers) or a [`ConfigError`] that
//! lists every problem as `FILE:LINE: sentence`, in the same style as shard map errors, so
//! an operator fixes a file in one pass. The field docs below are the reference that
//! `docs/configuration.md` follows.

use std::fmt;
use std::net::SocketAddr;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use shardmap::{Primary, Problem};
use toml::Spanned;

use crate::auth::Secret;

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
    /// `admin_users`: users allowed on the admin console (a later feature). Default none.
    pub admin_users: Vec<String>,
    /// `[[users]]`: who may log in, each with a SCRAM verifier (plain passwords in the file
    /// are turned into verifiers at load). At least one is required with `scram-sha-256`.
    pub users: Vec<User>,
    /// `[backend]`: how the router logs in to the shards.
    pub backend: Backend,
    /// `[pool]`: connection pools to the shards.
    pub pool: Pool,
    /// `[limits]`: limits and thresholds on clients and statements.
    pub limits: Limits,
    /// `router_id`: this router's number in its fleet, 0 to 127 (default 0). It is part of the
    /// BackendKeyData every client gets, so a cancel request that reaches another router of
    /// the fleet can be forwarded here.
    pub router_id: u8,
    /// `[[peers]]`: the other routers of the fleet, by id, with the address they listen on.
    pub peers: Vec<Peer>,
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
}

impl Backend {
    /// The user to log in to `primary` as: the one in its URL, else [`Backend::user`].
    pub fn user_for<'a>(&'a self, primary: &'a Primary) -> &'a str {
        primary.user.as_deref().unwrap_or(&self.user)
    }

    /// The password to log in to `primary` with: the one in its URL, else [`Backend::password`].
    pub fn password_for<'a>(&'a self, primary: &'a Primary) -> Option<&'a str> {
        primary.password.as_deref().or(self.password.as_deref())
    }
}

// Config is logged with `{:?}`: never print the backend password.
impl fmt::Debug for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Backend")
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("application_name", &self.application_name)
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
}

/// `[limits]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// `max_clients`: client connections beyond this are refused with `53300`. Default 10000;
    /// at least 1.
    pub max_clients: usize,
    /// `statement_timeout_ms`: statements running longer are cancelled with `57014`.
    /// Default 0 = none.
    pub statement_timeout: Option<Duration>,
    /// `plan_cache_size`: routing plans of distinct statement texts kept. Default 10000;
    /// 0 = no cache.
    pub plan_cache_size: usize,
    /// `slow_statement_ms`: statements slower than this are logged with their shard and
    /// timings. Default 1000; 0 = no slow-statement log.
    pub slow_statement: Option<Duration>,
    /// `allow_scatter_writes`: let UPDATE and DELETE of a sharded table without a key run on
    /// every shard. Off by default: such a write touches every shard, and its transactions
    /// commit one after the other (all or none, except when a shard fails between the COMMITs);
    /// clients can also opt in per session with `SET shardgate.allow_scatter_writes = on`.
    pub allow_scatter_writes: bool,
    /// `max_merge_groups`: how many groups (of a GROUP BY, DISTINCT or aggregate read across
    /// shards) the router may hold while it combines them; more is refused with `54000`, so
    /// one read cannot take the router's memory. Default 1000000.
    pub max_merge_groups: usize,
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
        for (i, p) in self.problems.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            if p.line > 0 {
                write!(f, "{}:{}: {}", self.origin, p.line, p.message)?;
            } else {
                write!(f, "{}: {}", self.origin, p.message)?;
            }
        }
        Ok(())
    }
}

impl std::error::Error for ConfigError {}

// The file as TOML. Every value is Spanned so a problem can name its line, and optional so
// that a missing setting is reported in our words rather than serde's.

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    listen: Option<Spanned<String>>,
    shardmap: Option<Spanned<String>>,
    database: Option<Spanned<String>>,
    auth: Option<Spanned<String>>,
    #[serde(default)]
    admin_users: Vec<Spanned<String>>,
    #[serde(default)]
    users: Vec<Spanned<RawUser>>,
    #[serde(default)]
    backend: RawBackend,
    #[serde(default)]
    pool: RawPool,
    #[serde(default)]
    limits: RawLimits,
    router_id: Option<Spanned<i64>>,
    #[serde(default)]
    peers: Vec<Spanned<RawPeer>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPeer {
    id: Spanned<i64>,
    address: Spanned<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawUser {
    name: Option<Spanned<String>>,
    password: Option<Spanned<String>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawBackend {
    user: Option<Spanned<String>>,
    password: Option<Spanned<String>>,
    application_name: Option<Spanned<String>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawPool {
    max_size: Option<Spanned<i64>>,
    min_idle: Option<Spanned<i64>>,
    connect_timeout_ms: Option<Spanned<i64>>,
    checkout_timeout_ms: Option<Spanned<i64>>,
    idle_timeout_ms: Option<Spanned<i64>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawLimits {
    max_clients: Option<Spanned<i64>>,
    statement_timeout_ms: Option<Spanned<i64>>,
    plan_cache_size: Option<Spanned<i64>>,
    slow_statement_ms: Option<Spanned<i64>>,
    allow_scatter_writes: Option<bool>,
    max_merge_groups: Option<Spanned<i64>>,
}

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

    let listen_text = raw
        .listen
        .as_ref()
        .map_or(DEFAULT_LISTEN, |l| l.get_ref().as_str());
    let listen = match listen_text.trim().parse::<SocketAddr>() {
        Ok(addr) => addr,
        Err(_) => {
            let line = raw.listen.as_ref().map_or(0, |l| check.line(l.span()));
            check.add(
                line,
                format!(
                    "listen {listen_text:?} is not an IP address and port; write it like \
                     \"127.0.0.1:6432\" or \"[::]:6432\" (host names are not accepted)"
                ),
            );
            SocketAddr::from(([127, 0, 0, 1], 6432))
        }
    };

    let base = origin.parent().unwrap_or(Path::new(""));
    let shardmap = match &raw.shardmap {
        Some(s) if !s.get_ref().trim().is_empty() => base.join(s.get_ref().trim()),
        Some(s) => {
            let line = check.line(s.span());
            check.add(
                line,
                "shardmap is empty; give the path of the shard map file",
            );
            PathBuf::new()
        }
        None => {
            check.add(
                0,
                "shardmap is missing; give the path of the shard map file, e.g. \
                 shardmap = \"shardmap.toml\" (relative to this file)",
            );
            PathBuf::new()
        }
    };

    let database = match &raw.database {
        Some(d) if !d.get_ref().trim().is_empty() => d.get_ref().trim().to_string(),
        Some(d) => {
            let line = check.line(d.span());
            check.add(
                line,
                "database is empty; give the database name clients connect to",
            );
            String::new()
        }
        None => {
            check.add(
                0,
                "database is missing; give the database name clients connect to, e.g. database = \"app\"",
            );
            String::new()
        }
    };

    // None when `auth` is unreadable: that is reported once, not again as "no users".
    let auth = match raw
        .auth
        .as_ref()
        .map(|a| (a.get_ref().trim(), check.line(a.span())))
    {
        None | Some(("scram-sha-256", _)) => Some(AuthMethod::ScramSha256),
        Some(("trust", _)) => Some(AuthMethod::Trust),
        Some((other, line)) => {
            check.add(
                line,
                format!("auth {other:?} is not an authentication method; use \"scram-sha-256\" or \"trust\""),
            );
            None
        }
    };

    let router_id = match &raw.router_id {
        None => 0,
        Some(id) if (0..=MAX_ROUTER_ID).contains(id.get_ref()) => *id.get_ref() as u8,
        Some(id) => {
            let line = check.line(id.span());
            check.add(
                line,
                format!(
                    "router_id is {}; it must be 0 to {MAX_ROUTER_ID}",
                    id.get_ref()
                ),
            );
            0
        }
    };
    let mut peers: Vec<Peer> = Vec::new();
    for p in &raw.peers {
        let line = check.line(p.span());
        let p = p.get_ref();
        let id = *p.id.get_ref();
        let address = p.address.get_ref().trim().parse::<SocketAddr>();
        if !(0..=MAX_ROUTER_ID).contains(&id) {
            check.add(line, format!("peer id {id} must be 0 to {MAX_ROUTER_ID}"));
        } else if id as u8 == router_id {
            check.add(
                line,
                format!("peer id {id} is this router's own router_id; list only the other routers"),
            );
        } else if peers.iter().any(|q| q.id == id as u8) {
            check.add(line, format!("peer id {id} is listed twice"));
        } else {
            match address {
                Ok(address) => peers.push(Peer {
                    id: id as u8,
                    address,
                }),
                Err(_) => check.add(
                    line,
                    format!(
                        "peer address {:?} is not an IP address and port, e.g. \"10.0.0.2:6432\"",
                        p.address.get_ref()
                    ),
                ),
            }
        }
    }

    let mut admin_users = Vec::new();
    for a in &raw.admin_users {
        if a.get_ref().trim().is_empty() {
            let line = check.line(a.span());
            check.add(line, "admin_users has an empty user name");
        } else {
            admin_users.push(a.get_ref().trim().to_string());
        }
    }

    let mut users: Vec<(User, usize)> = Vec::new();
    for u in &raw.users {
        let entry = check.line(u.span());
        let u = u.get_ref();
        let name = match &u.name {
            Some(n) if !n.get_ref().trim().is_empty() => n.get_ref().trim().to_string(),
            Some(n) => {
                let line = check.line(n.span());
                check.add(line, "user name is empty");
                continue;
            }
            None => {
                check.add(entry, "[[users]] entry has no name");
                continue;
            }
        };
        let secret = match &u.password {
            Some(p) => match Secret::parse(p.get_ref()) {
                Ok(s) => s,
                Err(e) => {
                    let line = check.line(p.span());
                    check.add(line, format!("user {name:?}: {e}"));
                    continue;
                }
            },
            None => {
                check.add(
                    entry,
                    format!("user {name:?} has no password; give a plain password or a SCRAM-SHA-256$... verifier"),
                );
                continue;
            }
        };
        if let Some((_, first)) = users.iter().find(|(existing, _)| existing.name == name) {
            let first = *first;
            check.add(
                entry,
                format!("user {name:?} is defined twice (first on line {first}); keep one [[users]] entry per user"),
            );
            continue;
        }
        users.push((User { name, secret }, entry));
    }
    // A user whose entry is broken is not in `users`, but it was meant to be: only complain
    // about "no users" when none were written at all.
    if auth == Some(AuthMethod::ScramSha256) && raw.users.is_empty() {
        let line = raw.auth.as_ref().map_or(0, |a| check.line(a.span()));
        check.add(
            line,
            "auth is scram-sha-256 but no [[users]] are defined, so nobody could log in; \
             add [[users]] entries with name and password, or set auth = \"trust\"",
        );
    }

    let backend = {
        let b = &raw.backend;
        let text_or = |v: &Option<Spanned<String>>, default: &str| {
            v.as_ref()
                .map_or(default.to_string(), |s| s.get_ref().clone())
        };
        if let Some(p) = &b.password {
            if p.get_ref().starts_with("SCRAM-SHA-256$") {
                let line = check.line(p.span());
                check.add(
                    line,
                    "backend.password is a SCRAM verifier, which cannot be used to log in; give the plain password",
                );
            }
        }
        if let Some(u) = &b.user {
            if u.get_ref().trim().is_empty() {
                let line = check.line(u.span());
                check.add(
                    line,
                    "backend.user is empty; leave it out to use \"postgres\"",
                );
            }
        }
        Backend {
            user: text_or(&b.user, "postgres").trim().to_string(),
            password: b.password.as_ref().map(|p| p.get_ref().clone()),
            application_name: text_or(&b.application_name, "shardgate"),
        }
    };

    let p = &raw.pool;
    let max_size = check.count(&p.max_size, "pool.max_size", 20, 1);
    let min_idle = check.count(&p.min_idle, "pool.min_idle", 0, 0);
    if min_idle > max_size {
        let line = p.min_idle.as_ref().map_or(0, |m| check.line(m.span()));
        check.add(
            line,
            format!("pool.min_idle is {min_idle}, more than pool.max_size ({max_size}); it can be at most max_size"),
        );
    }
    let pool = Pool {
        max_size,
        min_idle,
        connect_timeout: check.timeout(&p.connect_timeout_ms, "pool.connect_timeout_ms", 2000),
        checkout_timeout: check.timeout(&p.checkout_timeout_ms, "pool.checkout_timeout_ms", 5000),
        idle_timeout: check.optional_ms(&p.idle_timeout_ms, "pool.idle_timeout_ms", 600_000),
    };

    let l = &raw.limits;
    let limits = Limits {
        max_clients: check.count(&l.max_clients, "limits.max_clients", 10_000, 1),
        statement_timeout: check.optional_ms(
            &l.statement_timeout_ms,
            "limits.statement_timeout_ms",
            0,
        ),
        plan_cache_size: check.count(&l.plan_cache_size, "limits.plan_cache_size", 10_000, 0),
        slow_statement: check.optional_ms(&l.slow_statement_ms, "limits.slow_statement_ms", 1000),
        allow_scatter_writes: l.allow_scatter_writes.unwrap_or(false),
        max_merge_groups: check.count(&l.max_merge_groups, "limits.max_merge_groups", 1_000_000, 1),
    };

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
        })
        .collect();
    let config = Config {
        source: origin.to_path_buf(),
        listen,
        shardmap,
        database,
        auth: auth.unwrap_or(AuthMethod::ScramSha256),
        admin_users,
        users,
        backend,
        pool,
        limits,
        router_id,
        peers,
    };
    check.finish(origin, Some(config))
}

/// Collects problems, with the line of each.
struct Checker<'a> {
    text: &'a str,
    problems: Vec<Problem>,
}

impl Checker<'_> {
    /// 1-based line of the start of `span`.
    fn line(&self, span: Range<usize>) -> usize {
        let end = span.start.min(self.text.len());
        self.text.as_bytes()[..end]
            .iter()
            .filter(|&&b| b == b'\n')
            .count()
            + 1
    }

    fn add(&mut self, line: usize, message: impl Into<String>) {
        self.problems.push(Problem {
            line,
            message: message.into(),
        });
    }

    /// An integer setting of at least `min`, or `default` when absent.
    fn count(&mut self, v: &Option<Spanned<i64>>, name: &str, default: usize, min: usize) -> usize {
        let Some(v) = v else { return default };
        match usize::try_from(*v.get_ref()) {
            Ok(n) if n >= min => n,
            _ => {
                let line = self.line(v.span());
                self.add(
                    line,
                    format!("{name} is {}; it must be {min} or more", v.get_ref()),
                );
                default
            }
        }
    }

    /// A millisecond setting that must be more than 0.
    fn timeout(&mut self, v: &Option<Spanned<i64>>, name: &str, default_ms: u64) -> Duration {
        let Some(v) = v else {
            return Duration::from_millis(default_ms);
        };
        match u64::try_from(*v.get_ref()) {
            Ok(ms) if ms > 0 => Duration::from_millis(ms),
            _ => {
                let line = self.line(v.span());
                self.add(
                    line,
                    format!(
                        "{name} is {}; it must be more than 0 milliseconds",
                        v.get_ref()
                    ),
                );
                Duration::from_millis(default_ms)
            }
        }
    }

    /// A millisecond setting where 0 switches the feature off.
    fn optional_ms(
        &mut self,
        v: &Option<Spanned<i64>>,
        name: &str,
        default_ms: u64,
    ) -> Option<Duration> {
        let ms = match v {
            None => default_ms,
            Some(v) => match u64::try_from(*v.get_ref()) {
                Ok(ms) => ms,
                Err(_) => {
                    let line = self.line(v.span());
                    self.add(
                        line,
                        format!(
                            "{name} is {}; it must be 0 (off) or a number of milliseconds",
                            v.get_ref()
                        ),
                    );
                    default_ms
                }
            },
        };
        (ms > 0).then(|| Duration::from_millis(ms))
    }

    fn finish(mut self, origin: &Path, config: Option<Config>) -> Result<Config, ConfigError> {
        match config {
            Some(config) if self.problems.is_empty() => Ok(config),
            _ => {
                // Problems without a line (missing settings) first, then in file order.
                self.problems.sort_by_key(|p| p.line);
                Err(ConfigError {
                    origin: origin.display().to_string(),
                    problems: self.problems,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::ScramVerifier;

    const VERIFIER: &str = "SCRAM-SHA-256$4096:AQIDBAUGBwgJCgsMDQ4PEA==$8rrDg00OqaiWXJ7p+sCgHEIaBSHY89ZJl3mfIsf32oY=:05L1f+yZbiN8O0AnO40Og85NNRhvzTS57naKRWCcsIA=";

    fn parse_str(text: &str) -> Result<Config, ConfigError> {
        parse(text, Path::new("/etc/shardgate/router.toml"))
    }

    /// The (line, message) of every problem, for asserting both.
    fn problems(text: &str) -> Vec<(usize, String)> {
        match parse_str(text) {
            Ok(c) => panic!("expected problems, got {c:?}"),
            Err(e) => e
                .problems
                .into_iter()
                .map(|p| (p.line, p.message))
                .collect(),
        }
    }

    /// Asserts exactly one problem, on `line`, whose message contains `words`.
    fn one_problem(text: &str, line: usize, words: &str) {
        let found = problems(text);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].0, line, "{found:?}");
        assert!(
            found[0].1.contains(words),
            "{:?} does not contain {words:?}",
            found[0].1
        );
    }

    const MINIMAL: &str = "shardmap = \"shardmap.toml\"\ndatabase = \"app\"\n[[users]]\nname = \"app\"\npassword = \"app\"\n";

    #[test]
    fn full_file() {
        let text = format!(
            r#"listen = "0.0.0.0:7432"
shardmap = "maps/shardmap.toml"
database = "app"
auth = "scram-sha-256"
admin_users = ["admin"]

[[users]]
name = "app"
password = "app-password"

[[users]]
name = "admin"
password = "{VERIFIER}"

[backend]
user = "router"
password = "backend-secret"
application_name = "sg"

[pool]
max_size = 50
min_idle = 2
connect_timeout_ms = 1500
checkout_timeout_ms = 3000
idle_timeout_ms = 0

[limits]
max_clients = 500
statement_timeout_ms = 30000
plan_cache_size = 0
slow_statement_ms = 250
"#
        );
        let c = parse_str(&text).unwrap();
        assert_eq!(c.source, Path::new("/etc/shardgate/router.toml"));
        assert_eq!(c.listen, "0.0.0.0:7432".parse().unwrap());
        assert_eq!(c.shardmap, Path::new("/etc/shardgate/maps/shardmap.toml"));
        assert_eq!(c.database, "app");
        assert_eq!(c.auth, AuthMethod::ScramSha256);
        assert_eq!(c.admin_users, ["admin"]);
        assert_eq!(c.users.len(), 2);
        // The plain password became a verifier for that password.
        let Secret::Scram(v) = &c.user("app").unwrap().secret else {
            panic!("plain password kept: {:?}", c.users)
        };
        assert_eq!(
            v,
            &crate::auth::scram_verifier("app-password", v.salt(), v.iterations())
        );
        assert_eq!(
            c.user("admin").unwrap().secret,
            Secret::Scram(ScramVerifier::parse(VERIFIER).unwrap())
        );
        assert!(c.user("nobody").is_none());
        assert_eq!(c.backend.user, "router");
        assert_eq!(c.backend.password.as_deref(), Some("backend-secret"));
        assert_eq!(c.backend.application_name, "sg");
        assert_eq!(
            c.pool,
            Pool {
                max_size: 50,
                min_idle: 2,
                connect_timeout: Duration::from_millis(1500),
                checkout_timeout: Duration::from_secs(3),
                idle_timeout: None,
            }
        );
        assert_eq!(
            c.limits,
            Limits {
                max_clients: 500,
                statement_timeout: Some(Duration::from_secs(30)),
                plan_cache_size: 0,
                slow_statement: Some(Duration::from_millis(250)),
                allow_scatter_writes: false,
                max_merge_groups: 1_000_000,
            }
        );
        // No password, plain or backend, is printed by Debug.
        let debug = format!("{c:?}");
        assert!(
            !debug.contains("app-password") && !debug.contains("backend-secret"),
            "{debug}"
        );
    }

    /// The examples in docs/configuration.md stay valid.
    #[test]
    fn documented_examples_parse() {
        let doc = include_str!("../../docs/configuration.md");
        let examples: Vec<&str> = doc
            .split("```toml\n")
            .skip(1)
            .filter_map(|block| block.split("```").next())
            .collect();
        assert_eq!(examples.len(), 2);
        let full = parse_str(examples[0]).unwrap();
        assert_eq!(full.users.len(), 2);
        assert_eq!(full.admin_users, ["admin"]);
        let small = parse_str(examples[1]).unwrap();
        assert_eq!(small.pool, full.pool);
        assert_eq!(small.limits, full.limits);
        // The full example spells out every default except the backend password.
        assert_eq!(small.backend.user, full.backend.user);
        assert_eq!(
            small.backend.application_name,
            full.backend.application_name
        );
    }

    #[test]
    fn defaults() {
        let c = parse_str(MINIMAL).unwrap();
        assert_eq!(c.listen, DEFAULT_LISTEN.parse().unwrap());
        assert_eq!(c.auth, AuthMethod::ScramSha256);
        assert!(c.admin_users.is_empty());
        assert_eq!(c.backend.user, "postgres");
        assert_eq!(c.backend.password, None);
        assert_eq!(c.backend.application_name, "shardgate");
        assert_eq!(
            c.pool,
            Pool {
                max_size: 20,
                min_idle: 0,
                connect_timeout: Duration::from_secs(2),
                checkout_timeout: Duration::from_secs(5),
                idle_timeout: Some(Duration::from_secs(600)),
            }
        );
        assert_eq!(
            c.limits,
            Limits {
                max_clients: 10_000,
                statement_timeout: None,
                plan_cache_size: 10_000,
                slow_statement: Some(Duration::from_secs(1)),
                allow_scatter_writes: false,
                max_merge_groups: 1_000_000,
            }
        );
    }

    #[test]
    fn trust_needs_no_users() {
        let c = parse_str("shardmap = \"m.toml\"\ndatabase = \"app\"\nauth = \"trust\"\n").unwrap();
        assert_eq!(c.auth, AuthMethod::Trust);
        assert!(c.users.is_empty());
    }

    #[test]
    fn paths_are_relative_to_the_config_file() {
        let at = |origin: &str, map: &str| {
            let text = MINIMAL.replace("shardmap.toml", map);
            parse(&text, Path::new(origin)).unwrap().shardmap
        };
        assert_eq!(at("conf/router.toml", "m.toml"), Path::new("conf/m.toml"));
        assert_eq!(at("router.toml", "m.toml"), Path::new("m.toml"));
        assert_eq!(
            at("/etc/sg/router.toml", "/srv/m.toml"),
            Path::new("/srv/m.toml")
        );
    }

    #[test]
    fn backend_login_prefers_the_primary_url() {
        let c = parse_str(&format!(
            "{MINIMAL}[backend]\nuser = \"router\"\npassword = \"pw\"\n"
        ))
        .unwrap();
        let with = Primary::parse("postgres://owner:secret@db1:5432/app").unwrap();
        let without = Primary::parse("postgres://db2:5432/app").unwrap();
        assert_eq!(c.backend.user_for(&with), "owner");
        assert_eq!(c.backend.password_for(&with), Some("secret"));
        assert_eq!(c.backend.user_for(&without), "router");
        assert_eq!(c.backend.password_for(&without), Some("pw"));
    }

    #[test]
    fn syntax_error_names_its_line() {
        one_problem(&format!("{MINIMAL}[pool]\nmax_size = = 3\n"), 7, "");
    }

    #[test]
    fn unknown_field_names_its_line() {
        one_problem(
            &format!("{MINIMAL}[pool]\nmax_sise = 3\n"),
            7,
            "unknown field `max_sise`",
        );
        one_problem(
            &format!("lissten = \"x\"\n{MINIMAL}"),
            1,
            "unknown field `lissten`",
        );
    }

    #[test]
    fn wrong_type_names_its_line() {
        one_problem(
            &format!("{MINIMAL}[limits]\nmax_clients = \"many\"\n"),
            7,
            "invalid type",
        );
    }

    #[test]
    fn bad_listen() {
        one_problem(
            &format!("listen = \"localhost:6432\"\n{MINIMAL}"),
            1,
            "not an IP address and port",
        );
        one_problem(
            "shardmap = \"m\"\nlisten = \"127.0.0.1\"\ndatabase = \"app\"\nauth = \"trust\"\n",
            2,
            "not an IP address and port",
        );
        // A top-level key written after a table belongs to that table, as TOML has it.
        one_problem(
            &format!("{MINIMAL}listen = \"127.0.0.1:1\"\n"),
            6,
            "unknown field `listen`",
        );
    }

    #[test]
    fn missing_shardmap_and_database() {
        let found = problems("[[users]]\nname = \"app\"\npassword = \"app\"\n");
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found.iter().all(|(line, _)| *line == 0), "{found:?}");
        assert!(found[0].1.starts_with("shardmap is missing"), "{found:?}");
        assert!(found[1].1.starts_with("database is missing"), "{found:?}");
        one_problem(
            &MINIMAL.replace("\"shardmap.toml\"", "\" \""),
            1,
            "shardmap is empty",
        );
        one_problem(
            &MINIMAL.replace("\"app\"\n[[", "\"\"\n[["),
            2,
            "database is empty",
        );
    }

    #[test]
    fn bad_auth() {
        one_problem(
            &format!("auth = \"md5\"\n{MINIMAL}"),
            1,
            "not an authentication method",
        );
    }

    #[test]
    fn scram_without_users() {
        one_problem(
            "shardmap = \"m\"\ndatabase = \"app\"\nauth = \"scram-sha-256\"\n",
            3,
            "no [[users]]",
        );
        // Without an explicit `auth` line there is no line to point at.
        one_problem("shardmap = \"m\"\ndatabase = \"app\"\n", 0, "no [[users]]");
    }

    #[test]
    fn duplicate_user() {
        one_problem(
            &format!("{MINIMAL}\n[[users]]\nname = \"app\"\npassword = \"x\"\n"),
            7,
            "defined twice (first on line 3)",
        );
    }

    #[test]
    fn bad_user_entries() {
        one_problem(
            &format!("{MINIMAL}[[users]]\npassword = \"x\"\n"),
            6,
            "has no name",
        );
        one_problem(
            &format!("{MINIMAL}[[users]]\nname = \"b\"\n"),
            6,
            "user \"b\" has no password",
        );
        one_problem(
            &format!("{MINIMAL}[[users]]\nname = \" \"\npassword = \"x\"\n"),
            7,
            "user name is empty",
        );
        one_problem(
            &format!("{MINIMAL}[[users]]\nname = \"b\"\npassword = \"SCRAM-SHA-256$4096:zz\"\n"),
            8,
            "user \"b\": password verifier",
        );
        one_problem(
            &format!("{MINIMAL}[[users]]\nname = \"b\"\npassword = \"md54ab2c5d00339c4b2a4e921d2dc4edec7\"\n"),
            8,
            "md5",
        );
        one_problem(
            &format!("admin_users = [\"\"]\n{MINIMAL}"),
            1,
            "empty user name",
        );
    }

    #[test]
    fn bad_backend() {
        one_problem(
            &format!("{MINIMAL}[backend]\npassword = \"{VERIFIER}\"\n"),
            7,
            "cannot be used to log in",
        );
        one_problem(
            &format!("{MINIMAL}[backend]\nuser = \"\"\n"),
            7,
            "backend.user is empty",
        );
    }

    #[test]
    fn bad_pool() {
        one_problem(
            &format!("{MINIMAL}[pool]\nmax_size = 0\n"),
            7,
            "pool.max_size is 0; it must be 1 or more",
        );
        one_problem(
            &format!("{MINIMAL}[pool]\nmin_idle = -1\n"),
            7,
            "pool.min_idle is -1",
        );
        one_problem(
            &format!("{MINIMAL}[pool]\nmax_size = 2\nmin_idle = 3\n"),
            8,
            "more than pool.max_size (2)",
        );
        one_problem(
            &format!("{MINIMAL}[pool]\nconnect_timeout_ms = 0\n"),
            7,
            "pool.connect_timeout_ms is 0; it must be more than 0",
        );
        one_problem(
            &format!("{MINIMAL}[pool]\ncheckout_timeout_ms = -5\n"),
            7,
            "pool.checkout_timeout_ms is -5",
        );
        one_problem(
            &format!("{MINIMAL}[pool]\nidle_timeout_ms = -1\n"),
            7,
            "0 (off)",
        );
    }

    #[test]
    fn bad_limits() {
        one_problem(
            &format!("{MINIMAL}[limits]\nmax_clients = 0\n"),
            7,
            "limits.max_clients is 0",
        );
        one_problem(
            &format!("{MINIMAL}[limits]\nplan_cache_size = -1\n"),
            7,
            "limits.plan_cache_size",
        );
        one_problem(
            &format!("{MINIMAL}[limits]\nstatement_timeout_ms = -1\n"),
            7,
            "limits.statement_timeout_ms",
        );
        one_problem(
            &format!("{MINIMAL}[limits]\nslow_statement_ms = -1\n"),
            7,
            "limits.slow_statement_ms",
        );
    }

    #[test]
    fn several_problems_one_per_line_in_file_order() {
        let text = "listen = \"nowhere\"\nauth = \"md5\"\n[pool]\nmax_size = 0\n";
        let err = parse_str(text).unwrap_err();
        let shown = err.to_string();
        let lines: Vec<&str> = shown.lines().collect();
        assert_eq!(lines.len(), 5, "{shown}");
        assert!(
            lines[0].starts_with("/etc/shardgate/router.toml: shardmap is missing"),
            "{shown}"
        );
        assert!(
            lines[1].starts_with("/etc/shardgate/router.toml: database is missing"),
            "{shown}"
        );
        assert!(
            lines[2].starts_with("/etc/shardgate/router.toml:1: listen \"nowhere\""),
            "{shown}"
        );
        assert!(
            lines[3].starts_with("/etc/shardgate/router.toml:2: auth \"md5\""),
            "{shown}"
        );
        assert!(
            lines[4].starts_with("/etc/shardgate/router.toml:4: pool.max_size is 0"),
            "{shown}"
        );
    }

    #[test]
    fn load_reads_the_file_and_names_it_in_errors() {
        let dir =
            std::env::temp_dir().join(format!("shardgate-config-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("router.toml");
        std::fs::write(&path, MINIMAL).unwrap();
        let c = load(&path).unwrap();
        assert_eq!(c.shardmap, dir.join("shardmap.toml"));
        std::fs::write(&path, format!("{MINIMAL}bogus = 1\n")).unwrap();
        let shown = load(&path).unwrap_err().to_string();
        assert!(
            shown.starts_with(&format!("{}:6: unknown field `bogus`", path.display())),
            "{shown}"
        );
        std::fs::remove_dir_all(&dir).unwrap();

        let shown = load(&dir.join("router.toml")).unwrap_err().to_string();
        assert!(
            shown.contains("router.toml: cannot read the config file"),
            "{shown}"
        );
    }

    #[test]
    fn router_id_and_peers() {
        let c = parse_str(&format!(
            "router_id = 3\n{MINIMAL}[[peers]]\nid = 4\naddress = \"10.0.0.4:6432\"\n"
        ))
        .expect("a fleet config");
        assert_eq!(c.router_id, 3);
        assert_eq!(
            c.peers,
            [Peer {
                id: 4,
                address: "10.0.0.4:6432".parse().expect("addr")
            }]
        );
        let all = problems(&format!(
            "router_id = 200\n{MINIMAL}[[peers]]\nid = 0\naddress = \"x\"\n[[peers]]\nid = 0\naddress = \"10.0.0.1:1\"\n"
        ));
        let text: Vec<&str> = all.iter().map(|(_, m)| m.as_str()).collect();
        assert!(
            text.iter().any(|m| m.contains("router_id is 200")),
            "{text:?}"
        );
        assert!(text.iter().any(|m| m.contains("own router_id")), "{text:?}");
    }
}
