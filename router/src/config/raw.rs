//! `router.toml` as it is written: every value `Spanned` so a problem can name its line, and
//! optional so that a missing setting is reported in our words rather than serde's. The
//! sections in [`super::sections`] turn this into the checked [`super::Config`].

use serde::Deserialize;
use toml::Spanned;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    pub(super) listen: Option<Spanned<String>>,
    pub(super) shardmap: Option<Spanned<String>>,
    pub(super) database: Option<Spanned<String>>,
    pub(super) auth: Option<Spanned<String>>,
    #[serde(default)]
    pub(super) users: Vec<Spanned<RawUser>>,
    #[serde(default)]
    pub(super) backend: RawBackend,
    #[serde(default)]
    pub(super) pool: RawPool,
    #[serde(default)]
    pub(super) limits: RawLimits,
    #[serde(default)]
    pub(super) shutdown: RawShutdown,
    #[serde(default)]
    pub(super) reload: RawReload,
    #[serde(default)]
    pub(super) http: RawHttp,
    #[serde(default)]
    pub(super) failover: RawFailover,
    #[serde(default)]
    pub(super) transactions: RawTransactions,
    pub(super) tls: Option<Spanned<RawTls>>,
    pub(super) router_id: Option<Spanned<i64>>,
    #[serde(default)]
    pub(super) peers: Vec<Spanned<RawPeer>>,
    pub(super) reuse_port: Option<bool>,
    #[serde(default)]
    pub(super) log: RawLog,
    #[serde(default)]
    pub(super) hints: RawHints,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPeer {
    pub(super) id: Spanned<i64>,
    pub(super) address: Spanned<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawUser {
    pub(super) name: Option<Spanned<String>>,
    pub(super) password: Option<Spanned<String>>,
    pub(super) admin: Option<bool>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawBackend {
    pub(super) user: Option<Spanned<String>>,
    pub(super) password: Option<Spanned<String>>,
    pub(super) application_name: Option<Spanned<String>>,
    pub(super) sslmode: Option<Spanned<String>>,
    pub(super) ca: Option<Spanned<String>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPool {
    pub(super) max_size: Option<Spanned<i64>>,
    pub(super) min_idle: Option<Spanned<i64>>,
    pub(super) connect_timeout_ms: Option<Spanned<i64>>,
    pub(super) checkout_timeout_ms: Option<Spanned<i64>>,
    pub(super) idle_timeout_ms: Option<Spanned<i64>>,
    pub(super) pause_timeout_ms: Option<Spanned<i64>>,
    pub(super) warm_connections: Option<Spanned<i64>>,
    pub(super) warm_timeout_ms: Option<Spanned<i64>>,
    pub(super) shared_connections: Option<Spanned<i64>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLimits {
    pub(super) max_clients: Option<Spanned<i64>>,
    pub(super) statement_timeout_ms: Option<Spanned<i64>>,
    pub(super) plan_cache_size: Option<Spanned<i64>>,
    pub(super) slow_statement_ms: Option<Spanned<i64>>,
    pub(super) allow_scatter_writes: Option<bool>,
    pub(super) max_merge_groups: Option<Spanned<i64>>,
    pub(super) max_logins: Option<Spanned<i64>>,
    pub(super) max_logins_per_address: Option<Spanned<i64>>,
    pub(super) max_logins_per_address_exempt: Option<Vec<Spanned<String>>>,
    pub(super) startup_timeout_ms: Option<Spanned<i64>>,
    pub(super) login_timeout_ms: Option<Spanned<i64>>,
    pub(super) max_prepared_bytes: Option<Spanned<i64>>,
    pub(super) max_merge_bytes: Option<Spanned<i64>>,
    pub(super) merge_memory_bytes: Option<Spanned<i64>>,
    pub(super) plan_cache_bytes: Option<Spanned<i64>>,
    pub(super) max_message_bytes: Option<Spanned<i64>>,
    pub(super) max_plan_bytes: Option<Spanned<i64>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawShutdown {
    pub(super) drain_grace_ms: Option<Spanned<i64>>,
    pub(super) drain_timeout_ms: Option<Spanned<i64>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawReload {
    pub(super) watch: Option<bool>,
    pub(super) watch_interval_ms: Option<Spanned<i64>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawFailover {
    pub(super) hold_ms: Option<Spanned<i64>>,
    pub(super) hold_max_statements: Option<Spanned<i64>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTransactions {
    pub(super) cross_shard: Option<Spanned<String>>,
    pub(super) lock_timeout_ms: Option<Spanned<i64>>,
    pub(super) scatter_writes: Option<Spanned<String>>,
    pub(super) recovery_interval_ms: Option<Spanned<i64>>,
    pub(super) recovery_grace_ms: Option<Spanned<i64>>,
    pub(super) test_fault: Option<Spanned<String>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLog {
    pub(super) format: Option<Spanned<String>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawHints {
    pub(super) allow: Option<Spanned<String>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawHttp {
    pub(super) listen: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTls {
    pub(super) mode: Option<Spanned<String>>,
    pub(super) cert: Option<Spanned<String>>,
    pub(super) key: Option<Spanned<String>>,
}
