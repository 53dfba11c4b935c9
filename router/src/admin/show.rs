//! The admin console's `SHOW` tables, read from what the router shares ([`Router`]). Column
//! names follow PgBouncer's where the concept is the same (`cl_active`, `sv_idle`,
//! `total_query_count`, ...), so its users feel at home.

use std::sync::Arc;
use std::time::SystemTime;

use crate::backend::ShardPool;
use crate::protocol::reply;
use crate::routing::clients::CancelTarget;
use crate::routing::snapshot::pool_gauges;
use crate::routing::{Router, Routing};
use crate::stats::Stats;

/// The first columns of `SHOW CLIENTS` and `SHOW SERVERS`, as PgBouncer's tables of those
/// names begin: one end of a link, whose address and port.
const LINK_COLUMNS: &[&str] = &["type", "user", "database", "state", "addr", "port"];

/// A table of text values, as every admin answer is.
pub struct Table {
    pub columns: Vec<&'static str>,
    pub rows: Vec<Vec<Option<String>>>,
}

impl Table {
    /// RowDescription, DataRows, CommandComplete.
    pub fn write(&self, out: &mut Vec<u8>) {
        reply::text_row_description(out, &self.columns);
        for row in &self.rows {
            let values: Vec<Option<&str>> = row.iter().map(|v| v.as_deref()).collect();
            reply::text_data_row(out, &values);
        }
        reply::command_complete(out, "SHOW");
    }
}

fn time(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

/// Where each client's connection is now: its target and the endpoint of its shard.
fn running(shared: &Router) -> Vec<(i32, CancelTarget, String, String)> {
    shared
        .clients
        .list()
        .into_iter()
        .filter_map(|(id, slot)| {
            let target = slot.running()?;
            let routing = shared.routing_of(target.generation)?;
            let endpoint = routing.pools().for_shard(target.shard).endpoint.name();
            Some((id, target, routing.shard_name(target.shard), endpoint))
        })
        .collect()
}

/// The pool (of this worker) of the primary `host:port/database`.
fn pool_of<'r>(routing: &'r Routing, endpoint: &str) -> Option<&'r ShardPool> {
    (0..routing.map.shards().len())
        .map(|s| &**routing.pools().for_shard(s))
        .find(|p| p.endpoint.name() == endpoint)
}

pub fn shards(shared: &Router) -> Table {
    let routing = shared.routing();
    let pools = pool_gauges(&routing);
    let rows = routing
        .map
        .shards()
        .iter()
        .enumerate()
        .map(|(i, shard)| {
            let range = shard.range.to_string();
            let health = routing.health(i);
            let state = if shared.pauses.is_paused(&range) {
                "paused"
            } else if health.is_up() {
                "up"
            } else if health.answered() || health.last_error().is_some() {
                "down"
            } else {
                "unknown"
            };
            let endpoint = shard.primary.endpoint();
            let pool = pools.iter().find(|p| p.primary == endpoint);
            let error = health.last_error();
            vec![
                Some(i.to_string()),
                Some(range.clone()),
                Some(endpoint),
                Some(state.to_string()),
                error.as_ref().map(|(_, why)| why.clone()),
                error.as_ref().map(|(at, _)| time(*at)),
                pool.map(|p| p.open.to_string()),
                pool.map(|p| p.in_use.to_string()),
                pool.map(|p| p.waiting.to_string()),
                Some(shared.pauses.waiting(&range).to_string()),
            ]
        })
        .collect();
    Table {
        columns: vec![
            "shard",
            "range",
            "primary",
            "state",
            "last_error",
            "last_error_time",
            "sv_open",
            "sv_active",
            "cl_waiting",
            "cl_paused",
        ],
        rows,
    }
}

pub fn pools(shared: &Router) -> Table {
    let routing = shared.routing();
    let running = running(shared);
    let rows = pool_gauges(&routing)
        .into_iter()
        .map(|p| {
            let pool = pool_of(&routing, &p.primary);
            let shards: Vec<String> = routing
                .map
                .shards()
                .iter()
                .filter(|s| s.primary.endpoint() == p.primary)
                .map(|s| s.range.to_string())
                .collect();
            let active = running.iter().filter(|r| r.3 == p.primary).count();
            vec![
                pool.map(|x| x.endpoint.database.clone()),
                pool.map(|x| x.endpoint.host.clone()),
                pool.map(|x| x.endpoint.port.to_string()),
                pool.map(|x| x.endpoint.user.clone()),
                Some(shards.join(" ")),
                Some(active.to_string()),
                Some(p.waiting.to_string()),
                Some(p.in_use.to_string()),
                Some(p.idle.to_string()),
                Some(p.open.to_string()),
                Some(p.max.to_string()),
                Some("transaction".to_string()),
            ]
        })
        .collect();
    Table {
        columns: vec![
            "database",
            "host",
            "port",
            "user",
            "shards",
            "cl_active",
            "cl_waiting",
            "sv_active",
            "sv_idle",
            "sv_open",
            "pool_size",
            "pool_mode",
        ],
        rows,
    }
}

