//! Statements a lookup column routes ([`crate::planner::Route::Lookup`] and
//! [`crate::planner::Route::WithLookups`]). Pure: the reading of a lookup row is the session's.
//!
//! - A read (or UPDATE) by a lookup column resolves to [`Dest::Lookup`]: the SELECT that reads
//!   the value's lookup row and the shard it runs on, and where the statement runs when there is
//!   no such row (as it would without the lookup: every shard). Once the session has the
//!   keyspace ID, [`found`] applies the transaction's rules to its shard.
//! - An INSERT into a table with lookups resolves to a split INSERT whose parts also write the
//!   lookup rows of its values: on a shard that gets rows too, as a data-modifying `WITH` in
//!   front of that shard's INSERT; on any other, as a part of its own. All parts run as one
//!   write (in shard order, committed together, or in the client's transaction), so a row and
//!   its lookup rows are written together or not at all, and a value another row has already
//!   fails the write with `23505` from the lookup table's primary key.

use std::collections::BTreeMap;

use shardmap::sql::quote_ident;
use shardmap::{Key, KeyspaceId, ShardMap, Table};

use super::allowed::{in_transaction, keeps};
use super::plan::by_plan;
use super::target::{ByLookup, ChangesLookups, Dest, SplitInsert};
use super::{Context, Resolved, Statement};
use crate::errors;
use crate::planner::{KeySource, LookupRows, LookupValues, Plan, Route};
use crate::protocol::reply::SqlError;

/// The statement as `route` alone would place it (with the transaction's rules).
fn as_route<'a>(stmt: &Statement<'a>, route: &Route, cx: &Context<'a>) -> Result<Dest, SqlError> {
    let plan = Plan {
        statements: vec![route.clone()],
        normalized: stmt.plan.normalized,
        use_original: false,
        shareable: false,
        keeps_connection: false,
    };
    let inner = Statement {
        sql: stmt.sql,
        plan: &plan,
        params: stmt.params,
    };
    in_transaction(by_plan(&inner, cx)?, cx).map(|(dest, _)| dest)
}

/// A statement whose WHERE fixes `table`'s lookup column (the key of lookup table `lookup`) to
/// `value`.
pub(super) fn by_lookup<'a>(
    stmt: &Statement<'a>,
    cx: &Context<'a>,
    table: &str,
    lookup: &Table,
    value: &'a KeySource,
    without: &Route,
) -> Result<Dest, SqlError> {
    let Some(key) = stmt.params.key(value, lookup.key_type)? else {
        // `column = NULL` holds for no row: any shard answers.
        return Ok(Dest::Any);
    };
    let without = as_route(stmt, without, cx).unwrap_or_else(Dest::Refused);
    Ok(Dest::Lookup(ByLookup {
        column: format!("{table}.{}", lookup.key),
        value: key.sql_literal(),
        lookup_table: lookup.qualified_name(),
        shard: cx.map.shard_for_key(&key),
        sql: entry_sql(lookup, &key),
        without: Box::new(without),
    }))
}

/// The SELECT that reads the keyspace ID of `value` in lookup table `lookup`.
pub fn entry_sql(lookup: &Table, value: &Key<'_>) -> String {
    format!(
        "SELECT keyspace_id FROM {} WHERE {} = {}",
        lookup.quoted_name(),
        quote_ident(&lookup.key),
        value.sql_literal()
    )
}

/// The destination of a [`Dest::Lookup`] statement once its lookup row names `shard`: that
/// shard, as for a keyed statement, under the transaction's rules.
pub fn found(shard: usize, cx: &Context<'_>) -> Dest {
    let dest = match in_transaction((Dest::Shard(shard), None), cx) {
        Ok((dest, _)) => dest,
        Err(e) => return Dest::Refused(e),
    };
    match keeps(&dest, false, cx) {
        Some(e) => Dest::Refused(e),
        None => dest,
    }
}

/// An INSERT (`route`, keyed by its rows) that writes the lookup rows `lookups` too.
pub(super) fn insert<'a>(
    stmt: &Statement<'a>,
    cx: &Context<'a>,
    route: &'a Route,
    lookups: &'a [LookupRows],
) -> Result<Resolved<'a>, SqlError> {
    let Route::Keyed { keys, key_type, .. } = route else {
        return Err(errors::internal("an INSERT with lookups that is not keyed"));
    };
    if starts_with_with(stmt.sql) {
        return Err(SqlError::new(
            errors::FEATURE_NOT_SUPPORTED,
            "an INSERT with a WITH clause into a table with lookup columns is not supported",
        )
        .with_hint("send the INSERT without WITH"));
    }
    // Each row's keyspace ID (`None` for a NULL key, which its shard refuses).
    let ids: Vec<Option<KeyspaceId>> = match keys.as_slice() {
        [KeySource::Array(inner)] => stmt
            .params
            .array_keys(inner, *key_type)?
            .into_iter()
            .map(|k| k.map(|(_, id)| id))
            .collect(),
        _ => keys
            .iter()
            .map(|k| Ok(stmt.params.key(k, *key_type)?.map(|k| k.keyspace_id())))
            .collect::<Result<_, SqlError>>()?,
    };
    let mut split = match as_route(stmt, route, cx)? {
        Dest::Shard(shard) => whole(stmt, shard, ids.len())?,
        Dest::SplitInsert(split) => split,
        Dest::Refused(e) => return Err(e),
        // Every key NULL: Postgres refuses the rows; nothing to look up.
        other => return Ok((other, None)),
    };
    let mut entries: BTreeMap<usize, Vec<String>> = BTreeMap::new();
    for rows in lookups {
        for (shard, sql) in entry_inserts(stmt, cx.map, rows, &ids)? {
            entries.entry(shard).or_default().push(sql);
        }
    }
    split.writes_lookups = !entries.is_empty();
    with_entries(&mut split, entries);
    Ok((Dest::SplitInsert(split), None))
}

