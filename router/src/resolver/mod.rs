//! The resolver: a plan, the statement's values, the shard map and the client's transaction in;
//! a [`Target`] out. Step 3 of the statement path, between the planner (text → [`Plan`], shared
//! by every text of the same shape) and the session (which executes targets).
//!
//! A plan says *how* to find the shards (which parameter or literal holds each key); this module
//! reads those values ([`values`]), hashes them, looks the shards up in the map, and applies the
//! rules that depend on the moment rather than on the text: a transaction stays on one shard,
//! multi-shard work runs outside transactions, some statements exist only in one protocol, an
//! operator may pin statements to a shard ([`manual`]). A key that cannot be read, or a
//! statement that cannot run where it is, resolves to [`Dest::Refused`] with the SQLSTATE the
//! client gets, never to a guess.
//!
//! Pure: no I/O, no clock, no locks. A single-shard statement resolves without allocating.

pub mod explain;
pub mod manual;
mod target;
mod values;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use shardmap::sql::quote_literal;
use shardmap::ShardMap;

pub use target::{Dest, Read, Reroute, SplitInsert, Target, Why, Write};
pub use values::{Literals, Params};

use crate::errors;
use crate::planner::{KeySource, Merge, Plan, Route};
use crate::protocol::reply::SqlError;

/// One statement to resolve: its text, its plan and where its values are.
#[derive(Clone, Copy)]
pub struct Statement<'a> {
    /// The client's text (with its literals): what a rewrite for the shards starts from.
    pub sql: &'a str,
    pub plan: &'a Plan,
    pub params: Params<'a>,
}

impl<'a> Statement<'a> {
    /// A statement planned from its text alone (a simple Query, `EXPLAIN (ROUTE)`,
    /// `shardgate explain`): its values are the literals the planner took out of the text.
    pub fn from_text<'b: 'a>(sql: &'a str, planned: &'a crate::planner::PlanRef<'b>) -> Self {
        Statement {
            sql,
            plan: planned,
            params: Params {
                bind: None,
                params_before: planned.params_before(),
                literals: planned,
            },
        }
    }
}

/// The client's transaction, as far as routing cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transaction {
    /// Nothing open: autocommit.
    None,
    /// A transaction is open (or an extended-protocol batch has run something, which Postgres
    /// treats as one transaction until its Sync), on `shard` once one is chosen.
    Open { shard: Option<usize> },
    /// The transaction failed before it reached any shard: only its end is accepted.
    Failed,
}

/// What besides the statement decides its target.
#[derive(Clone, Copy)]
pub struct Context<'a> {
    pub map: &'a ShardMap,
    pub transaction: Transaction,
    /// The client's `shardgate.shard` setting (its SQL value), if set.
    pub manual: Option<&'a str>,
    /// UPDATE/DELETE without a key may run on every shard (config or session opt-in).
    pub allow_scatter_writes: bool,
    /// A transaction may go on to other shards (`[transactions] cross_shard = "multi"`): a
    /// statement for another shard goes there, and the session makes that shard a participant.
    pub cross_shard: bool,
}

/// Resolves one statement (all statements of a simple Query, which must agree on a shard).
pub fn resolve<'a>(stmt: &Statement<'a>, cx: &Context<'a>) -> Target<'a> {
    match dest(stmt, cx) {
        Ok((dest, why)) => Target::new(dest, why, cx.map),
        Err(e) => Target::new(Dest::Refused(e), None, cx.map),
    }
}

/// A destination, and why for one shard.
type Resolved<'a> = (Dest, Option<Why<'a>>);

fn dest<'a>(stmt: &Statement<'a>, cx: &Context<'a>) -> Result<Resolved<'a>, SqlError> {
    let control = transaction_control(stmt.plan);
    if cx.transaction == Transaction::Failed {
        // Like Postgres: a failed transaction accepts only its end.
        return match control {
            Some(d @ (Dest::Commit | Dest::Rollback)) => Ok((d, None)),
            _ => Err(errors::in_failed_transaction()),
        };
    }
    if let Some(shard) = manual::shard(stmt.sql, cx.manual, cx.map)? {
        // Everything but transaction control goes there, even what could not be routed
        // otherwise: that is what pinning by hand is for.
        return match control {
            Some(d) => Ok((d, None)),
            None => in_transaction((Dest::Shard(shard), Some(Why::Manual)), cx),
        };
    }
    in_transaction(by_plan(stmt, cx)?, cx)
}