pub fn clients(shared: &Router) -> Table {
    let running = running(shared);
    let rows = shared
        .clients
        .list()
        .into_iter()
        .filter_map(|(id, slot)| {
            let info = slot.info()?.clone();
            let on = running.iter().find(|r| r.0 == id);
            Some(vec![
                Some("C".to_string()),
                Some(info.user),
                Some(info.database),
                Some(if on.is_some() { "active" } else { "idle" }.to_string()),
                Some(info.addr.ip().to_string()),
                Some(info.addr.port().to_string()),
                Some(time(info.connected)),
                Some(info.application_name),
                Some(if info.tls { "yes" } else { "no" }.to_string()),
                Some(id.to_string()),
                on.map(|r| r.2.clone()),
                on.map(|r| r.1.pid.to_string()),
            ])
        })
        .collect();
    Table {
        columns: [
            LINK_COLUMNS,
            &[
                "connect_time",
                "application_name",
                "tls",
                "id",
                "shard",
                "remote_pid",
            ],
        ]
        .concat(),
        rows,
    }
}

pub fn servers(shared: &Router) -> Table {
    let routing = shared.routing();
    let mut rows: Vec<Vec<Option<String>>> = running(shared)
        .into_iter()
        .map(|(client, target, shard, endpoint)| {
            server_row(
                &routing,
                "active",
                &endpoint,
                target.pid,
                Some(shard),
                Some(client),
            )
        })
        .collect();
    rows.extend(shared_rows(&routing));
    for w in 0..routing.workers() {
        for pool in routing.pools_of(w).distinct() {
            for (pid, _idle_for) in pool.idle() {
                rows.push(server_row(
                    &routing,
                    "idle",
                    &pool.endpoint.name(),
                    pid,
                    None,
                    None,
                ));
            }
        }
    }
    for row in &mut rows {
        // `worker` and `load` are the shared connections' (empty for the others).
        row.resize(LINK_COLUMNS.len() + 5, None);
    }
    Table {
        columns: [
            LINK_COLUMNS,
            &["remote_pid", "shard", "link", "worker", "load"],
        ]
        .concat(),
        rows,
    }
}

/// One row per shared connection (`[pool] shared_connections`): `shared`, the shard, the
/// worker thread whose sessions use it first, and the requests it has queued or running.
fn shared_rows(routing: &Routing) -> Vec<Vec<Option<String>>> {
    let mut seen: Vec<*const crate::backend::mux::ShardMux> = Vec::new();
    let mut rows = Vec::new();
    for shard in 0..routing.map.shards().len() {
        let Some(mux) = routing.mux(shard) else {
            continue;
        };
        if seen.contains(&Arc::as_ptr(mux)) {
            continue;
        }
        seen.push(Arc::as_ptr(mux));
        let endpoint = mux.endpoint.name();
        for (pid, worker, load) in mux.lane_loads() {
            let shard = Some(routing.shard_name(shard));
            let mut row = server_row(routing, "shared", &endpoint, pid, shard, None);
            row.extend([Some(worker.to_string()), Some(load.to_string())]);
            rows.push(row);
        }
    }
    rows
}

fn server_row(
    routing: &Routing,
    state: &str,
    endpoint: &str,
    pid: i32,
    shard: Option<String>,
    client: Option<i32>,
) -> Vec<Option<String>> {
    let pool = pool_of(routing, endpoint);
    vec![
        Some("S".to_string()),
        pool.map(|p| p.endpoint.user.clone()),
        pool.map(|p| p.endpoint.database.clone()),
        Some(state.to_string()),
        pool.map(|p| p.endpoint.host.clone()),
        pool.map(|p| p.endpoint.port.to_string()),
        Some(pid.to_string()),
        shard,
        client.map(|c| c.to_string()),
    ]
}

