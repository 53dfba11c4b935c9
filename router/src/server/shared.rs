//! What all client sessions of one router share: configuration, shard map, pools, planner,
//! the prepared-statement registry, and the table of clients for cancel requests.
//!
//! Nothing here is locked per statement: pools lock per host, the planner cache and the
//! statement registry per part, and the client table only on connect, disconnect and cancel.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use shardmap::ShardMap;

use super::clients::Clients;
use crate::backend::pool::{PoolSettings, Pools};
use crate::backend::registry::Registry;
use crate::config::Config;
use crate::planner::Planner;

thread_local! {
    /// Which worker thread this is (0 outside workers).
    static WORKER: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Marks the calling thread as worker `index` (its sessions use that worker's pools).
pub fn set_worker(index: usize) {
    WORKER.with(|w| w.set(index));
}

pub struct Shared {
    pub config: Config,
    pub map: Arc<ShardMap>,
    /// One set of pools per worker thread (see `server`): connections never cross threads.
    pools: Vec<Pools>,
    pub planner: Planner,
    pub statements: Registry,
    /// ParameterStatus values of a real backend, reported to clients at startup.
    pub server_params: RwLock<Vec<(String, String)>>,
    params_learned: AtomicBool,
    /// The shards' database collation is C (or POSIX): text compares by bytes.
    text_bytewise: AtomicBool,
    /// Every client, for cancel requests and the client limit.
    pub clients: Clients,
    /// Salts the fake SCRAM verifiers of unknown users, stable for this process.
    pub mock_key: [u8; 32],
    next_any: AtomicUsize,
}

impl Shared {
    /// Whether text sorts by its bytes on the shards (their collation is C), learned from the
    /// catalog; until known, no.
    pub fn text_bytewise(&self) -> bool {
        self.text_bytewise
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn learn_text_bytewise(&self, bytewise: bool) {
        self.text_bytewise
            .store(bytewise, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn new(config: Config, map: ShardMap, workers: usize) -> Shared {
        let settings = PoolSettings {
            max_size: config.pool.max_size,
            min_idle: config.pool.min_idle,
            idle_timeout: config.pool.idle_timeout,
            checkout_timeout: config.pool.checkout_timeout,
            connect_timeout: config.pool.connect_timeout,
            user: config.backend.user.clone(),
            password: config.backend.password.clone(),
            application_name: config.backend.application_name.clone(),
        };
        let map = Arc::new(map);
        Shared {
            pools: (0..workers.max(1))
                .map(|_| Pools::new(&map, &settings))
                .collect(),
            planner: Planner::new(map.clone(), config.limits.plan_cache_size),
            clients: Clients::new(config.router_id),
            map,
            config,
            statements: Registry::default(),
            server_params: RwLock::new(default_server_params()),
            params_learned: AtomicBool::new(false),
            text_bytewise: AtomicBool::new(false),
            mock_key: rand::random(),
            next_any: AtomicUsize::new(0),
        }
    }

    /// The pools of the calling worker thread.
    pub fn pools(&self) -> &Pools {
        &self.pools[WORKER.with(|w| w.get()) % self.pools.len()]
    }

    /// A connection to `shard` from this worker's pool, or the error a client gets for it
    /// (53300 when the pool stays busy, 08006/08001 when the shard cannot be reached).
    pub async fn checkout(
        &self,
        shard: usize,
    ) -> Result<crate::backend::pool::PooledConn, crate::protocol::reply::SqlError> {
        use crate::backend::pool::CheckoutError;
        let name = || self.map.shards()[shard].range.to_string();
        self.pools()
            .for_shard(shard)
            .get()
            .await
            .map_err(|e| match e {
                CheckoutError::Exhausted { endpoint, waited } => {
                    crate::errors::pool_exhausted(&name(), &endpoint, waited)
                }
                CheckoutError::Unreachable(e) => crate::errors::shard_unreachable(
                    &name(),
                    matches!(
                        e,
                        crate::backend::BackendError::Refused { .. }
                            | crate::backend::BackendError::NoPassword { .. }
                    ),
                    &e.to_string(),
                ),
            })
    }

    /// Number of worker threads (and sets of pools).
    pub fn workers(&self) -> usize {
        self.pools.len()
    }

    /// A shard for statements that touch no user table: round robin.
    pub fn any_shard(&self) -> usize {
        self.next_any.fetch_add(1, Ordering::Relaxed) % self.map.shards().len()
    }

    /// Remembers a real backend's ParameterStatus values (the first login wins).
    pub fn learn_server_params(&self, params: &[(String, String)]) {
        if self.params_learned.load(Ordering::Relaxed) || params.is_empty() {
            return;
        }
        *self
            .server_params
            .write()
            .unwrap_or_else(|p| p.into_inner()) = params.to_vec();
        self.params_learned.store(true, Ordering::Relaxed);
    }

    pub fn server_params_learned(&self) -> bool {
        self.params_learned.load(Ordering::Relaxed)
    }
}

/// Used until a backend has been reached (the first real login replaces them).
fn default_server_params() -> Vec<(String, String)> {
    [
        ("server_version", "15.0"),
        ("server_encoding", "UTF8"),
        ("client_encoding", "UTF8"),
        ("DateStyle", "ISO, MDY"),
        ("TimeZone", "UTC"),
        ("integer_datetimes", "on"),
        ("standard_conforming_strings", "on"),
        ("IntervalStyle", "postgres"),
        ("is_superuser", "off"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}
