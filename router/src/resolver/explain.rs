//! A [`Target`] as rows, one per shard it involves: what `EXPLAIN (ROUTE) statement` answers
//! and `shardgate explain` prints. Pure.

use super::target::{Dest, Target, Why};
use crate::planner::CopyRows;

/// The columns of an explained route, in order.
pub const COLUMNS: [&str; 7] = [
    "shard",
    "primary",
    "reason",
    "keyspace_id",
    "how",
    "shard_sql",
    "plan_cache",
];

/// One row: a shard (or none, for what the router answers itself) and what happens there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    /// The shard's range.
    pub shard: Option<String>,
    /// Its primary, as `host:port/database`.
    pub primary: Option<String>,
    /// Why the statement goes there.
    pub reason: String,
    /// The key's keyspace ID (16 hex digits), when one key decides.
    pub keyspace_id: Option<String>,
    /// How the shards' work combines.
    pub how: String,
    /// What that shard runs.
    pub sql: Option<String>,
}

impl Row {
    /// The row's values, in [`COLUMNS`] order, with `plan_cache` (`hit` or `miss`) last.
    pub fn values<'r>(&'r self, plan_cache: &'r str) -> [Option<&'r str>; 7] {
        [
            self.shard.as_deref(),
            self.primary.as_deref(),
            Some(&self.reason),
            self.keyspace_id.as_deref(),
            Some(&self.how),
            self.sql.as_deref(),
            Some(plan_cache),
        ]
    }
}

/// A row on a shard: `(shard, reason, keyspace_id, how, sql)`.
type RowAt<'a> = dyn Fn(usize, String, Option<String>, &str, &str) -> Row + 'a;

/// The rows of `target`, for the statement `sql`.
pub fn rows(target: &Target<'_>, sql: &str) -> Vec<Row> {
    let map = target.map();
    let at = |shard: usize, reason: String, keyspace_id: Option<String>, how: &str, sql: &str| {
        let s = map.shards().get(shard);
        Row {
            shard: Some(s.map_or_else(|| format!("#{shard}"), |s| s.range.to_string())),
            primary: s.map(|s| s.primary.endpoint()),
            reason,
            keyspace_id,
            how: how.to_string(),
            sql: Some(sql.to_string()),
        }
    };
    let router = |reason: &str, how: &str| Row {
        shard: None,
        primary: None,
        reason: reason.to_string(),
        keyspace_id: None,
        how: how.to_string(),
        sql: None,
    };
    match &target.dest {
        Dest::Shard(shard) => {
            let (reason, id) = match &target.why {
                Some(Why::Key {
                    table,
                    column,
                    value,
                    id,
                }) => (
                    format!("{table}.{column} = {}", super::target::KeyText(value)),
                    Some(id.to_string()),
                ),
                _ => (why_text(target), None),
            };
            vec![at(*shard, reason, id, "one shard", sql)]
        }
        Dest::Lookup(l) => vec![at(
            l.shard,
            format!("{} = {}: its lookup row ({}) is here", l.column, l.value, l.lookup_table),
            None,
            "read first; the statement then runs on the shard of the keyspace ID it holds (every shard when there is none)",
            &l.sql,
        )],
        Dest::ChangesLookups(d) => d
            .shards
            .iter()
            .map(|&s| {
                at(
                    s,
                    "a DELETE from a table with lookup columns".into(),
                    None,
                    "then the lookup rows of the values it removed, on their shards; one write, committed together",
                    &d.sql,
                )
            })
            .collect(),
        Dest::Any => vec![router(
            "no sharded or unsharded table: any shard",
            "one shard, chosen in turn",
        )],
        Dest::Begin => vec![router(
            "BEGIN, answered by the router",
            "sent with the transaction's first statement, on its shard",
        )],
        Dest::Commit | Dest::Rollback => vec![router(
            "the end of a transaction",
            "on the transaction's shard; answered by the router when it reached none",
        )],
        Dest::Broadcast => (0..map.shards().len())
            .map(|s| {
                at(
                    s,
                    "DDL that every shard needs".into(),
                    None,
                    "every shard at once, each in its own transaction; one answer",
                    sql,
                )
            })
            .collect(),
        Dest::Read(read) => read_rows(read, sql, &at),
        Dest::Write(write) => {
            let reason = if write.replicas {
                "a write of a reference table, which every shard holds whole (the first shard answers, the others must agree)"
            } else if write.keyed {
                "the shards of the statement's keys"
            } else {
                "a write without its key, allowed on every shard"
            };
            write
                .shards
                .iter()
                .map(|&s| {
                    at(
                        s,
                        reason.into(),
                        None,
                        "one transaction per shard in shard order, committed together",
                        sql,
                    )
                })
                .collect()
        }
        Dest::SplitInsert(split) => split_rows(split, &at),
        Dest::NewKeys(n) => vec![router(
            &format!(
                "an INSERT that leaves out the sharding key {}.{}: the router gives its {} rows keys of one shard, from the blocks of keys it reserves",
                n.table, n.key, n.rows
            ),
            "the INSERT runs on that shard with the keys written in",
        )],
        Dest::CopyIn(CopyRows::ByKey { key_type, .. }) => vec![router(
            &format!("COPY into a sharded table, rows split by their {key_type} key"),
            "every shard that gets rows runs the same COPY",
        )],
        Dest::CopyIn(CopyRows::ToEveryShard) => vec![router(
            "COPY into a reference table: every row to every shard",
            "each shard runs the same COPY in a transaction; all commit together or none",
        )],
        Dest::ExplainRoute => vec![router("EXPLAIN (ROUTE), answered by the router", "not run")],
        Dest::PreparedSql => vec![router(
            "SQL-level PREPARE, EXECUTE or DEALLOCATE",
            "run by the router on the client's prepared statements",
        )],
        Dest::Declare { .. } | Dest::Cursor { .. } => {
            vec![router(&target.to_string(), "a cursor's commands follow it")]
        }
        Dest::Refused(e) => vec![router(
            &format!("refused ({}): {}", e.code, e.message),
            "not run",
        )],
    }
}

