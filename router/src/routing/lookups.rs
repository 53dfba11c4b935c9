//! Lookup tables on the shards (`lookup = { email = "text" }` in the shard map,
//! [`shardmap::Lookup`]): made on every shard, and read to route a statement by a unique column
//! other than the key.
//!
//! A lookup table is itself sharded by the value it maps, so its rows spread over the fleet as
//! the rows of any sharded table, an online split moves them with the rest, and finding a
//! value's row costs one point read on one shard. Its primary key is the value: a value taken
//! by a row on another shard fails the INSERT that writes it again with `23505`, as a unique
//! index over the whole table would. Its rows hold keyspace IDs, not shards, so nothing in it
//! changes when a shard is split. Writes keep it (`crate::resolver`'s lookup entries, in the
//! same write as the rows).

use shardmap::sql::{quote_ident, quote_literal};
use shardmap::{KeyspaceId, Lookup, ShardMap, Table};

use crate::backend::BackendConn;
use crate::errors;
use crate::protocol::reply::SqlError;
use crate::routing::Routing;

/// The SQL that makes the lookup table of `table`'s `lookup` on one shard, under a
/// transaction-level advisory lock so that routers starting together do not collide on the
/// catalog's unique index. Its primary key is named as Postgres names a unique constraint of
/// the table itself (`users_email_key`), so a duplicate reads as one would.
pub fn schema_sql(table: &Table, lookup: &Lookup) -> String {
    let lt = table.lookup_table(lookup);
    format!(
        "BEGIN; SELECT pg_advisory_xact_lock(hashtext({lock})); \
         CREATE SCHEMA IF NOT EXISTS shardgate; \
         CREATE TABLE IF NOT EXISTS {name} ({column} {ty} NOT NULL, keyspace_id bigint NOT NULL, \
         CONSTRAINT {constraint} PRIMARY KEY ({column})); COMMIT",
        lock = quote_literal(&lt.qualified_name()),
        name = lt.quoted_name(),
        column = quote_ident(&lookup.column),
        ty = lookup.key_type.name(),
        constraint = quote_ident(&format!("{}_{}_key", table.name, lookup.column)),
    )
}

/// Makes every lookup table of `map` on one shard; `Err` with a sentence for the operator.
pub async fn prepare_shard(
    conn: &mut BackendConn,
    map: &ShardMap,
    shard: &str,
) -> Result<(), String> {
    for (table, lookup, lt) in map.lookup_tables() {
        let answer = conn
            .simple_query(&schema_sql(table, lookup))
            .await
            .map_err(|e| format!("shard {shard}: creating {}: {e}", lt.qualified_name()))?;
        if let Some((code, message)) = answer.error {
            return Err(format!(
                "shard {shard}: creating {}: {message} ({code})",
                lt.qualified_name()
            ));
        }
    }
    Ok(())
}

impl Routing {
    /// The keyspace ID that lookup table `name`'s row holds, read with `sql` on `shard` as
    /// committed now (`crate::resolver::lookups::entry_sql`); `None` when there is no row.
    pub async fn lookup_entry(
        &self,
        shard: usize,
        sql: &str,
        name: &str,
    ) -> Result<Option<KeyspaceId>, SqlError> {
        let mut conn = self.checkout_own(shard).await?;
        let answer = conn.simple_query(sql).await.map_err(|e| {
            SqlError::new(
                errors::CONNECTION_FAILURE,
                format!(
                    "the router could not read the lookup table {name} on shard {}: {e}",
                    self.shard_name(shard)
                ),
            )
        })?;
        if let Some((code, message)) = answer.error {
            return Err(SqlError::with_code(
                code,
                format!("reading the lookup table {name}: {message}"),
            ));
        }
        match answer.first_column.first() {
            None => Ok(None),
            Some(id) => id
                .parse::<i64>()
                .map(|id| Some(KeyspaceId(id as u64)))
                .map_err(|_| {
                    errors::internal(format!(
                        "the lookup table {name} holds {id:?}, not a keyspace ID"
                    ))
                }),
        }
    }
}