pub async fn stats(shared: &Router) -> Table {
    let routing = shared.routing();
    // Copied out, so the workers' folds are not held up while the histograms are merged.
    let shards: Vec<_> = {
        let totals = shared.stats.harvest().await;
        (0..routing.map.shards().len())
            .map(|i| totals.shard(routing.stats_id(i)))
            .collect()
    };
    let now = Stats::now_secs();
    let micros = |secs: f64| format!("{}", (secs * 1e6).round() as u64);
    let rows = routing
        .map
        .shards()
        .iter()
        .zip(shards)
        .map(|(shard, s)| {
            let count = s.requests.ok + s.requests.failed;
            let minute = s.window.last_minute(now);
            let quantile = |q: f64| minute.as_ref().map(|h| h.value_at_quantile(q).to_string());
            vec![
                Some(shard.range.to_string()),
                Some(shard.primary.endpoint()),
                Some(count.to_string()),
                Some(s.requests.failed.to_string()),
                Some(micros(s.requests.latency.sum)),
                Some(micros(s.wait.sum)),
                Some(if count == 0 {
                    "0".to_string()
                } else {
                    micros(s.requests.latency.sum / count as f64)
                }),
                Some(minute.as_ref().map_or(0, |h| h.len()).to_string()),
                quantile(0.5),
                quantile(0.99),
            ]
        })
        .collect();
    Table {
        columns: vec![
            "shard",
            "primary",
            "total_query_count",
            "total_error_count",
            "total_query_time",
            "total_wait_time",
            "avg_query_time",
            "last_minute_query_count",
            "last_minute_p50_us",
            "last_minute_p99_us",
        ],
        rows,
    }
}

/// Settings a reload cannot change.
const NEED_RESTART: [&str; 6] = [
    "listen",
    "router_id",
    "http.listen",
    "workers",
    // The file watcher's tick is set when the router starts.
    "reload.watch_interval_ms",
    // The listening sockets are bound once, at start.
    "reuse_port",
];

fn file(f: Option<&crate::config::FileSetting>) -> String {
    f.map_or(String::new(), |f| f.path.display().to_string())
}

/// `SHOW CONFIG`: every setting of the running config, and whether a reload can change it.
pub fn config(shared: &Router) -> Table {
    let routing = shared.routing();
    let c = &routing.config;
    let settings = [
        identity_settings(c, routing.map.version()),
        pool_settings(c),
        life_settings(c, shared.workers()),
    ]
    .concat();
    Table {
        columns: vec!["key", "value", "changeable"],
        rows: settings
            .into_iter()
            .map(|(k, v)| {
                vec![
                    Some(k.to_string()),
                    Some(v),
                    Some(
                        if NEED_RESTART.contains(&k) {
                            "no"
                        } else {
                            "yes"
                        }
                        .to_string(),
                    ),
                ]
            })
            .collect(),
    }
}

fn ms(d: std::time::Duration) -> String {
    d.as_millis().to_string()
}

fn opt_ms(d: Option<std::time::Duration>) -> String {
    d.map_or("0".to_string(), ms)
}

/// Where the router listens, what it routes with, who logs in, and how it reaches the shards.
fn identity_settings(c: &crate::config::Config, map_version: u64) -> Vec<(&'static str, String)> {
    let users: Vec<String> = c
        .users
        .iter()
        .map(|u| {
            if u.admin {
                format!("{} (admin)", u.name)
            } else {
                u.name.clone()
            }
        })
        .collect();
    vec![
        ("listen", c.listen.to_string()),
        ("router_id", c.router_id.to_string()),
        (
            "http.listen",
            c.http.map_or("off".to_string(), |a| a.to_string()),
        ),
        ("shardmap", c.shardmap.display().to_string()),
        ("shardmap.version", map_version.to_string()),
        ("database", c.database.clone()),
        (
            "auth",
            match c.auth {
                crate::config::AuthMethod::ScramSha256 => "scram-sha-256",
                crate::config::AuthMethod::Trust => "trust",
            }
            .to_string(),
        ),
        ("users", users.join(", ")),
        ("backend.user", c.backend.user.clone()),
        (
            "backend.password",
            if c.backend.password.is_some() {
                "(set)"
            } else {
                "(none)"
            }
            .to_string(),
        ),
        (
            "backend.application_name",
            c.backend.application_name.clone(),
        ),
        ("backend.sslmode", c.backend.sslmode.name().to_string()),
        ("backend.ca", file(c.backend.ca.as_ref())),
        ("tls.mode", c.tls.mode.name().to_string()),
        ("tls.cert", file(c.tls.cert.as_ref())),
        ("tls.key", file(c.tls.key.as_ref())),
    ]
}

