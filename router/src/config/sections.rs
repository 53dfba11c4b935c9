//! The checks of each part of `router.toml`, one function per part: each reads the raw file
//! form ([`super::raw`]), reports every problem with its line to the [`Checker`], and returns
//! the checked value (a harmless default where it found a problem, so that checking goes on and
//! the operator sees every problem at once).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use toml::Spanned;

use super::check::Checker;
use super::raw::{
    RawBackend, RawConfig, RawFailover, RawHints, RawHttp, RawLimits, RawLog, RawPool, RawReload,
    RawShutdown, RawTls, RawTransactions,
};
use super::{
    AuthMethod, Backend, CrossShard, Failover, FileSetting, Limits, LogFormat, Peer, Pool, Reload,
    Shutdown, SslMode, Tls, TlsMode, Transactions, TwoPhaseFault, User, DEFAULT_LISTEN,
    MAX_ROUTER_ID,
};
use crate::auth::Secret;

/// `listen`.
pub(super) fn listen(raw: &RawConfig, check: &mut Checker<'_>) -> SocketAddr {
    address(raw.listen.as_ref(), "listen", "6432", check)
        .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 6432)))
}

/// `[http] listen`: the HTTP side port, off when absent.
pub(super) fn http(h: &RawHttp, check: &mut Checker<'_>) -> Option<SocketAddr> {
    h.listen.as_ref()?;
    address(h.listen.as_ref(), "http.listen", "9930", check)
}

/// An IP address and port (`key` names it in the message, `port` is the example's port);
/// absent means [`DEFAULT_LISTEN`].
fn address(
    raw: Option<&Spanned<String>>,
    key: &str,
    port: &str,
    check: &mut Checker<'_>,
) -> Option<SocketAddr> {
    let text = raw.map_or(DEFAULT_LISTEN, |l| l.get_ref().as_str());
    match text.trim().parse::<SocketAddr>() {
        Ok(addr) => Some(addr),
        Err(_) => {
            let line = raw.map_or(0, |l| check.line(l.span()));
            check.add(
                line,
                format!(
                    "{key} {text:?} is not an IP address and port; write it like \
                     \"127.0.0.1:{port}\" or \"[::]:{port}\" (host names are not accepted)"
                ),
            );
            None
        }
    }
}

/// `shardmap`, resolved against the config file's directory.
pub(super) fn shardmap(raw: &RawConfig, origin: &Path, check: &mut Checker<'_>) -> PathBuf {
    let base = origin.parent().unwrap_or(Path::new(""));
    match &raw.shardmap {
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
    }
}

/// `database`.
pub(super) fn database(raw: &RawConfig, check: &mut Checker<'_>) -> String {
    match &raw.database {
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
    }
}

/// `auth`; `None` when unreadable (reported once, not again as "no users").
pub(super) fn auth(raw: &RawConfig, check: &mut Checker<'_>) -> Option<AuthMethod> {
    match raw
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
    }
}

/// `router_id` and `[[peers]]`: this router's place in its fleet.
pub(super) fn fleet(raw: &RawConfig, check: &mut Checker<'_>) -> (u8, Vec<Peer>) {
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
    (router_id, peers)
}

/// `[[users]]`, each with the line of its entry; `auth` decides whether none is a problem.
pub(super) fn users(
    raw: &RawConfig,
    auth: Option<AuthMethod>,
    check: &mut Checker<'_>,
) -> Vec<(User, usize)> {
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
        let admin = u.admin.unwrap_or(false);
        users.push((
            User {
                name,
                secret,
                admin,
            },
            entry,
        ));
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
    users
}

/// A file setting (`name` as operators write it), resolved against the config file's directory.
fn file(
    v: &Option<Spanned<String>>,
    name: &str,
    origin: &Path,
    check: &mut Checker<'_>,
) -> Option<FileSetting> {
    let v = v.as_ref()?;
    let line = check.line(v.span());
    let text = v.get_ref().trim();
    if text.is_empty() {
        check.add(
            line,
            format!("{name} is empty; give the path of a PEM file"),
        );
        return None;
    }
    let base = origin.parent().unwrap_or(Path::new(""));
    Some(FileSetting {
        path: base.join(text),
        line,
    })
}

