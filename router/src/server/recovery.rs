//! Two-phase commit's side of the router process (`[transactions] cross_shard = "two_phase"`):
//! at start, every shard that can be reached must allow prepared transactions and gets the
//! decisions table; then, once at start and every `recovery_interval_ms`, prepared
//! transactions left in doubt by a router that stopped are resolved
//! (`crate::multishard::two_phase::recover`). A pass that saw one not yet past
//! `recovery_grace_ms` runs again as soon as it is.

use std::collections::HashSet;
use std::sync::Arc;

use crate::backend::BackendConn;
use crate::config::CrossShard;
use crate::multishard::two_phase;
use crate::routing::{Router, Routing};

/// Refuses to start (the error) when a shard that answers does not allow prepared
/// transactions; a shard that cannot be reached now is prepared by the first recovery pass
/// that reaches it.
pub async fn check_shards(routing: &Routing) -> Result<(), String> {
    for shard in 0..routing.map.shards().len() {
        let endpoint = &routing.pools_of(0).for_shard(shard).endpoint;
        match BackendConn::connect(endpoint).await {
            Ok(mut conn) => two_phase::prepare_shard(&mut conn, &routing.shard_name(shard)).await?,
            Err(e) => {
                tracing::warn!(shard = %routing.shard_name(shard), "cannot check now that the shard allows prepared transactions: {e}")
            }
        }
    }
    Ok(())
}

/// Runs until the process exits (on worker 0, whose pools it uses).
pub async fn run(shared: Arc<Router>) {
    // Shard databases known to have the decisions table.
    let mut ready: HashSet<String> = HashSet::new();
    loop {
        let routing = shared.routing();
        let config = &routing.config.transactions;
        let mut pause = config.recovery_interval;
        if config.cross_shard == CrossShard::TwoPhase {
            prepare_new_shards(&routing, &mut ready).await;
            let done = two_phase::recover(&routing, config.recovery_grace).await;
            // A transaction in doubt that is not old enough yet is resolved as soon as it is,
            // not a whole interval later: its rows stay locked until then.
            if let Some(due) = done.next_due {
                pause = pause.min(due + std::time::Duration::from_millis(50));
            }
            if (done.committed, done.rolled_back, done.left) != (0, 0, 0) {
                tracing::info!(
                    committed = done.committed,
                    rolled_back = done.rolled_back,
                    left = done.left,
                    "recovery of prepared transactions"
                );
            }
        }
        drop(routing);
        tokio::time::sleep(pause).await;
    }
}

async fn prepare_new_shards(routing: &Routing, ready: &mut HashSet<String>) {
    for shard in 0..routing.map.shards().len() {
        let url = routing.map.shards()[shard].primary.url().to_string();
        if ready.contains(&url) {
            continue;
        }
        let Ok(mut conn) = routing.checkout_own(shard).await else {
            continue;
        };
        match two_phase::prepare_shard(&mut conn, &routing.shard_name(shard)).await {
            Ok(()) => {
                ready.insert(url);
            }
            Err(why) => tracing::error!("{why}"),
        }
    }
}
