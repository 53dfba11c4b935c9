//! What the router's gauges read now, for `/metrics` and the admin console's `SHOW` tables:
//! the counters every worker folds in when asked, the shards' health, and the pools summed
//! over the workers.

use super::{Router, Routing};
use crate::stats::exposition::{FailoverSnapshot, PoolGauges, ShardState, Snapshot};

/// Everything `/metrics` shows, read now (every worker folds its counts first).
pub async fn snapshot(shared: &Router) -> Snapshot {
    let totals = shared.stats.harvest().await.without_windows();
    let routing = shared.routing();
    let shards = routing
        .map
        .shards()
        .iter()
        .enumerate()
        .map(|(i, s)| ShardState {
            range: s.range.to_string(),
            primary: s.primary.endpoint(),
            up: routing.health(i).is_up(),
        })
        .collect();
    let (plan_cache_hits, plan_cache_misses) =
        shared.stats.plan_cache(routing.planner.cache_stats());
    let load = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
    Snapshot {
        totals,
        ranges: shared.stats.ranges(),
        shards,
        pools: pool_gauges(&routing),
        clients: shared.clients.count() as u64,
        logging_in: shared.door.len() as u64,
        logins_closed: shared.door.closed_to_make_room(),
        clients_accepted: load(&shared.stats.clients_accepted),
        clients_refused: load(&shared.stats.clients_refused),
        shardmap_version: routing.map.version(),
        reloads: load(&shared.stats.reloads),
        reloads_refused: load(&shared.stats.reloads_refused),
        plan_cache_hits,
        plan_cache_misses,
        ready: shared.is_ready(),
        failover: {
            let f = &shared.stats.failover;
            FailoverSnapshot {
                held: load(&f.held),
                held_failed: load(&f.held_failed),
                held_micros: load(&f.held_micros),
                held_max_micros: load(&f.held_max_micros),
                resent: load(&f.resent),
            }
        },
    }
}

/// Each pool of the current routing, summed over the workers' own pools of its endpoint.
pub fn pool_gauges(routing: &Routing) -> Vec<PoolGauges> {
    let mut pools: Vec<PoolGauges> = Vec::new();
    for w in 0..routing.workers() {
        for pool in routing.pools_of(w).distinct() {
            let status = pool.status();
            let primary = pool.endpoint.name();
            let i = match pools.iter().position(|p| p.primary == primary) {
                Some(i) => i,
                None => {
                    pools.push(PoolGauges {
                        primary,
                        ..Default::default()
                    });
                    pools.len() - 1
                }
            };
            let p = &mut pools[i];
            p.open += status.size as u64;
            p.idle += status.available as u64;
            p.in_use += status.size.saturating_sub(status.available) as u64;
            p.waiting += status.waiting as u64;
            p.max += status.max_size as u64;
        }
    }
    pools
}
