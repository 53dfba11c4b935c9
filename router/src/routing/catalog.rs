//! What the router learns from a shard's catalog: where each sharded table's key sits among its
//! columns, so that `INSERT INTO kv VALUES (...)` without a column list can be routed; whether
//! the key takes its values from a sequence, so that an INSERT that leaves it out gets keys from
//! the router (`super::ids`); and whether the database's collation sorts text by bytes (which
//! merges across shards need). Every
//! shard has the same schema (DDL on sharded tables reaches all of them), so the default shard
//! answers for all. Learned at start, for each reloaded shard map, and again after each DDL that
//! the router broadcasts.

use std::collections::HashMap;

use crate::backend::BackendConn;
use crate::planner::{KeyDefault, TableFacts};
use crate::routing::Routing;
use shardmap::sql::quote_literal;

/// Reads the column order and the key's default of every sharded table and hands them to the
/// routing's planner, and whether text sorts by bytes; `false` when the shard could not be
/// asked, which leaves the planner as it was (INSERTs then need a column list and the key). Uses a connection of its own
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
    match first_column(&mut conn, PLAIN_COLLATIONS).await {
        Ok(c) => routing.learn_plain_collations(c.first().map(String::as_str) == Some("t")),
        Err(e) => {
            tracing::warn!("could not read the columns' collations: {e}");
            return false;
        }
    }
    let mut tables = HashMap::new();
    for table in routing.map.tables() {
        let name = table.qualified_name();
        match facts(&mut conn, table).await {
            Ok(facts) => {
                tables.insert(name, facts);
            }
            Err(e) => {
                tracing::warn!("could not read the columns of {name}: {e}");
                return false;
            }
        }
    }
    for reference in routing.map.references() {
        let name = reference.qualified_name();
        match per_shard_defaults(&mut conn, &reference.quoted_name()).await {
            Ok(columns) => {
                tables.insert(
                    name,
                    TableFacts {
                        per_shard_defaults: columns,
                        ..TableFacts::default()
                    },
                );
            }
            Err(e) => {
                tracing::warn!("could not read the column defaults of {name}: {e}");
                return false;
            }
        }
    }
    tracing::debug!(tables = tables.len(), "learned the tables' columns");
    routing.planner.learn_tables(tables);
    true
}

/// Where `table`'s key is among its columns and where its values come from when an INSERT
/// leaves it out (nothing known when the table does not exist).
async fn facts(conn: &mut BackendConn, table: &shardmap::Table) -> std::io::Result<TableFacts> {
    // As SQL writes it (a mixed-case name quoted), for to_regclass.
    let name = quote_literal(&table.quoted_name());
    let columns = format!(
        "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass({name}) AND attnum > 0 AND NOT attisdropped ORDER BY attnum"
    );
    let columns = first_column(conn, &columns).await?;
    let key_position = columns.iter().position(|c| *c == table.key);
    let default = format!(
        "SELECT CASE WHEN a.attidentity = 'a' THEN 'always' \
         WHEN a.attidentity = 'd' OR pg_get_expr(d.adbin, d.adrelid) LIKE 'nextval(%' THEN 'sequence' \
         ELSE 'none' END \
         FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum \
         WHERE a.attrelid = to_regclass({name}) AND a.attname = {}",
        quote_literal(&table.key)
    );
    let key_default = match first_column(conn, &default)
        .await?
        .first()
        .map(String::as_str)
    {
        Some("always") => KeyDefault::Always,
        Some("sequence") => KeyDefault::Sequence,
        _ => KeyDefault::None,
    };
    Ok(TableFacts {
        key_position,
        columns,
        key_default,
        per_shard_defaults: Vec::new(),
    })
}

/// The columns of reference table `name` (as SQL writes it) and their positions whose default would differ
/// between shards: identity columns, and defaults that name a function that is not immutable
/// (`nextval`, `now`, `random`, ...; any function of that name, to be safe) or a SQL value
/// function (`CURRENT_TIMESTAMP`, `CURRENT_USER`, ...).
async fn per_shard_defaults(
    conn: &mut BackendConn,
    name: &str,
) -> std::io::Result<Vec<(String, usize)>> {
    let sql = PER_SHARD_DEFAULTS.replace("$1", &quote_literal(name));
    Ok(first_column(conn, &sql)
        .await?
        .iter()
        .filter_map(|c| {
            let (pos, column) = c.split_once(':')?;
            Some((column.to_string(), pos.parse().ok()?))
        })
        .collect())
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

/// Whether no user column has a collation of its own (other than the database's default):
/// text carried in a VALUES list then compares as the column's did (`crate::planner::staged`).
const PLAIN_COLLATIONS: &str = "SELECT NOT EXISTS (SELECT 1 FROM pg_attribute a \
    JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace \
    WHERE a.attnum > 0 AND a.attcollation NOT IN (0, 100) \
    AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg_toast%')";

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

/// The columns of reference table `$1` (a literal) whose default differs per shard, as
/// `position:name`.
const PER_SHARD_DEFAULTS: &str = r"SELECT pos || ':' || attname FROM (
    SELECT a.attname, row_number() OVER (ORDER BY a.attnum) - 1 AS pos,
        a.attidentity <> '' OR coalesce(
            pg_get_expr(d.adbin, d.adrelid) ~* '\m(current_date|current_time|current_timestamp|localtime|localtimestamp|current_user|current_role|session_user|user|current_catalog|current_schema)\M'
            OR EXISTS (SELECT 1 FROM regexp_matches(pg_get_expr(d.adbin, d.adrelid), '([A-Za-z_][A-Za-z0-9_$]*)\(', 'g') AS m(f)
                JOIN pg_proc p ON p.proname = lower(m.f[1]) WHERE p.provolatile <> 'i'),
            false) AS per_shard
    FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
    WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped) t
WHERE per_shard";
