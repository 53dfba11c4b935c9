//! Lookup tables' side of the router process: at start, every shard that answers gets the
//! lookup tables of the shard map (`crate::routing::lookups`); then, every few seconds, shards
//! that could not be reached, and lookups a reload added, get theirs.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use crate::backend::BackendConn;
use crate::routing::{lookups, Router, Routing};

/// Refuses to start (the error) when a shard that answers cannot get its lookup tables; a
/// shard that cannot be reached now gets them from [`run`] once it can.
pub async fn check_shards(routing: &Routing) -> Result<(), String> {
    if routing.map.lookup_tables().next().is_none() {
        return Ok(());
    }
    for shard in 0..routing.map.shards().len() {
        let endpoint = &routing.pools_of(0).for_shard(shard).endpoint;
        match BackendConn::connect(endpoint).await {
            Ok(mut conn) => {
                lookups::prepare_shard(&mut conn, &routing.map, &routing.shard_name(shard)).await?
            }
            Err(e) => {
                tracing::warn!(shard = %routing.shard_name(shard), "cannot make the lookup tables now: {e}")
            }
        }
    }
    Ok(())
}

/// Runs until the process exits (on worker 0, whose pools it uses).
pub async fn run(shared: Arc<Router>) {
    // (shard database, lookup table) pairs known to exist.
    let mut ready: HashSet<(String, String)> = HashSet::new();
    loop {
        let routing = shared.routing();
        prepare_new(&routing, &mut ready).await;
        drop(routing);
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
}

async fn prepare_new(routing: &Routing, ready: &mut HashSet<(String, String)>) {
    let names: Vec<String> = routing
        .map
        .lookup_tables()
        .map(|(_, _, lt)| lt.qualified_name())
        .collect();
    for shard in 0..routing.map.shards().len() {
        let url = routing.map.shards()[shard].primary.url().to_string();
        if names
            .iter()
            .all(|n| ready.contains(&(url.clone(), n.clone())))
        {
            continue;
        }
        // A connection of its own, closed after: the pools' sizes are the clients' business.
        let endpoint = &routing.pools_of(0).for_shard(shard).endpoint;
        let Ok(mut conn) = BackendConn::connect(endpoint).await else {
            continue;
        };
        match lookups::prepare_shard(&mut conn, &routing.map, &routing.shard_name(shard)).await {
            Ok(()) => ready.extend(names.iter().map(|n| (url.clone(), n.clone()))),
            Err(why) => tracing::error!("{why}"),
        }
    }
}