/// The pools and the limits.
fn pool_settings(c: &crate::config::Config) -> Vec<(&'static str, String)> {
    vec![
        ("pool.max_size", c.pool.max_size.to_string()),
        ("pool.min_idle", c.pool.min_idle.to_string()),
        ("pool.connect_timeout_ms", ms(c.pool.connect_timeout)),
        ("pool.checkout_timeout_ms", ms(c.pool.checkout_timeout)),
        ("pool.idle_timeout_ms", opt_ms(c.pool.idle_timeout)),
        ("pool.pause_timeout_ms", ms(c.pool.pause_timeout)),
        ("pool.warm_connections", c.pool.warm_connections.to_string()),
        ("pool.warm_timeout_ms", ms(c.pool.warm_timeout)),
        ("limits.max_clients", c.limits.max_clients.to_string()),
        (
            "limits.statement_timeout_ms",
            opt_ms(c.limits.statement_timeout),
        ),
        (
            "limits.plan_cache_size",
            c.limits.plan_cache_size.to_string(),
        ),
        ("limits.slow_statement_ms", opt_ms(c.limits.slow_statement)),
        (
            "limits.max_merge_groups",
            c.limits.max_merge_groups.to_string(),
        ),
        ("limits.max_logins", c.limits.max_logins.to_string()),
        (
            "limits.max_logins_per_address",
            c.limits.max_logins_per_address.to_string(),
        ),
        (
            "limits.max_logins_per_address_exempt",
            c.limits
                .max_logins_per_address_exempt
                .iter()
                .map(|n| n.to_string())
                .collect::<Vec<_>>()
                .join(", "),
        ),
        ("limits.startup_timeout_ms", ms(c.limits.startup_timeout)),
        ("limits.login_timeout_ms", ms(c.limits.login_timeout)),
        (
            "limits.max_prepared_bytes",
            c.limits.max_prepared_bytes.to_string(),
        ),
        (
            "limits.max_merge_bytes",
            c.limits.max_merge_bytes.to_string(),
        ),
        (
            "limits.merge_memory_bytes",
            c.limits.merge_memory_bytes.to_string(),
        ),
        (
            "limits.plan_cache_bytes",
            c.limits.plan_cache_bytes.to_string(),
        ),
        (
            "limits.max_message_bytes",
            c.limits.max_message_bytes.to_string(),
        ),
        ("limits.max_plan_bytes", c.limits.max_plan_bytes.to_string()),
    ]
}

/// Shutdown, reloads, failover holding, transactions across shards, the fleet, the workers.
fn life_settings(c: &crate::config::Config, workers: usize) -> Vec<(&'static str, String)> {
    vec![
        ("shutdown.drain_grace_ms", ms(c.shutdown.drain_grace)),
        ("shutdown.drain_timeout_ms", ms(c.shutdown.drain_timeout)),
        ("reload.watch", c.reload.watch.to_string()),
        ("reload.watch_interval_ms", ms(c.reload.watch_interval)),
        ("failover.hold_ms", ms(c.failover.hold)),
        (
            "failover.hold_max_statements",
            c.failover.hold_max_statements.to_string(),
        ),
        (
            "transactions.cross_shard",
            match c.transactions.cross_shard {
                crate::config::CrossShard::Multi => "multi",
                crate::config::CrossShard::TwoPhase => "two_phase",
                crate::config::CrossShard::Refuse => "refuse",
            }
            .to_string(),
        ),
        (
            "transactions.lock_timeout_ms",
            opt_ms(c.transactions.lock_timeout),
        ),
        (
            "transactions.scatter_writes",
            if c.transactions.scatter_writes {
                "allow"
            } else {
                "refuse"
            }
            .to_string(),
        ),
        (
            "peers",
            c.peers
                .iter()
                .map(|p| format!("{}={}", p.id, p.address))
                .collect::<Vec<_>>()
                .join(", "),
        ),
        ("workers", workers.to_string()),
        ("reuse_port", c.reuse_port.to_string()),
    ]
}

pub fn version() -> Table {
    Table {
        columns: vec!["version"],
        rows: vec![vec![Some(format!(
            "shardgate {}",
            env!("CARGO_PKG_VERSION")
        ))]],
    }
}

pub fn help() -> Table {
    Table {
        columns: vec!["command", "what"],
        rows: super::command::HELP
            .iter()
            .map(|(c, w)| vec![Some(c.to_string()), Some(w.to_string())])
            .collect(),
    }
}
