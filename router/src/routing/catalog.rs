//! What the router learns from a shard's catalog: where each sharded table's key sits among its
//! columns, so that `INSERT INTO kv VALUES (...)` without a column list can be routed, and
//! whether the database's collation sorts text by bytes (which merges across shards need). Every
//! shard has the same schema (DDL on sharded tables reaches all of them), so the default shard
//! answers for all. Learned at start, for each reloaded shard map, and again after each DDL that
//! the router broadcasts.

use std::collections::HashMap;

use crate::backend::BackendConn;
use crate::routing::Routing;
use shardmap::sql::quote_literal;

/// Reads the column order of every sharded table and hands the key positions to the routing's
/// planner, and whether text sorts by bytes; `false` when the shard could not be asked, which
/// leaves the planner as it was (INSERTs then need a column list). Uses a connection of its own
/// (not a pooled one), so it can run on any thread, for a routing not yet in use.
pub async fn learn(routing: &Routing) -> bool {
    let shard = routing.map.default_shard();
    let endpoint = routing.pools_of(0).for_shard(shard).endpoint.clone();
    let mut conn = match BackendConn::connect(&endpoint).await {
        Ok(conn) => conn,
        Err(e) => {
            tracing::warn!(shard = %routing.shard_name(shard), "could not read the catalog: {e}");
            return false;
        }
    };
    // Text sorts by bytes only under the C collation; the merge of ORDER BY / min / max of text
    // across shards needs that.
    match first_column(&mut conn, TEXT_BYTEWISE).await {
        Ok(c) => routing.learn_text_bytewise(c.first().map(String::as_str) == Some("t")),
        Err(e) => {
            tracing::warn!("could not read the database collation: {e}");
            return false;
        }
    }
    let mut positions = HashMap::new();
    for table in routing.map.tables() {
        let name = table.qualified_name();
        let sql = format!(
            "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass({}) AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
            quote_literal(&name)
        );
        match first_column(&mut conn, &sql).await {
            Ok(columns) => {
                if let Some(p) = columns.iter().position(|c| *c == table.key) {
                    positions.insert(name, p);
                }
            }
            Err(e) => {
                tracing::warn!("could not read the column order of {name}: {e}");
                return false;
            }
        }
    }
    tracing::debug!(tables = positions.len(), "learned key positions");
    routing.planner.learn_key_positions(positions);
    true
}

/// Whether text compares by its bytes everywhere: the database's collation is C or POSIX from
/// the libc provider (an ICU database can say `C` in `datcollate`), and no user column has a
/// collation of its own. Fails (so: no) on a Postgres without `datlocprovider` (before 15).
const TEXT_BYTEWISE: &str = "SELECT datlocprovider = 'c' AND datcollate IN ('C', 'POSIX') \
    AND NOT EXISTS (SELECT 1 FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid \
    JOIN pg_namespace n ON n.oid = c.relnamespace \
    WHERE a.attnum > 0 AND a.attcollation NOT IN (0, 100, 950, 951) \
    AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg_toast%') \
    FROM pg_database WHERE datname = current_database()";

/// The first column of every row of a simple query, as text (empty when it fails).
async fn first_column(
    conn: &mut crate::backend::BackendConn,
    sql: &str,
) -> std::io::Result<Vec<String>> {
    let answer = conn.simple_query(sql).await?;
    Ok(if answer.error.is_some() {
        Vec::new()
    } else {
        answer.first_column
    })
}