/// The shards an UPDATE or DELETE (`route`) runs on, or (`Err`) where it goes when it runs on
/// none of them in particular (every key NULL: it changes nothing).
fn write_shards<'a>(
    stmt: &Statement<'a>,
    route: &Route,
    cx: &Context<'a>,
) -> Result<Result<Vec<usize>, Dest>, SqlError> {
    Ok(match as_route(stmt, route, cx)? {
        Dest::Shard(shard) => Ok(vec![shard]),
        Dest::Write(write) => Ok(write.shards),
        Dest::Refused(e) => return Err(e),
        other => Err(other),
    })
}

/// A DELETE (`route`) from a table with lookups: where it runs, with `RETURNING returning`.
pub(super) fn delete<'a>(
    stmt: &Statement<'a>,
    cx: &Context<'a>,
    route: &Route,
    key_type: shardmap::KeyType,
    returning: &str,
    lookups: &[Table],
) -> Result<Dest, SqlError> {
    let shards = match write_shards(stmt, route, cx)? {
        Ok(shards) => shards,
        // Every key NULL: it deletes nothing anywhere.
        Err(other) => return Ok(other),
    };
    let sql = crate::planner::lookups::with_returning(stmt.sql, returning).ok_or_else(|| {
        SqlError::new(
            errors::FEATURE_NOT_SUPPORTED,
            "the router could not add RETURNING to this DELETE",
        )
    })?;
    Ok(Dest::ChangesLookups(ChangesLookups {
        shards,
        sql,
        update: false,
        key_type,
        lookups: lookups.to_vec(),
    }))
}

/// An UPDATE (`route`) that sets lookup columns of its table (`qualifier` in its text, keyed by
/// `key`): where it runs, rewritten to return the old and new values.
pub(super) fn update<'a>(
    stmt: &Statement<'a>,
    cx: &Context<'a>,
    route: &Route,
    qualifier: &str,
    key: &str,
    key_type: shardmap::KeyType,
    lookups: &[Table],
) -> Result<Dest, SqlError> {
    let shards = match write_shards(stmt, route, cx)? {
        Ok(shards) => shards,
        Err(other) => return Ok(other),
    };
    let columns: Vec<String> = lookups.iter().map(|l| l.key.clone()).collect();
    let sql = crate::planner::lookups::update_returning_old(stmt.sql, qualifier, key, &columns)
        .ok_or_else(|| {
            SqlError::new(
                errors::FEATURE_NOT_SUPPORTED,
                "this UPDATE sets a lookup column, and the router could not rewrite it to read the old values (WITH, FROM, RETURNING and WHERE CURRENT OF are not supported there)",
            )
        })?;
    Ok(Dest::ChangesLookups(ChangesLookups {
        shards,
        sql,
        update: true,
        key_type,
        lookups: lookups.to_vec(),
    }))
}

/// One lookup table's INSERT per shard for the values `rows` gives (rows with a NULL value or
/// key have none).
fn entry_inserts(
    stmt: &Statement<'_>,
    map: &ShardMap,
    rows: &LookupRows,
    ids: &[Option<shardmap::KeyspaceId>],
) -> Result<Vec<(usize, String)>, SqlError> {
    // Each row's value, as an SQL literal, and the shard of its lookup row.
    let values: Vec<Option<(String, usize)>> = match &rows.values {
        LookupValues::Rows(sources) => sources
            .iter()
            .map(|source| {
                let Some(source) = source else {
                    return Ok(None);
                };
                Ok(stmt
                    .params
                    .key(source, rows.table.key_type)?
                    .map(|v| (v.sql_literal(), map.shard_for_key(&v))))
            })
            .collect::<Result<_, SqlError>>()?,
        LookupValues::Array(KeySource::Array(inner)) => stmt
            .params
            .array_keys(inner, rows.table.key_type)?
            .into_iter()
            .map(|v| v.map(|(literal, id)| (literal, map.shard_for(id))))
            .collect(),
        LookupValues::Array(_) => return Err(errors::internal("a lookup array that is not one")),
    };
    let mut by_shard: BTreeMap<usize, Vec<String>> = BTreeMap::new();
    for (value, id) in values.into_iter().zip(ids) {
        if let (Some((literal, shard)), Some(id)) = (value, id) {
            by_shard
                .entry(shard)
                .or_default()
                .push(format!("({literal}, {})", id.as_pg_bigint()));
        }
    }
    let head = format!(
        "INSERT INTO {} ({}, keyspace_id) VALUES ",
        rows.table.quoted_name(),
        quote_ident(&rows.table.key)
    );
    Ok(by_shard
        .into_iter()
        .map(|(shard, values)| (shard, format!("{head}{}", values.join(", "))))
        .collect())
}

