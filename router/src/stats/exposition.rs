//! `/metrics`: a [`Snapshot`] of the router's counters and gauges in the Prometheus text
//! format (OpenMetrics flavour), encoded by `prometheus-client`. Pure: the snapshot is taken
//! by the server (`crate::server::http`), this only writes it.
//!
//! Every name and label is documented in `docs/operations.md`; keep the two in step.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use super::totals::{Buckets, Totals};
use super::RouteKind;

/// One backend pool, summed over the worker threads (each has its own).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolGauges {
    /// `host:port/database`.
    pub primary: String,
    pub open: u64,
    pub idle: u64,
    pub in_use: u64,
    /// Requests waiting for a connection.
    pub waiting: u64,
    pub max: u64,
}

/// One shard of the current shard map.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ShardState {
    pub range: String,
    pub primary: String,
    pub up: bool,
}

/// Everything `/metrics` shows, read at one moment.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// Without the last-minute windows.
    pub totals: Totals,
    /// Shard ranges by stats id.
    pub ranges: Vec<String>,
    pub shards: Vec<ShardState>,
    pub pools: Vec<PoolGauges>,
    pub clients: u64,
    /// Connections accepted that have not logged in yet.
    pub logging_in: u64,
    /// Connections closed before they logged in to make room for newer ones.
    pub logins_closed: u64,
    pub clients_accepted: u64,
    pub clients_refused: u64,
    pub shardmap_version: u64,
    pub reloads: u64,
    pub reloads_refused: u64,
    pub plan_cache_hits: u64,
    pub plan_cache_misses: u64,
    pub ready: bool,
    /// What holding statements for unreachable shards did.
    pub failover: FailoverSnapshot,
}

/// [`crate::stats::FailoverCounters`], read at one moment.
#[derive(Clone, Debug, Default)]
pub struct FailoverSnapshot {
    pub held: u64,
    pub held_failed: u64,
    pub held_micros: u64,
    pub held_max_micros: u64,
    pub resent: u64,
}