/// `[backend] sslmode` and `ca`.
fn backend_tls(
    b: &RawBackend,
    origin: &Path,
    check: &mut Checker<'_>,
) -> (SslMode, Option<FileSetting>) {
    let ca = file(&b.ca, "backend.ca", origin, check);
    let Some(mode) = &b.sslmode else {
        if let Some(ca) = &ca {
            check.add(
                ca.line,
                "backend.ca is set but backend.sslmode is not; set sslmode = \"verify-full\" to check the shards' certificates against it",
            );
        }
        return (SslMode::Disable, ca);
    };
    let line = check.line(mode.span());
    let sslmode = match mode.get_ref().trim() {
        "disable" => SslMode::Disable,
        "require" => SslMode::Require,
        "verify-full" => SslMode::VerifyFull,
        other => {
            check.add(
                line,
                format!(
                    "backend.sslmode {other:?} is not supported; use \"disable\", \"require\" or \"verify-full\""
                ),
            );
            return (SslMode::Disable, ca);
        }
    };
    match (sslmode, &ca) {
        (SslMode::VerifyFull, None) if b.ca.is_none() => check.add(
            line,
            "backend.sslmode is \"verify-full\" but backend.ca is not set; give the PEM file of the certificate authority that signed the shards' certificates",
        ),
        (SslMode::Disable | SslMode::Require, Some(ca)) => check.add(
            ca.line,
            format!(
                "backend.ca is only used with sslmode = \"verify-full\" (sslmode is {:?}, which does not check certificates)",
                mode.get_ref().trim()
            ),
        ),
        _ => {}
    }
    (sslmode, ca)
}

/// `[tls]`; `mode = "disable"` when the section is absent.
pub(super) fn tls(raw: Option<&Spanned<RawTls>>, origin: &Path, check: &mut Checker<'_>) -> Tls {
    let Some(raw) = raw else {
        return Tls {
            mode: TlsMode::Disable,
            cert: None,
            key: None,
        };
    };
    let section = check.line(raw.span());
    let raw = raw.get_ref();
    let cert = file(&raw.cert, "tls.cert", origin, check);
    let key = file(&raw.key, "tls.key", origin, check);
    let mode = match &raw.mode {
        None => {
            if raw.cert.is_some() || raw.key.is_some() {
                check.add(
                    section,
                    "[tls] names a certificate but no mode; set mode = \"allow\" or \"require\" to turn TLS on (or \"disable\" to keep it off)",
                );
            }
            TlsMode::Disable
        }
        Some(m) => {
            let line = check.line(m.span());
            match m.get_ref().trim() {
                "disable" => TlsMode::Disable,
                "allow" => TlsMode::Allow,
                "require" => TlsMode::Require,
                other => {
                    check.add(
                        line,
                        format!(
                            "tls.mode {other:?} is not a TLS mode; use \"disable\", \"allow\" or \"require\""
                        ),
                    );
                    TlsMode::Disable
                }
            }
        }
    };
    if mode != TlsMode::Disable {
        let line = raw.mode.as_ref().map_or(section, |m| check.line(m.span()));
        for (value, setting, what) in [
            (&raw.cert, "cert", "certificate"),
            (&raw.key, "key", "private key"),
        ] {
            if value.is_none() {
                check.add(
                    line,
                    format!(
                        "tls.mode is {:?} but tls.{setting} is not set; give the PEM file of the router's {what}",
                        mode.name()
                    ),
                );
            }
        }
    }
    Tls { mode, cert, key }
}

/// `[backend]`.
pub(super) fn backend(b: &RawBackend, origin: &Path, check: &mut Checker<'_>) -> Backend {
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
    let (sslmode, ca) = backend_tls(b, origin, check);
    Backend {
        user: text_or(&b.user, "postgres").trim().to_string(),
        password: b.password.as_ref().map(|p| p.get_ref().clone()),
        application_name: text_or(&b.application_name, "shardgate"),
        sslmode,
        ca,
    }
}