/// A split INSERT's rows: one per part (the parts that write only lookup rows say so).
fn split_rows(split: &super::target::SplitInsert, at: &RowAt<'_>) -> Vec<Row> {
    let how = "one transaction per shard in shard order, committed together";
    split
        .parts
        .iter()
        .zip(&split.lookup_only)
        .map(|((s, part), &lookup_only)| {
            if lookup_only {
                return at(
                    *s,
                    "lookup rows of the INSERT's values live here".into(),
                    None,
                    how,
                    part,
                );
            }
            let n = split
                .part_of_row
                .iter()
                .filter(|&&p| split.parts.get(p).is_some_and(|q| q.0 == *s))
                .count();
            at(
                *s,
                format!("{n} of the INSERT's rows have their keys here"),
                None,
                how,
                part,
            )
        })
        .collect()
}

/// The reason of a single-shard target, as [`Target`]'s Display says it.
fn why_text(target: &Target<'_>) -> String {
    let text = target.to_string();
    match text.split_once(": ") {
        Some((_, why)) => why.to_string(),
        None => text,
    }
}

/// A read's rows: one per shard of its first (or only) stage, and the second stage's.
fn read_rows(read: &super::target::Read, sql: &str, at: &RowAt<'_>) -> Vec<Row> {
    let reason = if read.keyed {
        "the shards of the statement's keys"
    } else {
        "a sharded table without its key: every shard"
    };
    let how = match &read.merge {
        _ if read.labels => "each shard's answer under a line naming the shard",
        None => "rows concatenated in shard order",
        Some(m) if m.group.is_some() => "groups combined by the router",
        Some(_) => "sorted streams merged by the router",
    };
    let shard_sql = read.shard_sql.as_deref().unwrap_or(sql);
    let mut rows: Vec<Row> = read
        .shards
        .iter()
        .map(|&s| at(s, reason.into(), None, how, shard_sql))
        .collect();
    if let (Some(staged), Some(&first)) = (&read.staged, read.shards.first()) {
        // The second stage: the rest of the statement over the first stage's rows.
        let second = format!(
            "{}(SELECT ... FROM unnest(<the rows, one array per column>)) AS {}{}",
            staged.before, staged.alias, staged.after
        );
        rows.push(at(
            first,
            "the rest of the statement, over the rows of the shards' part".into(),
            None,
            "then: the shards' rows above, merged, as array parameters in that part's place",
            &second,
        ));
    }
    rows
}
