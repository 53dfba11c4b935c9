//! What a reload replaces as a whole: the config, the shard map, the planner made for that map,
//! and every worker's pools. One `Routing` is current ([`super::Router::routing`]); a session
//! takes the current one whenever it is at rest (no transaction, no batch, no connection), so a
//! reload takes effect for new statements at once while a transaction in progress finishes on
//! the routing it started with. An old routing, and with it the pools of shards that are gone,
//! is dropped when its last session lets go.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use shardmap::ShardMap;

use super::pause::Pauses;
use crate::backend::health::{Health, HealthBoard};
use crate::backend::mux::ShardMux;
use crate::backend::pool::{PoolSettings, Pools};
use crate::backend::worker::worker;
use crate::backend::Endpoint;
use crate::config::Config;
use crate::planner::Planner;
use crate::stats::{FailoverCounters, Stats};
use crate::tls::Material;

pub struct Routing {
    /// Counts reloads from 1; a session compares it to see whether it should switch.
    pub generation: u64,
    pub config: Config,
    pub map: Arc<ShardMap>,
    pub planner: Planner,
    /// The certificates read for this config: the acceptor new clients get, the connector of
    /// the pools.
    pub tls: Material,
    /// One set of pools per worker thread: connections never cross threads.
    pub(super) pools: Vec<Pools>,
    /// The shards' database collation is C (or POSIX): text compares by bytes.
    text_bytewise: AtomicBool,
    /// No user column has a collation of its own: text in a VALUES list (the database's
    /// collation) compares as the columns' text does.
    plain_collations: AtomicBool,
    /// Each shard's stats id (by shard index).
    stats_ids: Vec<u32>,
    /// Each shard's primary's health (by shard index).
    pub(super) health: Vec<Arc<Health>>,
    pub(super) pauses: Arc<Pauses>,
    pub(super) failover: Arc<FailoverCounters>,
    /// Each shard's shared connections (`[pool] shared_connections`), one set per endpoint for
    /// the whole router; empty when off.
    muxes: Vec<Arc<ShardMux>>,
    /// New keys in hand for INSERTs that leave the key out.
    pub(super) ids: super::ids::Ids,
}

/// What routings share with the rest of the process: the counters and what is known of each
/// primary's health, both kept across reloads.
pub struct Board<'a> {
    pub stats: &'a Stats,
    pub health: &'a HealthBoard,
    pub pauses: &'a Arc<Pauses>,
}

/// How the config sizes and logs in the pools.
pub fn pool_settings(config: &Config, tls: &Material) -> PoolSettings {
    PoolSettings {
        max_size: config.pool.max_size,
        min_idle: config.pool.min_idle,
        idle_timeout: config.pool.idle_timeout,
        checkout_timeout: config.pool.checkout_timeout,
        connect_timeout: config.pool.connect_timeout,
        user: config.backend.user.clone(),
        password: config.backend.password.clone(),
        application_name: config.backend.application_name.clone(),
        tls: tls.backend.clone(),
    }
}

impl Routing {
    /// A routing for `config` and `map` (and the TLS material read for `config`) with
    /// `workers` sets of pools; with `previous`, the pools whose endpoints did not change keep
    /// their connections.
    pub fn new(
        config: Config,
        map: ShardMap,
        tls: Material,
        workers: usize,
        generation: u64,
        previous: Option<&Routing>,
        board: Board<'_>,
    ) -> Routing {
        let settings = pool_settings(&config, &tls);
        let map = Arc::new(map);
        let stats_ids = map
            .shards()
            .iter()
            .map(|s| board.stats.shard_id(&s.range.to_string()))
            .collect();
        let health = map
            .shards()
            .iter()
            .map(|s| board.health.of(&s.primary.endpoint()))
            .collect();
        let pools = (0..workers.max(1))
            .map(|w| Pools::new(&map, &settings, previous.map(|p| p.pools_of(w))))
            .collect();
        let muxes = muxes(
            &map,
            &config,
            &settings,
            previous,
            board.health,
            workers.max(1),
        );
        Routing {
            ids: super::ids::Ids::new(&map),
            generation,
            planner: Planner::with_limits(
                map.clone(),
                config.limits.plan_cache_size,
                config.limits.plan_cache_bytes,
            )
            .parsing_at_most(config.limits.max_plan_bytes),
            map,
            config,
            tls,
            pools,
            text_bytewise: AtomicBool::new(
                previous.is_some_and(|p| p.text_bytewise.load(Ordering::Relaxed)),
            ),
            plain_collations: AtomicBool::new(
                previous.is_some_and(|p| p.plain_collations.load(Ordering::Relaxed)),
            ),

            stats_ids,
            health,
            pauses: board.pauses.clone(),
            failover: board.stats.failover.clone(),
            muxes,
        }
    }

