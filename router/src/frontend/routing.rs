//! From a plan and the values of its parameters to where the statement runs. Pure: no I/O.
//!
//! A plan says *how* to find the shard (which parameters hold the key); this module reads
//! those values from a Bind message or from the literals the planner took out of the text,
//! hashes them and looks the shard up in the map. All statements of one message must agree
//! on one shard; a key that cannot be read is an error, never a guess.

use shardmap::{Key, ShardMap};

use crate::errors;
use crate::planner::{keys, KeySource, Merge, Plan, Route};
use crate::protocol::frontend::{Bind, Format};
use crate::protocol::reply::SqlError;

/// Where a message's statements go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// This shard (by key, or the default shard for unsharded tables).
    Shard(usize),
    /// Any shard will do: no user table is touched.
    Any,
    /// Only `BEGIN`: the shard is decided by the transaction's first statement.
    Begin,
    /// Only `COMMIT` (or `END`).
    Commit,
    /// Only `ROLLBACK` (or `ABORT`).
    Rollback,
    /// DDL for every shard.
    Broadcast,
    /// A read on every shard: rows to concatenate (at most `limit`), or, with `combine`, a
    /// merge by the plan's [`crate::planner::MergePlan`] ([`merge_plan`]) that skips `offset`
    /// rows and keeps `limit`. With `keyed`, only the shards of the statement's keys are needed
    /// ([`keyed_shards`]).
    Scatter {
        combine: bool,
        limit: Option<u64>,
        offset: u64,
        keyed: bool,
        /// A write: each shard's part runs in a transaction, all committed only if all
        /// succeeded.
        write: bool,
    },
    /// SQL-level PREPARE, EXECUTE or DEALLOCATE, run by the session.
    PreparedSql,
    /// A multi-row INSERT (simple protocol) whose rows belong to several shards: split by
    /// [`row_shards`] and run on each, committed only if all succeed.
    SplitInsert,
    /// COPY FROM STDIN into a sharded table, rows split by key.
    CopyIn {
        key_type: shardmap::KeyType,
        format: crate::planner::CopyFormat,
    },
}

/// The literal values a plan's `$n` placeholders beyond the client's own parameters stand for.
pub trait Literals {
    fn literal(&self, i: usize) -> Option<&str>;
}

impl Literals for crate::planner::PlanRef<'_> {
    fn literal(&self, i: usize) -> Option<&str> {
        crate::planner::PlanRef::literal(self, i)
    }
}

impl Literals for [Box<str>] {
    fn literal(&self, i: usize) -> Option<&str> {
        self.get(i).map(|s| &**s)
    }
}