type Labels = Vec<(&'static str, String)>;

/// The Prometheus text for `snapshot`.
pub fn render(snapshot: Snapshot) -> String {
    let mut registry = Registry::with_prefix("shardgate");
    registry.register_collector(Box::new(Exposition(snapshot)));
    let mut text = String::new();
    // Writing to a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut text, &registry);
    text
}

#[derive(Debug)]
struct Exposition(Snapshot);

/// Writes one metric family: its name, help and type, then one sample per label set (or its
/// only sample, when that has no labels).
fn family<T>(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    kind: MetricType,
    samples: impl IntoIterator<Item = (Labels, T)>,
    mut write: impl FnMut(T, prometheus_client::encoding::MetricEncoder<'_>) -> std::fmt::Result,
) -> std::fmt::Result {
    let mut metric = encoder.encode_descriptor(name, help, None, kind)?;
    for (labels, value) in samples {
        if labels.is_empty() {
            // A metric without labels has one sample.
            return write(value, metric);
        }
        write(value, metric.encode_family(&labels)?)?;
    }
    Ok(())
}

fn counter(
    e: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    samples: impl IntoIterator<Item = (Labels, u64)>,
) -> std::fmt::Result {
    family(e, name, help, MetricType::Counter, samples, |v, m| {
        ConstCounter::new(v).encode(m)
    })
}

fn gauge(
    e: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    samples: impl IntoIterator<Item = (Labels, u64)>,
) -> std::fmt::Result {
    family(e, name, help, MetricType::Gauge, samples, |v, m| {
        ConstGauge::new(i64::try_from(v).unwrap_or(i64::MAX)).encode(m)
    })
}

fn histogram<'b>(
    e: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    samples: impl IntoIterator<Item = (Labels, &'b Buckets)>,
) -> std::fmt::Result {
    family(e, name, help, MetricType::Histogram, samples, |b, mut m| {
        m.encode_histogram::<NoLabelSet>(b.sum, b.count, &b.per_bucket(), None)
    })
}

fn one(value: u64) -> [(Labels, u64); 1] {
    [(Vec::new(), value)]
}

impl Collector for Exposition {
    fn encode(&self, mut e: DescriptorEncoder<'_>) -> std::fmt::Result {
        let s = &self.0;
        statements(&mut e, s)?;
        clients(&mut e, s)?;
        pools(&mut e, s)?;
        routing(&mut e, s)?;
        failover(&mut e, s)
    }
}

/// Requests by route and by shard, their latency, the wait for a pooled connection, and the
/// errors clients got.
fn statements(e: &mut DescriptorEncoder<'_>, s: &Snapshot) -> std::fmt::Result {
    let t = &s.totals;
    let range = |id: usize| s.ranges.get(id).cloned().unwrap_or_default();
    let kinds = || RouteKind::ALL.iter().map(|&k| (k, &t.kinds[k as usize]));
    counter(
        e,
        "statements",
        "Client requests (a Query, or extended-protocol messages up to Sync) that ended with ReadyForQuery, by route and outcome.",
        kinds().flat_map(|(k, r)| {
            [
                (vec![("route", k.label().to_string()), ("outcome", "ok".to_string())], r.ok),
                (vec![("route", k.label().to_string()), ("outcome", "error".to_string())], r.failed),
            ]
        }),
    )?;
    histogram(
        e,
        "statement_duration_seconds",
        "Time from a request's first message to its ReadyForQuery, by route.",
        kinds().map(|(k, r)| (vec![("route", k.label().to_string())], &r.latency)),
    )?;
    let shards = || {
        t.shards
            .iter()
            .enumerate()
            .filter(|(_, s)| s.requests.latency.count > 0)
    };
    counter(
        e,
        "shard_statements",
        "Single-shard requests by shard (key range) and outcome.",
        shards().flat_map(|(id, s)| {
            [
                (
                    vec![("shard", range(id)), ("outcome", "ok".to_string())],
                    s.requests.ok,
                ),
                (
                    vec![("shard", range(id)), ("outcome", "error".to_string())],
                    s.requests.failed,
                ),
            ]
        }),
    )?;
    histogram(
        e,
        "shard_statement_duration_seconds",
        "Time from a single-shard request's first message to its ReadyForQuery, by shard.",
        shards().map(|(id, s)| (vec![("shard", range(id))], &s.requests.latency)),
    )?;
    histogram(
        e,
        "pool_checkout_wait_seconds",
        "Time a request waited for a backend connection from its shard's pool.",
        shards()
            .filter(|(_, s)| s.wait.count > 0)
            .map(|(id, s)| (vec![("shard", range(id))], &s.wait)),
    )?;
    counter(
        e,
        "errors",
        "Error responses sent to clients, by SQLSTATE class (the first two characters).",
        t.errors.iter().map(|(class, n)| {
            (
                vec![("class", String::from_utf8_lossy(class).into_owned())],
                *n,
            )
        }),
    )?;
    Ok(())
}

/// Client bytes and connections.
fn clients(e: &mut DescriptorEncoder<'_>, s: &Snapshot) -> std::fmt::Result {
    let t = &s.totals;
    counter(
        e,
        "client_bytes_received",
        "Bytes read from clients.",
        one(t.bytes_in),
    )?;
    counter(
        e,
        "client_bytes_sent",
        "Bytes written to clients.",
        one(t.bytes_out),
    )?;
    gauge(
        e,
        "client_connections",
        "Clients connected now.",
        one(s.clients),
    )?;
    gauge(
        e,
        "client_logins_in_progress",
        "Connections accepted that have not finished logging in.",
        one(s.logging_in),
    )?;
    counter(
        e,
        "client_logins_closed",
        "Connections closed before they logged in to make room for newer ones: max_logins or max_logins_per_address were logging in, or the router ran out of file descriptors (also counted in client_connections_refused).",
        one(s.logins_closed),
    )?;
    counter(
        e,
        "client_connections_accepted",
        "Clients that logged in since the router started.",
        one(s.clients_accepted),
    )?;
    counter(
        e,
        "client_connections_refused",
        "Connections refused: too many clients, a failed login, TLS required, a drain, or closed before they logged in (silent past startup_timeout_ms, slower than login_timeout_ms, or the oldest when max_logins were logging in).",
        one(s.clients_refused),
    )?;
    Ok(())
}

/// The pools, summed over the workers.
fn pools(e: &mut DescriptorEncoder<'_>, s: &Snapshot) -> std::fmt::Result {
    let pools = |f: fn(&PoolGauges) -> u64| {
        s.pools
            .iter()
            .map(move |p| (vec![("primary", p.primary.clone())], f(p)))
            .collect::<Vec<_>>()
    };
    gauge(
        e,
        "pool_open_connections",
        "Backend connections open, per pool (host:port/database).",
        pools(|p| p.open),
    )?;
    gauge(
        e,
        "pool_idle_connections",
        "Backend connections idle in the pool.",
        pools(|p| p.idle),
    )?;
    gauge(
        e,
        "pool_in_use_connections",
        "Backend connections held by clients.",
        pools(|p| p.in_use),
    )?;
    gauge(
        e,
        "pool_waiting_clients",
        "Requests waiting for a connection.",
        pools(|p| p.waiting),
    )?;
    gauge(
        e,
        "pool_max_connections",
        "The pools' size limit (summed over worker threads).",
        pools(|p| p.max),
    )?;
    Ok(())
}

/// The shards' health, the plan cache, the shard map and its reloads, readiness.
fn routing(e: &mut DescriptorEncoder<'_>, s: &Snapshot) -> std::fmt::Result {
    gauge(
        e,
        "shard_up",
        "1 when the shard's primary answered the last connection attempt, 0 when it failed.",
        s.shards.iter().map(|sh| {
            (
                vec![("shard", sh.range.clone()), ("primary", sh.primary.clone())],
                u64::from(sh.up),
            )
        }),
    )?;
    counter(
        e,
        "plan_cache_hits",
        "Statements planned from the plan cache.",
        one(s.plan_cache_hits),
    )?;
    counter(
        e,
        "plan_cache_misses",
        "Statements parsed and planned.",
        one(s.plan_cache_misses),
    )?;
    gauge(
        e,
        "shardmap_version",
        "Version of the shard map in use.",
        one(s.shardmap_version),
    )?;
    counter(e, "reloads", "Reloads that took effect.", one(s.reloads))?;
    counter(
        e,
        "reloads_refused",
        "Reloads refused (invalid files); the running config stayed.",
        one(s.reloads_refused),
    )?;
    gauge(
        e,
        "ready",
        "1 when /ready answers 200.",
        one(u64::from(s.ready)),
    )?;
    Ok(())
}

/// What holding statements through restarts and failovers did (`[failover]`).
fn failover(e: &mut DescriptorEncoder<'_>, s: &Snapshot) -> std::fmt::Result {
    let f = &s.failover;
    counter(
        e,
        "failover_held_statements",
        "Statements that waited for an unreachable shard ([failover] hold_ms).",
        one(f.held),
    )?;
    counter(
        e,
        "failover_held_failed_statements",
        "Held statements that failed in the end (the window passed, or too many were held).",
        one(f.held_failed),
    )?;
    counter(
        e,
        "failover_held_milliseconds",
        "Time statements waited for unreachable shards, summed.",
        one(f.held_micros / 1000),
    )?;
    gauge(
        e,
        "failover_held_max_milliseconds",
        "The longest any statement waited for an unreachable shard since the start.",
        one(f.held_max_micros / 1000),
    )?;
    counter(
        e,
        "failover_resent_statements",
        "Statements sent again because a shard's shutdown aborted them before they ran.",
        one(f.resent),
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::local::Log;
    use crate::stats::meter::Request;
    use std::time::{Duration, Instant};

    #[test]
    fn renders_counters_histograms_and_gauges() {
        let mut log = Log::default();
        for failed in [false, false, true] {
            log.requests.push(Request {
                started: Instant::now(),
                kind: RouteKind::SingleShard,
                shard: 1,
                failed,
                waited: Some(Duration::from_micros(10)),
                elapsed: Duration::from_micros(700),
                bytes_in: 0,
                bytes_out: 0,
            });
        }
        log.errors.push(*b"42");
        let mut totals = Totals::default();
        totals.fold(&mut log, 0);
        let text = render(Snapshot {
            totals,
            ranges: vec!["-80".into(), "80-".into()],
            pools: vec![PoolGauges {
                primary: "db:5432/app".into(),
                open: 3,
                idle: 1,
                in_use: 2,
                waiting: 0,
                max: 8,
            }],
            clients: 4,
            shardmap_version: 7,
            ..Default::default()
        });
        for line in [
            "shardgate_statements_total{route=\"single_shard\",outcome=\"ok\"} 2",
            "shardgate_statements_total{route=\"single_shard\",outcome=\"error\"} 1",
            "shardgate_statements_total{route=\"scatter\",outcome=\"ok\"} 0",
            "shardgate_shard_statements_total{shard=\"80-\",outcome=\"ok\"} 2",
            "shardgate_shard_statement_duration_seconds_bucket{le=\"0.0005\",shard=\"80-\"} 0",
            "shardgate_shard_statement_duration_seconds_bucket{le=\"0.001\",shard=\"80-\"} 3",
            "shardgate_shard_statement_duration_seconds_count{shard=\"80-\"} 3",
            "shardgate_errors_total{class=\"42\"} 1",
            "shardgate_pool_in_use_connections{primary=\"db:5432/app\"} 2",
            "shardgate_client_connections 4",
            "shardgate_shardmap_version 7",
            "# EOF",
        ] {
            assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
        }
        assert!(
            !text.contains("shard=\"-80\""),
            "a shard that served nothing"
        );
    }
}
