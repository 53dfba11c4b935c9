//! What the plan says: the destination a statement's plan gives with its values and the
//! shard map, before the rules of the moment (`super::allowed`: the protocol, the
//! transaction). Every statement of a simple Query must agree on one shard; a statement that
//! runs on several shards, or that the router answers, stands alone.

use std::sync::Arc;

use shardmap::{Key, KeyspaceId, ShardMap};

use super::allowed::{in_transaction, protocol};
use super::split::{split_insert, split_unnest};
use super::target::{Dest, Read, Why, Write};
use super::{range, transaction_control, Context, Resolved, Statement};
use crate::errors;
use crate::planner::{KeySource, Merge, NewRows, Plan, Route};
use crate::protocol::reply::SqlError;

/// The target the plan alone gives (before the transaction's rules).
pub(super) fn by_plan<'a>(
    stmt: &Statement<'a>,
    cx: &Context<'a>,
) -> Result<Resolved<'a>, SqlError> {
    protocol(stmt)?;
    if let Some(alone) = alone(stmt, cx)? {
        return Ok(alone);
    }
    if let Some(broadcast) = broadcast(stmt.plan, cx)? {
        return Ok((broadcast, None));
    }
    if let Some(control) = transaction_control(stmt.plan) {
        return Ok((control, None));
    }
    one_shard(stmt, cx)
}

/// A statement that is the only one of its text and runs on several shards, or that the
/// router answers: its destination (`None` for anything else).
fn alone<'a>(stmt: &Statement<'a>, cx: &Context<'a>) -> Result<Option<Resolved<'a>>, SqlError> {
    let map = cx.map;
    let dest = match stmt.plan.statements.as_slice() {
        [Route::ScatterWrite { message, .. }] if !cx.allow_scatter_writes => {
            return Err(SqlError::new(
                errors::FEATURE_NOT_SUPPORTED,
                message.clone(),
            ));
        }
        [Route::ScatterWrite { .. }] => Dest::Write(Write {
            shards: (0..map.shards().len()).collect(),
            keyed: false,
            replicas: false,
        }),
        [Route::Replicated { table }] if stmt.params.any_text(crate::planner::moving_date) => {
            return Err(SqlError::new(
                errors::FEATURE_NOT_SUPPORTED,
                format!("a write of the reference table {table} runs on every shard, and a value 'now', 'today', 'tomorrow' or 'yesterday' is read as a date when each shard runs it: send the date itself"),
            ));
        }
        [Route::Replicated { .. }] => Dest::Write(Write {
            shards: (0..map.shards().len()).collect(),
            keyed: false,
            replicas: true,
        }),
        [Route::Scatter { merge, .. }] => {
            spread(stmt, map, merge, (0..map.shards().len()).collect(), false)?
        }
        [Route::PreparedSql] => Dest::PreparedSql,
        [Route::ExplainRoute(_)] => Dest::ExplainRoute,
        [Route::Declare {
            name,
            hold,
            binary,
            query,
        }] => Dest::Declare {
            name: name.clone(),
            hold: *hold,
            binary: *binary,
            query: Box::new(declared(stmt, query, cx)?),
        },
        [Route::Cursor { name, close }] => Dest::Cursor {
            name: name.clone(),
            close: *close,
        },
        [Route::NewKeys {
            table,
            key,
            key_type,
            rows,
            always,
        }] => Dest::NewKeys(super::target::NewKeys {
            table: table.clone(),
            key: key.clone(),
            key_type: *key_type,
            rows: new_rows(stmt, rows)?,
            always: *always,
            shard: None,
        }),
        [Route::Lookup {
            table,
            lookup,
            value,
            without,
        }] => super::lookups::by_lookup(stmt, cx, table, lookup, value, without)?,
        [Route::WithLookups { route, rows }] => {
            return super::lookups::insert(stmt, cx, route, rows).map(Some)
        }
        [Route::DeletesLookups {
            route,
            key_type,
            returning,
            lookups,
        }] => super::lookups::delete(stmt, cx, route, *key_type, returning, lookups)?,
        [Route::UpdatesLookups {
            route,
            key_type,
            qualifier,
            key,
            lookups,
        }] => super::lookups::update(stmt, cx, route, qualifier, key, *key_type, lookups)?,
        [Route::CopyIn(rows)] => Dest::CopyIn(*rows),
        _ => return Ok(None),
    };
    Ok(Some((dest, None)))
}