/// Decides where `plan` runs. `bind` holds the client's parameters (extended protocol);
/// `params_before` is how many `$n` the client's own text had (the plan is shared by texts
/// that differ only in literals, so this belongs to the text, not the plan); `literals` are
/// the values normalization took out of the text.
pub fn decide(
    plan: &Plan,
    bind: Option<&Bind<'_>>,
    params_before: usize,
    literals: &(impl Literals + ?Sized),
    map: &ShardMap,
    allow_scatter_writes: bool,
) -> Result<Decision, SqlError> {
    if let [Route::ScatterWrite { message }] = plan.statements.as_slice() {
        if allow_scatter_writes {
            return Ok(Decision::Scatter {
                combine: false,
                limit: None,
                offset: 0,
                keyed: false,
                write: true,
            });
        }
        return Err(SqlError::new(
            errors::FEATURE_NOT_SUPPORTED,
            message.clone(),
        ));
    }
    let mut shard: Option<usize> = None;
    let mut agree = |s: usize| -> Result<(), SqlError> {
        match shard {
            Some(prev) if prev != s => Err(SqlError::new(
                errors::FEATURE_NOT_SUPPORTED,
                format!(
                    "the statements of this query need two shards, {} and {}",
                    map.shards()[prev].range,
                    map.shards()[s].range
                ),
            )
            .with_hint("send statements for different shards separately; each query or transaction runs on one shard")),
            _ => {
                shard = Some(s);
                Ok(())
            }
        }
    };
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
        return Ok(Decision::Broadcast);
    }
    if let [Route::Scatter { merge, .. }] = plan.statements.as_slice() {
        return scatter_decision(merge, bind, params_before, literals);
    }
    if let [Route::PreparedSql] = plan.statements.as_slice() {
        return Ok(Decision::PreparedSql);
    }
    if let [Route::CopyIn { key_type, format }] = plan.statements.as_slice() {
        return Ok(Decision::CopyIn {
            key_type: *key_type,
            format: *format,
        });
    }
    let mut only_txn: Option<Decision> = None;
    let single = plan.statements.len() == 1;
    for route in &plan.statements {
        match route {
            Route::Keyed {
                table,
                key_type,
                keys,
                spread,
            } => {
                let mut first: Option<usize> = None;
                let mut array: Vec<usize>;
                for source in keys {
                    let one: [usize; 1];
                    let shards: &[usize] = match source {
                        KeySource::Array(inner) => {
                            array =
                                array_shards(inner, *key_type, bind, params_before, literals, map)?;
                            &array
                        }
                        _ => match read_key(source, *key_type, bind, params_before, literals)? {
                            Some(key) => {
                                one = [map.shard_for_key(&key)];
                                &one
                            }
                            None => &[],
                        },
                    };
                    for &s in shards {
                        match first {
                            Some(f) if f != s => {
                                if let (true, Some(merge)) = (single, spread) {
                                    // Run it on the shards of its keys: each key's rows are only on
                                    // its own shard.
                                    return match scatter_decision(
                                        merge,
                                        bind,
                                        params_before,
                                        literals,
                                    )? {
                                        Decision::Scatter {
                                            combine,
                                            limit,
                                            offset,
                                            write,
                                            ..
                                        } => Ok(Decision::Scatter {
                                            combine,
                                            limit,
                                            offset,
                                            keyed: true,
                                            write,
                                        }),
                                        other => Ok(other),
                                    };
                                }
                                return Err(SqlError::new(
                                errors::FEATURE_NOT_SUPPORTED,
                                format!(
                                    "the keys of this statement on {table} fall on several shards ({} and {})",
                                    map.shards()[f].range,
                                    map.shards()[s].range
                                ),
                            )
                            .with_hint("split the statement so that each one names keys of one shard"));
                            }
                            _ => first = Some(s),
                        }
                    }
                }
                // All keys NULL: the statement matches no row anywhere; any shard answers it.
                if let Some(s) = first {
                    agree(s)?;
                }
            }
            Route::Default | Route::Unparsed => agree(map.default_shard())?,
            Route::Any | Route::Savepoint => {}
            Route::Begin if single => only_txn = Some(Decision::Begin),
            Route::Commit if single => only_txn = Some(Decision::Commit),
            Route::Rollback if single => only_txn = Some(Decision::Rollback),
            Route::Begin | Route::Commit | Route::Rollback => {}
            Route::Broadcast => {}
            Route::ScatterWrite { message } => {
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
            Route::Scatter { table, .. } => {
                return Err(SqlError::new(
                    errors::FEATURE_NOT_SUPPORTED,
                    format!("a read of {table} across all shards must be the only statement of its query"),
                ));
            }
            Route::Unroutable { message } => {
                return Err(SqlError::new(
                    errors::FEATURE_NOT_SUPPORTED,
                    message.clone(),
                ));
            }
        }
    }
    Ok(match (shard, only_txn) {
        (Some(s), _) => Decision::Shard(s),
        (None, Some(d)) => d,
        (None, None) => Decision::Any,
    })
}

/// A read on every shard, merged as `merge` says.
fn scatter_decision(
    merge: &Merge,
    bind: Option<&Bind<'_>>,
    params_before: usize,
    literals: &(impl Literals + ?Sized),
) -> Result<Decision, SqlError> {
    let count = |source: &Option<KeySource>| match source {
        None => Ok(None),
        Some(source) => read_limit(source, bind, params_before, literals),
    };
    Ok(match merge {
        Merge::SplitRows if bind.is_none() => Decision::SplitInsert,
        Merge::SplitRows => {
            return Err(SqlError::new(
                errors::FEATURE_NOT_SUPPORTED,
                "the rows of this INSERT fall on several shards; with bound parameters each INSERT must give rows of one shard",
            )
            .with_hint("send one INSERT per shard (or single-row INSERTs), or send the multi-row INSERT with literal values as a simple query"))
        }
        Merge::Combine(plan) => Decision::Scatter {
            combine: true,
            limit: count(&plan.limit)?,
            offset: count(&plan.offset)?.unwrap_or(0),
            keyed: false,
            write: false,
        },
        Merge::Write => Decision::Scatter {
            combine: false,
            limit: None,
            offset: 0,
            keyed: false,
            write: true,
        },
        Merge::Concat { limit } => Decision::Scatter {
            combine: false,
            limit: count(limit)?,
            offset: 0,
            keyed: false,
            write: false,
        },
    })
}

