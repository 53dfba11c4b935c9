//! Lookup tables' side of the router process: at start, every shard that answers gets the
//! lookup tables of the shard map (`crate::routing::lookups`); then, every few seconds, shards
//! that could not be reached, and lookups a reload added, get theirs.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use shardmap::sql::quote_ident;

use crate::backend::BackendConn;
use crate::routing::{lookups, Router, Routing};

/// Refuses to start (the error) when a shard that answers cannot get its lookup tables, or
/// when a lookup was declared on a table that holds values but has no lookup row anywhere (its
/// rows would be missed by reads that find another row's lookup row); a shard that cannot be
/// reached now gets its tables from [`run`] once it can.
pub async fn check_shards(routing: &Routing) -> Result<(), String> {
    let names: Vec<(String, String, String)> = routing
        .map
        .lookup_tables()
        .map(|(t, l, lt)| (t.quoted_name(), quote_ident(&l.column), lt.quoted_name()))
        .collect();
    if names.is_empty() {
        return Ok(());
    }
    // For each lookup: some shard's table has a value; some shard has a lookup row.
    let mut seen = vec![(false, false); names.len()];
    for shard in 0..routing.map.shards().len() {
        let endpoint = &routing.pools_of(0).for_shard(shard).endpoint;
        let mut conn = match BackendConn::connect(endpoint).await {
            Ok(conn) => conn,
            Err(e) => {
                tracing::warn!(shard = %routing.shard_name(shard), "cannot make the lookup tables now: {e}");
                continue;
            }
        };
        lookups::prepare_shard(&mut conn, &routing.map, &routing.shard_name(shard)).await?;
        for (table, lookup, _) in routing.map.lookup_tables() {
            column_fits(&mut conn, table, lookup).await?;
        }
        for ((table, column, lookup), seen) in names.iter().zip(&mut seen) {
            let sql = format!(
                "SELECT EXISTS (SELECT 1 FROM {table} WHERE {column} IS NOT NULL)::int || ':' || EXISTS (SELECT 1 FROM {lookup})::int"
            );
            let answer = conn.simple_query(&sql).await.map_err(|e| e.to_string())?;
            if let Some(both) = answer.first_column.first() {
                seen.0 |= both.starts_with("1:");
                seen.1 |= both.ends_with(":1");
            }
        }
    }
    let empty = names
        .iter()
        .zip(&seen)
        .find(|(_, (values, rows))| *values && !*rows);
    if let Some(((table, column, lookup), _)) = empty {
        return Err(format!(
            "the lookup of {table}.{column} is empty while the table holds values of {column}: rows written before the lookup was declared have no lookup rows, and reads by {column} would miss them. Fill {lookup} first (docs/shardmap.md, \"Lookup columns\"), or remove the lookup from the shard map"
        ));
    }
    Ok(())
}

/// Refuses (the error) a lookup column whose values would not hash as the map says: another
/// type than the declared one (`citext`, `char(n)`, `numeric`) or a collation under which
/// values that differ in bytes are equal. A table the shard does not have yet is let through.
async fn column_fits(
    conn: &mut BackendConn,
    table: &shardmap::Table,
    lookup: &shardmap::Lookup,
) -> Result<(), String> {
    let sql = format!(
        "SELECT t.typname || ':' || coalesce(c.collisdeterministic::text, 'true') \
         FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid \
         LEFT JOIN pg_collation c ON c.oid = a.attcollation \
         WHERE a.attrelid = to_regclass({}) AND a.attname = {} AND NOT a.attisdropped",
        shardmap::sql::quote_literal(&table.quoted_name()),
        shardmap::sql::quote_literal(&lookup.column)
    );
    let answer = conn.simple_query(&sql).await.map_err(|e| e.to_string())?;
    let Some(found) = answer.first_column.first() else {
        return Ok(());
    };
    let (type_name, deterministic) = found.split_once(':').unwrap_or((found, "true"));
    let fits = match lookup.key_type {
        shardmap::KeyType::Text => matches!(type_name, "text" | "varchar"),
        shardmap::KeyType::Uuid => type_name == "uuid",
        _ => matches!(type_name, "int2" | "int4" | "int8"),
    };
    if fits && deterministic == "true" {
        return Ok(());
    }
    Err(format!(
        "the lookup column {}.{} is {type_name}{}, and the shard map declares it {}: the router hashes values as the declared type compares them, so equal values could be routed apart; declare a column of that type with a deterministic collation",
        table.qualified_name(),
        lookup.column,
        if deterministic == "true" { "" } else { " with a non-deterministic collation" },
        lookup.key_type
    ))
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