/// How many rows an INSERT that leaves out its key has: its VALUES rows, or its longest UNNEST
/// array's elements (a NULL array has none).
fn new_rows(stmt: &Statement<'_>, rows: &NewRows) -> Result<usize, SqlError> {
    let arrays = match rows {
        NewRows::Values(n) => return Ok(*n),
        NewRows::Unnest(arrays) => arrays,
    };
    let mut most = 0;
    for source in arrays {
        if let Some((format, value)) = stmt.params.raw(source)? {
            let elements = crate::planner::arrays::Elements::parse(format, value)
                .map_err(|e| SqlError::new(errors::INVALID_TEXT_REPRESENTATION, e))?;
            most = most.max(elements.len());
        }
    }
    Ok(most)
}

/// Where the query of `DECLARE ... CURSOR FOR query` runs: the text after FOR, planned as
/// part of the whole text (its literals are numbered alike: the head of a DECLARE has none).
fn declared<'a>(stmt: &Statement<'a>, query: &Route, cx: &Context<'a>) -> Result<Dest, SqlError> {
    let at = crate::planner::cursor::declare_query(stmt.sql)
        .ok_or_else(|| SqlError::new(errors::SYNTAX_ERROR, "DECLARE needs CURSOR FOR a query"))?;
    let plan = Plan {
        statements: vec![query.clone()],
        normalized: stmt.plan.normalized,
        use_original: false,
        shareable: false,
        keeps_connection: false,
    };
    let inner = Statement {
        sql: &stmt.sql[at..],
        plan: &plan,
        params: stmt.params,
    };
    let (query, _) = in_transaction(by_plan(&inner, cx)?, cx)?;
    // A cursor's query is placed now, without reading a lookup row.
    let query = match query {
        Dest::Lookup(by) => *by.without,
        other => other,
    };
    if matches!(&query, Dest::Read(r) if r.staged.is_some()) {
        return Err(SqlError::new(
            errors::FEATURE_NOT_SUPPORTED,
            "a cursor over a read that the router finishes on one shard (its first part merged across shards) is not supported: run the query without a cursor",
        ));
    }
    Ok(query)
}

/// DDL that every shard runs: only as the whole text. With one shard, DDL for every shard is
/// DDL for that one: inside the client's transaction, or beside other statements, it runs
/// there like any statement ([`one_shard`]), as on one Postgres.
fn broadcast(plan: &Plan, cx: &Context<'_>) -> Result<Option<Dest>, SqlError> {
    let broadcasts = plan
        .statements
        .iter()
        .filter(|r| matches!(r, Route::Broadcast))
        .count();
    if broadcasts == 0 {
        return Ok(None);
    }
    let alone = broadcasts == plan.statements.len();
    let in_transaction = matches!(cx.transaction, super::Transaction::Open { .. });
    if cx.map.shards().len() == 1 && (!alone || in_transaction) {
        return Ok(None);
    }
    if !alone {
        return Err(SqlError::new(
            errors::FEATURE_NOT_SUPPORTED,
            "this query mixes DDL that goes to every shard with other statements",
        )
        .with_hint("send DDL for sharded tables (and schema-wide DDL) in a query of its own"));
    }
    Ok(Some(Dest::Broadcast))
}