/// The shard an operator pinned a statement to: a leading `/* shard: RANGE */` comment, or else
/// the session setting `shardgate.shard` (`setting` is its SQL value, e.g. `'80-'`). `None`
/// when neither is there (or the setting is empty).
pub fn manual_shard(
    sql: &str,
    setting: Option<&str>,
    map: &ShardMap,
) -> Result<Option<usize>, SqlError> {
    let hint = sql
        .trim_start()
        .strip_prefix("/*")
        .and_then(|rest| rest.split_once("*/"))
        .and_then(|(inside, _)| inside.trim().strip_prefix("shard:"))
        .map(str::trim);
    let range = match hint {
        Some(r) => r.to_string(),
        None => match setting {
            Some(v) => v.trim().trim_matches('\'').to_string(),
            None => return Ok(None),
        },
    };
    if range.is_empty() {
        return Ok(None);
    }
    let bad = |why: String| {
        SqlError::new(errors::INVALID_PARAMETER_VALUE, format!("shard {range:?}: {why}"))
            .with_hint("name a shard by its exact range from the shard map, e.g. /* shard: 80- */ or SET shardgate.shard = '80-'")
    };
    let parsed = shardmap::KeyRange::parse(&range).map_err(|e| bad(e.to_string()))?;
    map.shard_by_range(&parsed)
        .map(Some)
        .ok_or_else(|| bad("no shard has this range".into()))
}

/// Applies an operator's manual shard to a decision: everything but transaction control goes
/// to that shard, even what the planner could not route (that is what the override is for,
/// e.g. to repair one shard).
pub fn with_manual(
    decision: Result<Decision, SqlError>,
    manual: Option<usize>,
) -> Result<Decision, SqlError> {
    match (manual, decision) {
        (None, d) => d,
        (Some(_), Ok(d @ (Decision::Begin | Decision::Commit | Decision::Rollback))) => Ok(d),
        (Some(s), _) => Ok(Decision::Shard(s)),
    }
}

/// The merge plan of a single statement that is scattered with [`Decision::Scatter`]'s
/// `combine`.
pub fn merge_plan(plan: &Plan) -> Option<std::sync::Arc<crate::planner::MergePlan>> {
    match plan.statements.as_slice() {
        [Route::Scatter {
            merge: Merge::Combine(p),
            ..
        }]
        | [Route::Keyed {
            spread: Some(Merge::Combine(p)),
            ..
        }] => Some(p.clone()),
        _ => None,
    }
}

/// The shards that hold the keys of a single keyed statement, in shard order (for a read whose
/// keys span several shards).
pub fn keyed_shards(
    plan: &Plan,
    bind: Option<&Bind<'_>>,
    params_before: usize,
    literals: &(impl Literals + ?Sized),
    map: &ShardMap,
) -> Result<Vec<usize>, SqlError> {
    let mut shards = Vec::new();
    if let [Route::Keyed { key_type, keys, .. }] = plan.statements.as_slice() {
        for source in keys {
            if let KeySource::Array(inner) = source {
                shards.extend(array_shards(
                    inner,
                    *key_type,
                    bind,
                    params_before,
                    literals,
                    map,
                )?);
            } else if let Some(key) = read_key(source, *key_type, bind, params_before, literals)? {
                shards.push(map.shard_for_key(&key));
            }
        }
    }
    shards.sort_unstable();
    shards.dedup();
    Ok(shards)
}

/// The shard of each VALUES row of a multi-row INSERT ([`Decision::SplitInsert`]), in row
/// order. A NULL key (which Postgres will refuse for a primary key) goes to the default shard.
pub fn row_shards(
    plan: &Plan,
    params_before: usize,
    literals: &(impl Literals + ?Sized),
    map: &ShardMap,
) -> Result<Vec<usize>, SqlError> {
    let [Route::Keyed { key_type, keys, .. }] = plan.statements.as_slice() else {
        return Ok(Vec::new());
    };
    keys.iter()
        .map(|source| {
            Ok(read_key(source, *key_type, None, params_before, literals)?
                .map_or(map.default_shard(), |key| map.shard_for_key(&key)))
        })
        .collect()
}

/// A LIMIT's value; `None` for `LIMIT NULL` (no limit, as in Postgres).
fn read_limit(
    source: &KeySource,
    bind: Option<&Bind<'_>>,
    params_before: usize,
    literals: &(impl Literals + ?Sized),
) -> Result<Option<u64>, SqlError> {
    let bad = || {
        SqlError::new(
            errors::INVALID_TEXT_REPRESENTATION,
            "LIMIT must be a non-negative integer",
        )
    };
    let text = match source {
        KeySource::Literal(t) => t.as_str(),
        KeySource::Param(i) if *i < params_before => match bind.and_then(|b| b.param(*i)) {
            None => return Err(bad()),
            Some((_, None)) => return Ok(None),
            Some((Format::Binary, Some(v))) => {
                return match v.len() {
                    8 => u64::try_from(i64::from_be_bytes(v.try_into().map_err(|_| bad())?))
                        .map(Some)
                        .map_err(|_| bad()),
                    4 => u64::try_from(i32::from_be_bytes(v.try_into().map_err(|_| bad())?))
                        .map(Some)
                        .map_err(|_| bad()),
                    _ => Err(bad()),
                }
            }
            Some((Format::Text, Some(v))) => std::str::from_utf8(v).map_err(|_| bad())?,
        },
        KeySource::Param(i) => literals.literal(i - params_before).ok_or_else(bad)?,
        KeySource::Array(_) => return Err(bad()),
    };
    text.trim().parse::<u64>().map(Some).map_err(|_| bad())
}