/// `BEGIN`, `COMMIT` or `ROLLBACK` when that is all the plan is.
pub fn transaction_control(plan: &Plan) -> Option<Dest> {
    match plan.statements.as_slice() {
        [Route::Begin] => Some(Dest::Begin),
        [Route::Commit] => Some(Dest::Commit),
        [Route::Rollback] => Some(Dest::Rollback),
        _ => None,
    }
}

/// The rules of an open transaction: it stays on one shard unless the config lets it go on to
/// others (each statement still names one shard), and work on several shards at once (each part
/// in a transaction of its own) cannot join it.
fn in_transaction<'a>(resolved: Resolved<'a>, cx: &Context<'a>) -> Result<Resolved<'a>, SqlError> {
    let Transaction::Open { shard: pinned } = cx.transaction else {
        return Ok(resolved);
    };
    match &resolved.0 {
        Dest::Shard(shard) => match pinned {
            Some(p) if p != *shard && !cx.cross_shard => Err(errors::cross_shard_transaction(
                &range(cx.map, p),
                &range(cx.map, *shard),
            )),
            _ => Ok(resolved),
        },
        Dest::Broadcast => Err(errors::ddl_in_transaction()),
        // Each shard joins the transaction, and the whole commits or rolls back together.
        Dest::Read(_) | Dest::Write(_) if cx.cross_shard => Ok(resolved),
        Dest::Read(_) | Dest::Write(_) => Err(errors::scatter_in_transaction()),
        Dest::CopyIn { .. } => Err(SqlError::new(
            errors::FEATURE_NOT_SUPPORTED,
            "COPY into a sharded table cannot run inside a transaction, which stays on one shard",
        )),
        Dest::SplitInsert(_) if cx.cross_shard => Ok(resolved),
        Dest::SplitInsert(_) => Err(SqlError::new(
            errors::FEATURE_NOT_SUPPORTED,
            "the rows of this INSERT fall on several shards, which an INSERT inside a transaction cannot do yet",
        )
        .with_hint("insert the rows of each shard with an INSERT of their own, or run the INSERT outside a transaction")),
        _ => Ok(resolved),
    }
}

fn range(map: &ShardMap, shard: usize) -> String {
    map.shards()[shard].range.to_string()
}