/// The one shard every statement of the text agrees on (any, when none names one), or the
/// shards of a single statement's keys when its rows may come from several.
fn one_shard<'a>(stmt: &Statement<'a>, cx: &Context<'a>) -> Result<Resolved<'a>, SqlError> {
    let map = cx.map;
    let mut chosen: Option<(usize, Why<'a>)> = None;
    let single = stmt.plan.statements.len() == 1;
    for route in &stmt.plan.statements {
        let (shard, why) = match route {
            Route::Keyed {
                table,
                key,
                key_type,
                keys,
                spread: merge,
            } => match keyed(stmt, map, table, key, *key_type, keys)? {
                Keys::On(shard, why) => (shard, why),
                // All keys NULL: the statement matches no row anywhere; any shard answers it.
                Keys::None => continue,
                Keys::Several(f, s) => match (single, merge) {
                    // Each key's rows live only on its shard: run it on the shards of its keys.
                    (true, Some(merge)) => {
                        let shards = keyed_shards(stmt, map)?;
                        return Ok((spread(stmt, map, merge, shards, true)?, None));
                    }
                    _ => return Err(SqlError::new(
                        errors::FEATURE_NOT_SUPPORTED,
                        format!(
                            "the keys of this statement on {table} fall on several shards ({} and {})",
                            range(map, f),
                            range(map, s)
                        ),
                    )
                    .with_hint("split the statement so that each one names keys of one shard")),
                },
            },
            Route::Default => (map.default_shard(), Why::Unsharded),
            Route::Unparsed => (map.default_shard(), Why::Unparsed),
            // Only with one shard (see `broadcast`).
            Route::Broadcast if map.shards().len() == 1 => (map.default_shard(), Why::Unsharded),
            other => {
                not_in_a_query(other)?;
                continue;
            }
        };
        match chosen {
            Some((prev, _)) if prev != shard => return Err(SqlError::new(
                errors::FEATURE_NOT_SUPPORTED,
                format!(
                    "the statements of this query need two shards, {} and {}",
                    range(map, prev),
                    range(map, shard)
                ),
            )
            .with_hint("send statements for different shards separately; each query or transaction runs on one shard")),
            Some(_) => {}
            None => chosen = Some((shard, why)),
        }
    }
    Ok(match chosen {
        Some((shard, why)) => (Dest::Shard(shard), Some(why)),
        None => (Dest::Any, None),
    })
}

/// Where the keys of one statement on a sharded table are.
enum Keys<'a> {
    /// All on this shard.
    On(usize, Why<'a>),
    /// On these two shards at least.
    Several(usize, usize),
    /// None: every key is NULL.
    None,
}

fn keyed<'a>(
    stmt: &Statement<'a>,
    map: &ShardMap,
    table: &'a str,
    column: &'a str,
    key_type: shardmap::KeyType,
    keys: &'a [KeySource],
) -> Result<Keys<'a>, SqlError> {
    // The key hashed once: its keyspace ID places it and stays with the reason.
    let mut first: Option<(usize, Option<(Key<'a>, KeyspaceId)>)> = None;
    let mut count = 0;
    let mut array = Vec::new();
    for source in keys {
        let one: [usize; 1];
        let (shards, value): (&[usize], _) = match source {
            KeySource::Array(inner) => {
                array.clear();
                stmt.params.array_shards(inner, key_type, map, &mut array)?;
                (&array, None)
            }
            _ => match stmt.params.key(source, key_type)? {
                Some(k) => {
                    let id = k.keyspace_id();
                    one = [map.shard_for(id)];
                    (&one, Some((k, id)))
                }
                None => (&[], None),
            },
        };
        for &s in shards {
            count += 1;
            match first {
                Some((f, _)) if f != s => return Ok(Keys::Several(f, s)),
                Some(_) => {}
                None => first = Some((s, value)),
            }
        }
    }
    let Some((shard, value)) = first else {
        return Ok(Keys::None);
    };
    let why = match (count, value) {
        (1, Some((value, id))) => Why::Key {
            table,
            column,
            value,
            id,
        },
        _ => Why::Keys {
            table,
            column,
            count,
        },
    };
    Ok(Keys::On(shard, why))
}

/// A statement that must be the only one of its text, found among others: why not.
fn not_in_a_query(route: &Route) -> Result<(), SqlError> {
    let alone = |what: String| Err(SqlError::new(errors::FEATURE_NOT_SUPPORTED, what));
    match route {
        Route::Any
        | Route::Savepoint
        | Route::Begin
        | Route::Commit
        | Route::Rollback
        | Route::Broadcast
        | Route::Keyed { .. }
        | Route::Default
        | Route::Unparsed => Ok(()),
        Route::TooLong { limit } => Err(errors::too_long_to_plan(*limit)),
        Route::ScatterWrite { message, .. } | Route::Unroutable { message } => {
            alone(message.clone())
        }
        Route::PreparedSql => alone(
            "PREPARE, EXECUTE and DEALLOCATE must be the only statement of their query".into(),
        ),
        Route::CopyIn(_) => alone(
            "COPY into a sharded or reference table must be the only statement of its query".into(),
        ),
        Route::Lookup { table, .. } => alone(format!(
            "a statement that the lookup of a column of {table} routes must be the only statement of its query"
        )),
        Route::UpdatesLookups { .. } => alone(
            "an UPDATE of a lookup column must be the only statement of its query".into(),
        ),
        Route::DeletesLookups { .. } => alone(
            "a DELETE from a table with lookup columns must be the only statement of its query"
                .into(),
        ),
        Route::WithLookups { .. } => alone(
            "an INSERT into a table with lookup columns must be the only statement of its query".into(),
        ),
        Route::NewKeys { table, key, .. } => alone(format!(
            "an INSERT that leaves out the sharding key {key} of {table} must be the only statement of its query (the router gives the key)"
        )),
        Route::ExplainRoute(_) => {
            alone("EXPLAIN (ROUTE) must be the only statement of its query".into())
        }
        Route::Replicated { table } => alone(format!(
            "a write of the reference table {table} runs on every shard and must be the only statement of its query"
        )),
        Route::Scatter { table, .. } => alone(format!(
            "a read of {table} across all shards must be the only statement of its query"
        )),
        Route::Declare { .. } | Route::Cursor { .. } => alone(
            "DECLARE, FETCH, MOVE and CLOSE of a cursor must be the only statement of their query"
                .into(),
        ),
    }
}

/// A statement on several shards (`shards`, in shard order), as its merge says.
fn spread<'a>(
    stmt: &Statement<'a>,
    map: &ShardMap,
    merge: &'a Merge,
    shards: Vec<usize>,
    keyed: bool,
) -> Result<Dest, SqlError> {
    match merge {
        Merge::SplitRows => split_insert(stmt, map),
        Merge::SplitUnnest { arrays, key } => split_unnest(stmt, map, arrays, *key),
        Merge::Write => Ok(Dest::Write(Write {
            shards,
            keyed,
            replicas: false,
        })),
        Merge::Explain => Ok(Dest::Read(Read {
            labels: true,
            ..Read::concatenated(shards, keyed)
        })),
        Merge::Staged(staged) => {
            let texts = crate::planner::staged::texts(stmt.sql, &staged.part)
                .map_err(errors::cannot_rewrite)?;
            let mut read = merged_read(stmt, &texts.first, &staged.first, shards, keyed)?;
            read.shard_sql.get_or_insert_with(|| texts.first.clone());
            read.staged = Some(Arc::new(texts));
            Ok(Dest::Read(read))
        }
        Merge::Concat { .. } | Merge::Combine(_) => Ok(Dest::Read(merged_read(
            stmt, stmt.sql, merge, shards, keyed,
        )?)),
    }
}