    /// Whether a statement may go to `shard`'s shared connections now: its primary is up (or
    /// not tried yet) and the shard is not paused (a statement for a paused or unreachable shard takes the way
    /// of a connection of its own, which waits).
    pub fn shareable_now(&self, shard: usize) -> bool {
        let health = &self.health[shard];
        (health.is_up() || !health.answered())
            && !(self.pauses.any() && self.pauses.is_paused(&self.shard_name(shard)))
    }

    /// Shard `shard`'s shared connections, when `[pool] shared_connections` is on.
    pub fn mux(&self, shard: usize) -> Option<&Arc<ShardMux>> {
        self.muxes.get(shard)
    }

    /// The pools of the calling worker thread.
    pub fn pools(&self) -> &Pools {
        self.pools_of(worker())
    }

    /// The pools of worker `w`.
    pub fn pools_of(&self, w: usize) -> &Pools {
        &self.pools[w % self.pools.len()]
    }

    /// Number of worker threads (and sets of pools).
    pub fn workers(&self) -> usize {
        self.pools.len()
    }

    /// A shard's range, as operators and errors name it.
    pub fn shard_name(&self, shard: usize) -> String {
        self.map
            .shards()
            .get(shard)
            .map_or_else(|| format!("#{shard}"), |s| s.range.to_string())
    }

    /// Shard `shard`'s stats id ([`Stats::shard_id`]).
    pub fn stats_id(&self, shard: usize) -> u32 {
        self.stats_ids
            .get(shard)
            .copied()
            .unwrap_or(crate::stats::NO_SHARD)
    }

    /// The health of shard `shard`'s primary.
    pub fn health(&self, shard: usize) -> &Arc<Health> {
        &self.health[shard]
    }

    /// Whether text sorts by its bytes on the shards (their collation is C), learned from the
    /// catalog; until known, no.
    pub fn text_bytewise(&self) -> bool {
        self.text_bytewise.load(Ordering::Relaxed)
    }

    pub fn learn_text_bytewise(&self, bytewise: bool) {
        self.text_bytewise.store(bytewise, Ordering::Relaxed);
    }

    /// Whether text of a column compares as text of the database's collation does (no user
    /// column has a collation of its own, or all text compares by bytes), learned from the
    /// catalog; until known, no.
    pub fn plain_collations(&self) -> bool {
        self.text_bytewise() || self.plain_collations.load(Ordering::Relaxed)
    }

    pub fn learn_plain_collations(&self, plain: bool) {
        self.plain_collations.store(plain, Ordering::Relaxed);
    }
}

/// The shared connections of `map`'s endpoints (none when `[pool] shared_connections` is 0):
/// those of an endpoint whose login and limit did not change are kept from `previous`, with
/// their connections.
fn muxes(
    map: &ShardMap,
    config: &Config,
    settings: &PoolSettings,
    previous: Option<&Routing>,
    health: &HealthBoard,
    workers: usize,
) -> Vec<Arc<ShardMux>> {
    let limit = config.pool.shared_connections;
    if limit == 0 {
        return Vec::new();
    }
    let mut by_endpoint: std::collections::HashMap<String, Arc<ShardMux>> = previous
        .map(|p| {
            p.muxes
                .iter()
                .map(|m| (m.endpoint.name(), m.clone()))
                .collect()
        })
        .unwrap_or_default();
    let mut made: std::collections::HashMap<String, Arc<ShardMux>> = Default::default();
    map.shards()
        .iter()
        .map(|shard| {
            let endpoint = Endpoint::for_primary(&shard.primary, settings);
            let name = endpoint.name();
            made.entry(name.clone())
                .or_insert_with(|| match by_endpoint.remove(&name) {
                    Some(kept) if kept.endpoint.same_login(&endpoint) && kept.limit() == limit => {
                        kept
                    }
                    _ => Arc::new(ShardMux::new(
                        endpoint,
                        limit,
                        workers,
                        health.of(&shard.primary.endpoint()),
                    )),
                })
                .clone()
        })
        .collect()
}
