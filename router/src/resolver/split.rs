//! A multi-row INSERT whose rows belong to several shards, cut into one INSERT per shard:
//! `VALUES` rows grouped by the shard of their key, or the arrays of `INSERT ... SELECT * FROM
//! UNNEST(...)` cut to each shard's elements. Pure.

use std::collections::BTreeMap;

use shardmap::sql::quote_literal;
use shardmap::ShardMap;

use super::target::{Dest, SplitInsert};
use super::{values, Statement};
use crate::errors;
use crate::planner::{KeySource, Route};
use crate::protocol::reply::SqlError;

/// A multi-row INSERT cut into one INSERT per shard, each with that shard's rows as the client
/// wrote them; with bound parameters each part's parameters are numbered afresh (and the part
/// is sent the client's values for them). A NULL key (which Postgres refuses for a primary key)
/// goes to the default shard, which says so.
pub(super) fn split_insert(stmt: &Statement<'_>, map: &ShardMap) -> Result<Dest, SqlError> {
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
    renumber(&mut split, stmt)?;
    Ok(Dest::SplitInsert(split))
}

/// With bound parameters: each part's parameters numbered afresh, and which of the client's
/// each stands for.
pub(super) fn renumber(split: &mut SplitInsert, stmt: &Statement<'_>) -> Result<(), SqlError> {
    let Some(bind) = stmt.params.bind else {
        return Ok(());
    };
    let cannot = || {
        SqlError::new(
            errors::FEATURE_NOT_SUPPORTED,
            "the router could not number the parameters of this INSERT's parts",
        )
        .with_hint("send one INSERT per shard")
    };
    for (_, sql) in &mut split.parts {
        let (renumbered, old) = crate::planner::values::renumber_params(sql).ok_or_else(cannot)?;
        if old.iter().any(|&i| i >= bind.param_count) {
            return Err(cannot());
        }
        *sql = renumbered;
        split.params.push(old);
    }
    Ok(())
}

/// `INSERT ... SELECT * FROM UNNEST(arrays)` cut into one statement per shard: each gets the
/// elements of its rows of every array, in their order. A bound array is sent in the client's
/// format with only those elements; a literal array is written into the shard's text in its
/// place. A NULL key goes to the default shard, which says so.
pub(super) fn split_unnest(
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
        lookup_only: vec![false; by_shard.len()],
        writes_lookups: false,
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
        lookup_only: vec![false; by_shard.len()],
        writes_lookups: false,
        parts,
        part_of_row,
        params: Vec::new(),
        values: Vec::new(),
    })
}