/// The key a source stands for; `None` when it is NULL.
fn read_key<'v>(
    source: &'v KeySource,
    key_type: shardmap::KeyType,
    bind: Option<&Bind<'v>>,
    params_before: usize,
    literals: &'v (impl Literals + ?Sized),
) -> Result<Option<Key<'v>>, SqlError> {
    match raw_value(source, bind, params_before, literals)? {
        None => Ok(None),
        Some((Format::Binary, v)) => keys::key_from_binary(key_type, v)
            .map(Some)
            .map_err(bad_key),
        Some((Format::Text, v)) => keys::key_from_text(key_type, utf8(v)?)
            .map(Some)
            .map_err(bad_key),
    }
}

fn bad_key(e: keys::KeyValueError) -> SqlError {
    SqlError::new(errors::INVALID_TEXT_REPRESENTATION, e.to_string())
}

fn utf8(v: &[u8]) -> Result<&str, SqlError> {
    std::str::from_utf8(v).map_err(|_| {
        SqlError::new(
            errors::INVALID_TEXT_REPRESENTATION,
            "a key parameter is not valid UTF-8",
        )
    })
}

/// The shards of the keys in an array value (`key = ANY($1)`), one per element (NULLs, which
/// match nothing, left out).
fn array_shards(
    inner: &KeySource,
    key_type: shardmap::KeyType,
    bind: Option<&Bind<'_>>,
    params_before: usize,
    literals: &(impl Literals + ?Sized),
    map: &ShardMap,
) -> Result<Vec<usize>, SqlError> {
    let bad_array = |e: String| SqlError::new(errors::INVALID_TEXT_REPRESENTATION, e);
    let mut shards = Vec::new();
    match raw_value(inner, bind, params_before, literals)? {
        None => {}
        Some((Format::Binary, v)) => {
            for e in keys::array_elements_binary(v)
                .map_err(bad_array)?
                .into_iter()
                .flatten()
            {
                shards
                    .push(map.shard_for_key(&keys::key_from_binary(key_type, e).map_err(bad_key)?));
            }
        }
        Some((Format::Text, v)) => {
            for e in keys::array_elements_text(utf8(v)?)
                .map_err(bad_array)?
                .into_iter()
                .flatten()
            {
                shards
                    .push(map.shard_for_key(&keys::key_from_text(key_type, &e).map_err(bad_key)?));
            }
        }
    }
    Ok(shards)
}

/// Where the value of a scalar source is, and in which format; `None` when it is NULL.
fn raw_value<'v>(
    source: &'v KeySource,
    bind: Option<&Bind<'v>>,
    params_before: usize,
    literals: &'v (impl Literals + ?Sized),
) -> Result<Option<(Format, &'v [u8])>, SqlError> {
    match source {
        KeySource::Literal(text) => Ok(Some((Format::Text, text.as_bytes()))),
        KeySource::Param(i) if *i < params_before => {
            let Some(b) = bind else {
                return Err(SqlError::new(
                    errors::PROTOCOL_VIOLATION,
                    format!(
                        "the statement needs parameter ${} but no parameters were bound",
                        i + 1
                    ),
                ));
            };
            match b.param(*i) {
                None => Err(SqlError::new(
                    errors::PROTOCOL_VIOLATION,
                    format!(
                        "bind message supplies {} parameters, but the statement needs ${}",
                        b.param_count,
                        i + 1
                    ),
                )),
                Some((_, None)) => Ok(None),
                Some((format, Some(v))) => Ok(Some((format, v))),
            }
        }
        KeySource::Param(i) => match literals.literal(i - params_before) {
            Some(text) => Ok(Some((Format::Text, text.as_bytes()))),
            None => Err(SqlError::new(
                errors::PROTOCOL_VIOLATION,
                format!("internal: literal ${} of a cached plan is missing", i + 1),
            )),
        },
        KeySource::Array(_) => Err(SqlError::new(
            errors::PROTOCOL_VIOLATION,
            "internal: an array of keys where one key was expected",
        )),
    }
}