/// The target the plan alone gives (before the transaction's rules).
fn by_plan<'a>(stmt: &Statement<'a>, cx: &Context<'a>) -> Result<Resolved<'a>, SqlError> {
    let (plan, map) = (stmt.plan, cx.map);
    let extended = stmt.params.bind.is_some();
    match plan.statements.as_slice() {
        [Route::ScatterWrite { message, .. }] => {
            return if cx.allow_scatter_writes {
                Ok((
                    Dest::Write(Write {
                        shards: (0..map.shards().len()).collect(),
                        keyed: false,
                    }),
                    None,
                ))
            } else {
                Err(SqlError::new(
                    errors::FEATURE_NOT_SUPPORTED,
                    message.clone(),
                ))
            };
        }
        [Route::Scatter { merge, .. }] => {
            return Ok((
                spread(stmt, map, merge, (0..map.shards().len()).collect(), false)?,
                None,
            ))
        }
        [Route::PreparedSql] if extended => {
            return Err(SqlError::new(
                errors::FEATURE_NOT_SUPPORTED,
                "PREPARE, EXECUTE and DEALLOCATE are supported in the simple query protocol only",
            )
            .with_hint(
                "use the driver's own prepared statements, or send the command as a simple query",
            ))
        }
        [Route::PreparedSql] => return Ok((Dest::PreparedSql, None)),
        [Route::ExplainRoute(_)] if extended => {
            return Err(SqlError::new(
                errors::FEATURE_NOT_SUPPORTED,
                "EXPLAIN (ROUTE) is answered in the simple query protocol only",
            )
            .with_hint("send it as a simple query, as psql does, with the key values written out"))
        }
        [Route::ExplainRoute(_)] => return Ok((Dest::ExplainRoute, None)),
        [Route::Declare {
            name,
            hold,
            binary,
            query,
        }] => {
            // The query is the text after FOR, planned as part of the whole text (its literals
            // are numbered alike: the head of a DECLARE has none).
            let at = crate::planner::cursor::declare_query(stmt.sql).ok_or_else(|| {
                SqlError::new(errors::SYNTAX_ERROR, "DECLARE needs CURSOR FOR a query")
            })?;
            let plan = Plan {
                statements: vec![(**query).clone()],
                normalized: plan.normalized,
                use_original: false,
                shareable: false,
            };
            let inner = Statement {
                sql: &stmt.sql[at..],
                plan: &plan,
                params: stmt.params,
            };
            let (query, _) = in_transaction(by_plan(&inner, cx)?, cx)?;
            return Ok((
                Dest::Declare {
                    name: name.clone(),
                    hold: *hold,
                    binary: *binary,
                    query: Box::new(query),
                },
                None,
            ));
        }
        [Route::Cursor { name, close }] => {
            return Ok((
                Dest::Cursor {
                    name: name.clone(),
                    close: *close,
                },
                None,
            ))
        }
        [Route::CopyIn { .. }] if extended => {
            return Err(SqlError::new(
                errors::FEATURE_NOT_SUPPORTED,
                "COPY into a sharded table is supported in the simple query protocol only",
            )
            .with_hint("send COPY ... FROM STDIN as a simple query, as psql's \\copy does"))
        }
        [Route::CopyIn { key_type, format }] => {
            return Ok((
                Dest::CopyIn {
                    key_type: *key_type,
                    format: *format,
                },
                None,
            ))
        }
        _ => {}
    }
    let broadcasts = plan
        .statements
        .iter()
        .filter(|r| matches!(r, Route::Broadcast))
        .count();
    if broadcasts > 0 {
        if broadcasts < plan.statements.len() {
            return Err(SqlError::new(
                errors::FEATURE_NOT_SUPPORTED,
                "this query mixes DDL that goes to every shard with other statements",
            )
            .with_hint("send DDL for sharded tables (and schema-wide DDL) in a query of its own"));
        }
        return Ok((Dest::Broadcast, None));
    }
    if let Some(control) = transaction_control(plan) {
        return Ok((control, None));
    }

    // Every statement of the message must agree on one shard.
    let mut chosen: Option<(usize, Why<'a>)> = None;
    let mut agree = |shard: usize, why: Why<'a>| -> Result<(), SqlError> {
        match chosen {
            Some((prev, _)) if prev != shard => Err(SqlError::new(
                errors::FEATURE_NOT_SUPPORTED,
                format!(
                    "the statements of this query need two shards, {} and {}",
                    range(map, prev),
                    range(map, shard)
                ),
            )
            .with_hint("send statements for different shards separately; each query or transaction runs on one shard")),
            Some(_) => Ok(()),
            None => {
                chosen = Some((shard, why));
                Ok(())
            }
        }
    };
    let single = plan.statements.len() == 1;
    for route in &plan.statements {
        match route {
            Route::Keyed {
                table,
                key,
                key_type,
                keys,
                spread: merge,
            } => {
                let mut first: Option<(usize, Option<shardmap::Key<'a>>)> = None;
                let mut count = 0;
                let mut array = Vec::new();
                for source in keys {
                    let one: [usize; 1];
                    let (shards, value): (&[usize], _) = match source {
                        KeySource::Array(inner) => {
                            array.clear();
                            stmt.params
                                .array_shards(inner, *key_type, map, &mut array)?;
                            (&array, None)
                        }
                        _ => match stmt.params.key(source, *key_type)? {
                            Some(k) => {
                                one = [map.shard_for_key(&k)];
                                (&one, Some(k))
                            }
                            None => (&[], None),
                        },
                    };
                    for &s in shards {
                        count += 1;
                        match first {
                            Some((f, _)) if f != s => {
                                if let (true, Some(merge)) = (single, merge) {
                                    // Each key's rows live only on its shard: run it on the
                                    // shards of its keys.
                                    let shards = keyed_shards(stmt, map)?;
                                    return Ok((spread(stmt, map, merge, shards, true)?, None));
                                }
                                return Err(SqlError::new(
                                    errors::FEATURE_NOT_SUPPORTED,
                                    format!(
                                        "the keys of this statement on {table} fall on several shards ({} and {})",
                                        range(map, f),
                                        range(map, s)
                                    ),
                                )
                                .with_hint("split the statement so that each one names keys of one shard"));
                            }
                            Some(_) => {}
                            None => first = Some((s, value)),
                        }
                    }
                }
                // All keys NULL: the statement matches no row anywhere; any shard answers it.
                if let Some((s, value)) = first {
                    let why = match (count, value) {
                        (1, Some(value)) => Why::Key {
                            table,
                            column: key,
                            value,
                            id: value.keyspace_id(),
                        },
                        _ => Why::Keys {
                            table,
                            column: key,
                            count,
                        },
                    };
                    agree(s, why)?;
                }
            }
            Route::Default => agree(map.default_shard(), Why::Unsharded)?,
            Route::Unparsed => agree(map.default_shard(), Why::Unparsed)?,
            Route::Any
            | Route::Savepoint
            | Route::Begin
            | Route::Commit
            | Route::Rollback
            | Route::Broadcast => {}
            Route::TooLong { limit } => return Err(errors::too_long_to_plan(*limit)),
            Route::ScatterWrite { message, .. } | Route::Unroutable { message } => {
                return Err(SqlError::new(
                    errors::FEATURE_NOT_SUPPORTED,
                    message.clone(),
                ));
            }
            Route::PreparedSql => {
                return Err(SqlError::new(
                    errors::FEATURE_NOT_SUPPORTED,
                    "PREPARE, EXECUTE and DEALLOCATE must be the only statement of their query",
                ));
            }
            Route::CopyIn { .. } => {
                return Err(SqlError::new(
                    errors::FEATURE_NOT_SUPPORTED,
                    "COPY into a sharded table must be the only statement of its query",
                ));
            }
            Route::ExplainRoute(_) => {
                return Err(SqlError::new(
                    errors::FEATURE_NOT_SUPPORTED,
                    "EXPLAIN (ROUTE) must be the only statement of its query",
                ));
            }
            Route::Scatter { table, .. } => {
                return Err(SqlError::new(
                    errors::FEATURE_NOT_SUPPORTED,
                    format!("a read of {table} across all shards must be the only statement of its query"),
                ));
            }
            Route::Declare { .. } | Route::Cursor { .. } => {
                return Err(SqlError::new(
                    errors::FEATURE_NOT_SUPPORTED,
                    "DECLARE, FETCH, MOVE and CLOSE of a cursor must be the only statement of their query",
                ));
            }
        }
    }
    Ok(match chosen {
        Some((shard, why)) => (Dest::Shard(shard), Some(why)),
        None => (Dest::Any, None),
    })
}

/// A statement on several shards (`shards`, in shard order), as its merge says.
fn spread<'a>(
    stmt: &Statement<'a>,
    map: &ShardMap,
    merge: &'a Merge,
    shards: Vec<usize>,
    keyed: bool,
) -> Result<Dest, SqlError> {
    let count = |source: &'a Option<KeySource>| match source {
        None => Ok(None),
        Some(source) => stmt.params.count(source),
    };
    match merge {
        Merge::SplitRows => split_insert(stmt, map),
        Merge::SplitUnnest { arrays, key } => split_unnest(stmt, map, arrays, *key),
        Merge::Write => Ok(Dest::Write(Write { shards, keyed })),
        Merge::Concat { limit } => Ok(Dest::Read(Read {
            shards,
            keyed,
            merge: None,
            limit: count(limit)?,
            offset: 0,
            shard_sql: None,
            labels: false,
        })),
        Merge::Explain => Ok(Dest::Read(Read {
            shards,
            keyed,
            merge: None,
            limit: None,
            offset: 0,
            shard_sql: None,
            labels: true,
        })),
        Merge::Combine(plan) => {
            let shard_sql = if plan.rewrite {
                Some(crate::planner::shard_sql(stmt.sql).map_err(errors::cannot_rewrite)?)
            } else {
                None
            };
            Ok(Dest::Read(Read {
                shards,
                keyed,
                merge: Some(plan.clone()),
                limit: count(&plan.limit)?,
                offset: count(&plan.offset)?.unwrap_or(0),
                shard_sql,
                labels: false,
            }))
        }
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

/// A multi-row INSERT cut into one INSERT per shard, each with that shard's rows as the client
/// wrote them; with bound parameters each part's parameters are numbered afresh (and the part
/// is sent the client's values for them). A NULL key (which Postgres refuses for a primary key)
/// goes to the default shard, which says so.
fn split_insert(stmt: &Statement<'_>, map: &ShardMap) -> Result<Dest, SqlError> {
    let cannot = || {
        SqlError::new(
            errors::FEATURE_NOT_SUPPORTED,
            "the rows of this INSERT fall on several shards, and the router could not split its text",
        )
        .with_hint("send one INSERT per shard")
    };
    let [Route::Keyed { key_type, keys, .. }] = stmt.plan.statements.as_slice() else {
        return Err(cannot());
    };
    let shard_of_row = keys
        .iter()
        .map(|source| {
            Ok(stmt
                .params
                .key(source, *key_type)?
                .map_or(map.default_shard(), |key| map.shard_for_key(&key)))
        })
        .collect::<Result<Vec<usize>, SqlError>>()?;
    let mut split = split_rows(stmt.sql, &shard_of_row).ok_or_else(cannot)?;
    if let Some(bind) = stmt.params.bind {
        for (_, sql) in &mut split.parts {
            let (renumbered, old) =
                crate::planner::values::renumber_params(sql).ok_or_else(cannot)?;
            if old.iter().any(|&i| i >= bind.param_count) {
                return Err(cannot());
            }
            *sql = renumbered;
            split.params.push(old);
        }
    }
    Ok(Dest::SplitInsert(split))
}

/// `INSERT ... SELECT * FROM UNNEST(arrays)` cut into one statement per shard: each gets the
/// elements of its rows of every array, in their order. A bound array is sent in the client's
/// format with only those elements; a literal array is written into the shard's text in its
/// place. A NULL key goes to the default shard, which says so.
fn split_unnest(
    stmt: &Statement<'_>,
    map: &ShardMap,
    arrays: &[KeySource],
    key: usize,
) -> Result<Dest, SqlError> {
    let cannot = |why: &str| {
        SqlError::new(
            errors::FEATURE_NOT_SUPPORTED,
            format!("the rows of this INSERT ... SELECT * FROM UNNEST(...) fall on several shards, and {why}"),
        )
        .with_hint("send one INSERT per shard")
    };
    let [Route::Keyed { key_type, .. }] = stmt.plan.statements.as_slice() else {
        return Err(cannot("the router could not split it"));
    };
    let bad_array = |e: String| SqlError::new(errors::INVALID_TEXT_REPRESENTATION, e);
    let mut given = Vec::with_capacity(arrays.len());
    for source in arrays {
        let value = stmt.params.raw(source)?;
        let elements = match value {
            Some((format, v)) => {
                Some(crate::planner::arrays::Elements::parse(format, v).map_err(bad_array)?)
            }
            None => None,
        };
        given.push((value.map(|(f, _)| f), elements));
    }
    let (Some(format), Some(keys)) = (given[key].0, given[key].1.as_ref()) else {
        return Err(cannot("its array of keys is NULL"));
    };
    if format == crate::protocol::frontend::Format::Binary
        && !crate::planner::keys::element_type_fits(*key_type, keys.elem_oid())
    {
        return Err(SqlError::new(
            errors::INVALID_BINARY_REPRESENTATION,
            format!(
                "the array of keys is sent as elements of type OID {}, which is not a {key_type}",
                keys.elem_oid()
            ),
        ));
    }
    let rows = keys.len();
    if given
        .iter()
        .any(|(_, e)| e.as_ref().map_or(0, |e| e.len()) != rows)
    {
        return Err(cannot(
            "its arrays have different lengths (UNNEST pads the shorter ones with NULLs, row by row)",
        ));
    }
    let mut by_shard: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    let mut shard_of_row = Vec::with_capacity(rows);
    for row in 0..rows {
        let shard = match keys.value(row) {
            None => map.default_shard(),
            Some(v) => map.shard_for_key(&values::key_of(*key_type, format, &v)?),
        };
        by_shard.entry(shard).or_default().push(row);
        shard_of_row.push(shard);
    }
    // Where each literal array is in the client's text (literals are numbered as the plan's
    // normalization numbered them).
    let mut literals = crate::planner::NormalizeBuf::new();
    crate::planner::normalize(stmt.sql, &mut literals);
    let params_before = stmt.params.params_before;
    let mut spans = Vec::new();
    for (a, source) in arrays.iter().enumerate() {
        match source {
            KeySource::Param(i) if *i >= params_before => {
                let span = literals
                    .literal_source(i - params_before)
                    .ok_or_else(|| cannot("the router could not find its arrays in the text"))?;
                spans.push((span, a));
            }
            KeySource::Param(_) => {}
            _ => return Err(cannot("the router could not find its arrays in the text")),
        }
    }
    spans.sort_by_key(|(span, _)| span.start);
    let mut split = SplitInsert {
        parts: Vec::with_capacity(by_shard.len()),
        part_of_row: Vec::with_capacity(rows),
        params: Vec::new(),
        values: Vec::new(),
    };
    let part_of_shard: BTreeMap<usize, usize> =
        by_shard.keys().enumerate().map(|(p, &s)| (s, p)).collect();
    for (&shard, picked) in &by_shard {
        let mut sql = String::with_capacity(stmt.sql.len());
        let mut at = 0;
        for (span, a) in &spans {
            let Some(elements) = &given[*a].1 else {
                return Err(cannot("one of its arrays is NULL"));
            };
            sql.push_str(&stmt.sql[at..span.start]);
            let elements = elements.pick(picked);
            sql.push_str(&quote_literal(&String::from_utf8_lossy(&elements)));
            at = span.end;
        }
        sql.push_str(&stmt.sql[at..]);
        split.parts.push((shard, sql));
        if let Some(bind) = stmt.params.bind {
            split.params.push((0..bind.param_count).collect());
            let mut replaced = Vec::new();
            for (source, (_, elements)) in arrays.iter().zip(&given) {
                if let (KeySource::Param(i), Some(elements)) = (source, elements) {
                    if *i < params_before {
                        replaced.push((*i, elements.pick(picked)));
                    }
                }
            }
            split.values.push(replaced);
        }
    }
    split.part_of_row = shard_of_row
        .iter()
        .map(|s| part_of_shard.get(s).copied().unwrap_or(0))
        .collect();
    Ok(Dest::SplitInsert(split))
}

/// The parts of a split INSERT: rows grouped by shard, in shard order.
fn split_rows(sql: &str, shard_of_row: &[usize]) -> Option<SplitInsert> {
    let rows = crate::planner::values::values_rows(sql)?;
    if rows.rows.len() != shard_of_row.len() {
        return None;
    }
    let mut by_shard: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for (row, &shard) in shard_of_row.iter().enumerate() {
        by_shard.entry(shard).or_default().push(row);
    }
    let part_of_shard: BTreeMap<usize, usize> =
        by_shard.keys().enumerate().map(|(p, &s)| (s, p)).collect();
    let parts = by_shard
        .iter()
        .map(|(&shard, picked)| (shard, rows.statement(sql, picked.iter().copied())))
        .collect();
    let part_of_row = shard_of_row
        .iter()
        .map(|s| part_of_shard.get(s).copied().unwrap_or(0))
        .collect();
    Some(SplitInsert {
        parts,
        part_of_row,
        params: Vec::new(),
        values: Vec::new(),
    })
}