/// `[pool]`.
pub(super) fn pool(p: &RawPool, check: &mut Checker<'_>) -> Pool {
    let max_size = check.count(&p.max_size, "pool.max_size", 20, 1);
    let min_idle = check.count(&p.min_idle, "pool.min_idle", 0, 0);
    if min_idle > max_size {
        let line = p.min_idle.as_ref().map_or(0, |m| check.line(m.span()));
        check.add(
            line,
            format!("pool.min_idle is {min_idle}, more than pool.max_size ({max_size}); it can be at most max_size"),
        );
    }
    let shared_connections = check.count(&p.shared_connections, "pool.shared_connections", 2, 0);
    // With sharing, the autocommit statements that come first after a start use the shared
    // connections (warmed on their own): warmed pooled ones would only sit idle, and their
    // logins slow the start and the first seconds (docs/benchmarks.md, "Warm start").
    let warm_default = if shared_connections == 0 { 1 } else { 0 };
    let warm_connections = check.count(
        &p.warm_connections,
        "pool.warm_connections",
        warm_default,
        0,
    );
    if warm_connections > max_size {
        let line = p
            .warm_connections
            .as_ref()
            .map_or(0, |m| check.line(m.span()));
        check.add(
            line,
            format!("pool.warm_connections is {warm_connections}, more than pool.max_size ({max_size}); it can be at most max_size"),
        );
    }
    Pool {
        max_size,
        min_idle,
        warm_connections,
        warm_timeout: check.timeout(&p.warm_timeout_ms, "pool.warm_timeout_ms", 10_000),
        connect_timeout: check.timeout(&p.connect_timeout_ms, "pool.connect_timeout_ms", 2000),
        checkout_timeout: check.timeout(&p.checkout_timeout_ms, "pool.checkout_timeout_ms", 5000),
        idle_timeout: check.optional_ms(&p.idle_timeout_ms, "pool.idle_timeout_ms", 600_000),
        pause_timeout: check.timeout(&p.pause_timeout_ms, "pool.pause_timeout_ms", 60_000),
        shared_connections,
    }
}

/// `[limits]`.
pub(super) fn limits(l: &RawLimits, check: &mut Checker<'_>) -> Limits {
    Limits {
        max_clients: check.count(&l.max_clients, "limits.max_clients", 10_000, 1),
        statement_timeout: check.optional_ms(
            &l.statement_timeout_ms,
            "limits.statement_timeout_ms",
            0,
        ),
        plan_cache_size: check.count(&l.plan_cache_size, "limits.plan_cache_size", 10_000, 0),
        slow_statement: check.optional_ms(&l.slow_statement_ms, "limits.slow_statement_ms", 1000),
        max_merge_groups: check.count(&l.max_merge_groups, "limits.max_merge_groups", 1_000_000, 1),
        max_logins: check.count(&l.max_logins, "limits.max_logins", 10_000, 1),
        max_logins_per_address: check.count(
            &l.max_logins_per_address,
            "limits.max_logins_per_address",
            0,
            0,
        ),
        max_logins_per_address_exempt: networks(
            l.max_logins_per_address_exempt
                .as_deref()
                .unwrap_or_default(),
            "limits.max_logins_per_address_exempt",
            check,
        ),
        startup_timeout: check.timeout(&l.startup_timeout_ms, "limits.startup_timeout_ms", 10_000),
        login_timeout: check.timeout(&l.login_timeout_ms, "limits.login_timeout_ms", 60_000),
        max_prepared_bytes: check.count(
            &l.max_prepared_bytes,
            "limits.max_prepared_bytes",
            64 << 20,
            1024,
        ),
        max_merge_bytes: check.count(&l.max_merge_bytes, "limits.max_merge_bytes", 64 << 20, 1024),
        merge_memory_bytes: check.count(
            &l.merge_memory_bytes,
            "limits.merge_memory_bytes",
            256 << 20,
            1024,
        ),
        plan_cache_bytes: check.count(&l.plan_cache_bytes, "limits.plan_cache_bytes", 64 << 20, 0),
        max_message_bytes: check.count(
            &l.max_message_bytes,
            "limits.max_message_bytes",
            64 << 20,
            1024,
        ),
        max_plan_bytes: check.count(&l.max_plan_bytes, "limits.max_plan_bytes", 1 << 20, 1024),
    }
}

/// A list of IP addresses (`10.0.0.5`) and networks (`10.0.0.0/16`).
fn networks(raw: &[Spanned<String>], key: &str, check: &mut Checker<'_>) -> Vec<ipnet::IpNet> {
    let mut nets = Vec::with_capacity(raw.len());
    for item in raw {
        let text = item.get_ref().trim();
        let parsed = text
            .parse::<ipnet::IpNet>()
            .or_else(|_| text.parse::<std::net::IpAddr>().map(ipnet::IpNet::from));
        match parsed {
            Ok(net) => nets.push(net),
            Err(_) => {
                let line = check.line(item.span());
                check.add(
                    line,
                    format!(
                        "{key}: {text:?} is not an IP address or network; write it like \"10.0.0.5\" or \"10.0.0.0/16\""
                    ),
                );
            }
        }
    }
    nets
}

