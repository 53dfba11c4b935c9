//! The prober: logs in to every primary that nobody has reached yet or that is down, so that
//! `/ready` turns 200 once every shard has answered and a primary that comes back is seen as
//! up even before a client asks for it. Primaries that are up are not probed: the checkouts of
//! client statements keep their health current without extra connections (a fleet of routers
//! probing every primary every few seconds would cost each primary a fork per probe).

use std::sync::Arc;
use std::time::Duration;

use super::Router;
use crate::backend::BackendConn;

/// How often unknown or down primaries are tried, before and after the router is ready.
const UNTIL_READY: Duration = Duration::from_millis(500);
const WHEN_READY: Duration = Duration::from_secs(5);

/// Runs until the process exits.
pub async fn run(shared: Arc<Router>) {
    loop {
        let routing = shared.routing();
        let mut probes = tokio::task::JoinSet::new();
        for pool in routing.pools_of(0).distinct() {
            let name = pool.endpoint.name();
            let health = shared.health.of(&name);
            if health.is_up() {
                continue;
            }
            let endpoint = pool.endpoint.clone();
            probes.spawn(async move {
                match BackendConn::connect(&endpoint).await {
                    Ok(_) => health.up(|| name),
                    Err(e) => health.down(&name, &e.to_string()),
                }
            });
        }
        while probes.join_next().await.is_some() {}
        let answered =
            (0..routing.map.shards().len()).all(|shard| routing.health(shard).answered());
        let ready = answered && shared.is_warmed();
        if ready {
            shared.set_ready();
        }
        drop(routing);
        let pause = if ready { WHEN_READY } else { UNTIL_READY };
        tokio::time::sleep(pause).await;
    }
}