/// A read of `sql` on `shards` whose answers are concatenated or combined, as `merge` says.
fn merged_read<'a>(
    stmt: &Statement<'a>,
    sql: &str,
    merge: &'a Merge,
    shards: Vec<usize>,
    keyed: bool,
) -> Result<Read, SqlError> {
    let count = |source: &'a Option<KeySource>| match source {
        None => Ok(None),
        Some(source) => stmt.params.count(source),
    };
    match merge {
        Merge::Concat { limit } => Ok(Read {
            limit: count(limit)?,
            ..Read::concatenated(shards, keyed)
        }),
        Merge::Combine(plan) => {
            let shard_sql = if plan.rewrite {
                Some(
                    crate::planner::shard_sql(sql, plan.group.as_deref())
                        .map_err(errors::cannot_rewrite)?,
                )
            } else {
                None
            };
            Ok(Read {
                merge: Some(plan.clone()),
                limit: count(&plan.limit)?,
                offset: count(&plan.offset)?.unwrap_or(0),
                shard_sql,
                ..Read::concatenated(shards, keyed)
            })
        }
        _ => Err(errors::internal(
            "a read in two stages whose first stage is not a read",
        )),
    }
}

/// The shards that hold the keys of a single keyed statement, in shard order.
fn keyed_shards(stmt: &Statement<'_>, map: &ShardMap) -> Result<Vec<usize>, SqlError> {
    let mut shards = Vec::new();
    if let [Route::Keyed { key_type, keys, .. }] = stmt.plan.statements.as_slice() {
        for source in keys {
            if let KeySource::Array(inner) = source {
                stmt.params
                    .array_shards(inner, *key_type, map, &mut shards)?;
            } else if let Some(key) = stmt.params.key(source, *key_type)? {
                shards.push(map.shard_for_key(&key));
            }
        }
    }
    shards.sort_unstable();
    shards.dedup();
    Ok(shards)
}