/// `[log] format`.
pub(super) fn log_format(l: &RawLog, check: &mut Checker<'_>) -> LogFormat {
    let Some(v) = &l.format else {
        return LogFormat::Text;
    };
    match v.get_ref().trim() {
        "text" => LogFormat::Text,
        "json" => LogFormat::Json,
        other => {
            let line = check.line(v.span());
            check.add(
                line,
                format!("log.format {other:?} is not supported; use \"text\" or \"json\""),
            );
            LogFormat::Text
        }
    }
}

/// `[hints] allow`: whether every user may pin statements to a shard by hand.
pub(super) fn hints_for_admins_only(h: &RawHints, check: &mut Checker<'_>) -> bool {
    let Some(v) = &h.allow else {
        return false;
    };
    match v.get_ref().trim() {
        "everyone" => false,
        "admins" => true,
        other => {
            let line = check.line(v.span());
            check.add(
                line,
                format!("hints.allow {other:?} is not supported; use \"everyone\" or \"admins\""),
            );
            false
        }
    }
}

/// `[shutdown]`.
pub(super) fn shutdown(s: &RawShutdown, check: &mut Checker<'_>) -> Shutdown {
    Shutdown {
        drain_grace: check
            .optional_ms(&s.drain_grace_ms, "shutdown.drain_grace_ms", 0)
            .unwrap_or_default(),
        drain_timeout: check.timeout(&s.drain_timeout_ms, "shutdown.drain_timeout_ms", 30_000),
    }
}

/// `[reload]`.
pub(super) fn reload(r: &RawReload, check: &mut Checker<'_>) -> Reload {
    Reload {
        watch: r.watch.unwrap_or(false),
        watch_interval: check.timeout(&r.watch_interval_ms, "reload.watch_interval_ms", 1000),
    }
}

/// `[failover]`.
pub(super) fn failover(f: &RawFailover, check: &mut Checker<'_>) -> Failover {
    Failover {
        hold: check
            .optional_ms(&f.hold_ms, "failover.hold_ms", 5000)
            .unwrap_or_default(),
        hold_max_statements: check.count(
            &f.hold_max_statements,
            "failover.hold_max_statements",
            1000,
            1,
        ),
    }
}

/// `[transactions]`; `legacy_scatter` is `[limits] allow_scatter_writes`.
pub(super) fn transactions(
    t: &RawTransactions,
    legacy_scatter: Option<bool>,
    check: &mut Checker<'_>,
) -> Transactions {
    let scatter_writes = match &t.scatter_writes {
        None => legacy_scatter.unwrap_or(true),
        Some(v) => match v.get_ref().trim() {
            "allow" => true,
            "refuse" => false,
            other => {
                let line = check.line(v.span());
                check.add(
                    line,
                    format!("transactions.scatter_writes {other:?} is not supported; use \"allow\" or \"refuse\""),
                );
                true
            }
        },
    };
    let cross_shard = match &t.cross_shard {
        None => CrossShard::Multi,
        Some(v) => match v.get_ref().trim() {
            "multi" => CrossShard::Multi,
            "two_phase" => CrossShard::TwoPhase,
            "refuse" => CrossShard::Refuse,
            other => {
                let line = check.line(v.span());
                check.add(
                    line,
                    format!("transactions.cross_shard {other:?} is not supported; use \"multi\", \"two_phase\" or \"refuse\""),
                );
                CrossShard::Multi
            }
        },
    };
    Transactions {
        cross_shard,
        lock_timeout: check.optional_ms(&t.lock_timeout_ms, "transactions.lock_timeout_ms", 10_000),
        scatter_writes,
        recovery_interval: check.timeout(
            &t.recovery_interval_ms,
            "transactions.recovery_interval_ms",
            10_000,
        ),
        recovery_grace: check
            .optional_ms(&t.recovery_grace_ms, "transactions.recovery_grace_ms", 5000)
            .unwrap_or_default(),
        test_fault: match &t.test_fault {
            None => None,
            Some(v) => match v.get_ref().as_str() {
                "after_prepare" => Some(TwoPhaseFault::AfterPrepare),
                "after_decision" => Some(TwoPhaseFault::AfterDecision),
                other => {
                    let line = check.line(v.span());
                    check.add(
                        line,
                        format!("transactions.test_fault {other:?} is not one of \"after_prepare\", \"after_decision\""),
                    );
                    None
                }
            },
        },
    }
}