/// A keyed INSERT of `rows` rows on one shard as a split INSERT of one part (its parameters all
/// its own).
fn whole(stmt: &Statement<'_>, shard: usize, rows: usize) -> Result<SplitInsert, SqlError> {
    let mut split = SplitInsert {
        parts: vec![(shard, stmt.sql.to_string())],
        part_of_row: vec![0; rows],
        params: Vec::new(),
        values: Vec::new(),
        lookup_only: vec![false],
        writes_lookups: false,
    };
    super::split::renumber(&mut split, stmt)?;
    Ok(split)
}

/// Adds the lookup INSERTs (by shard) to `split`: in front of the part of their shard as a
/// data-modifying WITH, or as parts of their own, all in shard order.
fn with_entries(split: &mut SplitInsert, mut entries: BTreeMap<usize, Vec<String>>) {
    for (shard, sql) in &mut split.parts {
        if let Some(inserts) = entries.remove(shard) {
            *sql = prefixed(&inserts, sql);
        }
    }
    for (shard, inserts) in entries {
        let (last, before) = inserts
            .split_last()
            .map_or(("", &[][..]), |(l, b)| (l.as_str(), b));
        let sql = if before.is_empty() {
            last.to_string()
        } else {
            prefixed(before, last)
        };
        let at = split.parts.partition_point(|(s, _)| *s < shard);
        split.parts.insert(at, (shard, sql));
        split.lookup_only.insert(at, true);
        if !split.params.is_empty() {
            split.params.insert(at, Vec::new());
        }
        if !split.values.is_empty() {
            split.values.insert(at, Vec::new());
        }
        for p in &mut split.part_of_row {
            if *p >= at {
                *p += 1;
            }
        }
    }
}

/// `statement` after a WITH of the data-modifying `inserts`.
fn prefixed(inserts: &[String], statement: &str) -> String {
    let ctes: Vec<String> = inserts
        .iter()
        .enumerate()
        .map(|(n, ins)| format!("shardgate_lookup_{n} AS ({ins})"))
        .collect();
    format!("WITH {} {statement}", ctes.join(", "))
}

/// Whether the text's first word is WITH (after blanks and comments).
fn starts_with_with(sql: &str) -> bool {
    use sqlparser::dialect::PostgreSqlDialect;
    use sqlparser::keywords::Keyword;
    use sqlparser::tokenizer::{Token, Tokenizer};
    let Ok(tokens) = Tokenizer::new(&PostgreSqlDialect {}, sql).tokenize() else {
        return false;
    };
    // Comments are whitespace to the tokenizer.
    tokens
        .iter()
        .find(|t| !matches!(t, Token::Whitespace(_)))
        .is_some_and(|t| matches!(t, Token::Word(w) if w.keyword == Keyword::WITH))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_rows_go_in_front_of_their_shards_insert_or_in_parts_of_their_own_in_shard_order() {
        let mut split = SplitInsert {
            parts: vec![(1, "INSERT a".into()), (3, "INSERT b".into())],
            part_of_row: vec![0, 1, 0],
            params: vec![vec![0], vec![1]],
            values: Vec::new(),
            lookup_only: vec![false, false],
            writes_lookups: true,
        };
        let mut entries = BTreeMap::new();
        entries.insert(0, vec!["L0".to_string()]);
        entries.insert(3, vec!["L3".to_string(), "M3".to_string()]);
        entries.insert(5, vec!["L5".to_string(), "M5".to_string()]);
        with_entries(&mut split, entries);
        let shards: Vec<usize> = split.parts.iter().map(|(s, _)| *s).collect();
        assert_eq!(shards, [0, 1, 3, 5]);
        assert_eq!(split.lookup_only, [true, false, false, true]);
        assert_eq!(split.parts[0].1, "L0");
        assert_eq!(
            split.parts[2].1,
            "WITH shardgate_lookup_0 AS (L3), shardgate_lookup_1 AS (M3) INSERT b"
        );
        assert_eq!(split.parts[3].1, "WITH shardgate_lookup_0 AS (L5) M5");
        // Rows still point at their own parts, and the new parts bind no parameters.
        assert_eq!(split.part_of_row, [1, 2, 1]);
        assert_eq!(split.params, [vec![], vec![0], vec![1], vec![]]);
    }

    #[test]
    fn with_is_seen_past_comments() {
        assert!(starts_with_with(
            "/* c */ -- d\n WITH x AS (SELECT 1) INSERT INTO t VALUES (1)"
        ));
        assert!(!starts_with_with("INSERT INTO t (w) VALUES ('WITH')"));
    }
}
