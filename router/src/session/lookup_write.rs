//! A DELETE from a table with lookup columns, or an UPDATE that sets them
//! (`Dest::ChangesLookups`): it runs on its shards returning, in text, each row's key and the
//! lookup columns' values (a DELETE: those it removed; an UPDATE: the new ones, then the old),
//! the router reads them, and changes the lookup rows in the same write: deletes those of the
//! values gone (holding the rows' keyspace IDs), inserts those of the values new (a value
//! another row has fails the write with `23505`). Outside a transaction that is one write on
//! several shards (`multishard::split_insert::run_then`), inside one it runs on the
//! transaction's connections. The client gets `DELETE n` or `UPDATE n`, as from what it sent.

use std::collections::BTreeMap;

use bytes::BytesMut;
use shardmap::ShardMap;
use tokio::io::{AsyncRead, AsyncWrite};

use super::{Session, SessionError};
use crate::errors;
use crate::multishard::split_insert::{self, Outcome};
use crate::protocol::frame::frames;
use crate::protocol::reply::{self, SqlError};
use crate::protocol::request;
use crate::resolver::ChangesLookups;
use crate::stats::{RouteKind, NO_SHARD};

impl<S: AsyncRead + AsyncWrite + Unpin> Session<S> {
    /// Runs the DELETE's `requests` (one per shard) and then the lookup rows' DELETEs, and
    /// writes the client's answer; `Ok(true)` when it failed.
    pub(super) async fn run_lookup_delete(
        &mut self,
        delete: &ChangesLookups,
        requests: Result<Vec<(usize, Vec<u8>)>, SqlError>,
        extended: Option<usize>,
        asked: &[u8],
    ) -> Result<bool, SessionError> {
        self.client
            .meter
            .route(RouteKind::MultiShardWrite, NO_SHARD);
        let routing = self.routing.clone();
        let outcome = match requests {
            Err(err) => Outcome::Failed(err),
            Ok(requests) if self.state.in_transaction() => {
                self.state.writes_lookups();
                self.delete_in_transaction(delete, requests).await?
            }
            Ok(requests) => {
                let then = |replies: &[Vec<u8>]| lookup_changes(&routing.map, delete, replies);
                split_insert::run_then(&routing, &requests, &self.settings, "the DELETE", then)
                    .await
            }
        };
        let out = &mut self.client.out;
        match outcome {
            Outcome::Committed(replies) => {
                if let Some(params) = extended {
                    let (statement, portal) = descriptions(&replies, params);
                    crate::multishard::gather::answer_asked(out, asked, &statement, &portal);
                }
                let total: u64 = replies
                    .iter()
                    .flat_map(|r| frames(r).map_while(Result::ok))
                    .filter(|f| f[0] == b'C')
                    .map(|f| crate::protocol::backend::rows_in_tag(&f[5..]))
                    .sum();
                let verb = if delete.update { "UPDATE" } else { "DELETE" };
                reply::command_complete(out, &format!("{verb} {total}"));
                Ok(false)
            }
            Outcome::RolledBack(frame) => {
                super::several::answer_until_description(asked, out);
                out.extend_from_slice(&frame);
                Ok(true)
            }
            Outcome::Failed(err) => {
                super::several::answer_until_description(asked, out);
                err.write(out);
                Ok(true)
            }
            Outcome::Answered => Ok(true),
        }
    }

    /// The DELETE and then its lookup rows' DELETEs, in the client's transaction.
    async fn delete_in_transaction(
        &mut self,
        delete: &ChangesLookups,
        requests: Vec<(usize, Vec<u8>)>,
    ) -> Result<Outcome, SessionError> {
        let replies = match self.split_in_transaction(requests).await? {
            Outcome::Committed(replies) => replies,
            other => return Ok(other),
        };
        let more = match lookup_changes(&self.routing.map, delete, &replies) {
            Ok(more) => more,
            Err(e) => {
                // The write ran on the transaction's connections without its lookup rows: the
                // transaction must not commit.
                self.state.refused();
                return Ok(Outcome::Failed(e));
            }
        };
        if more.is_empty() {
            return Ok(Outcome::Committed(replies));
        }
        Ok(match self.split_in_transaction(more).await? {
            Outcome::Committed(_) => Outcome::Committed(replies),
            other => other,
        })
    }
}

/// The changes of lookup rows that the write's `replies` (its RETURNING rows, in text) call
/// for, one simple Query per shard (deletes before inserts), in shard order.
fn lookup_changes(
    map: &ShardMap,
    delete: &ChangesLookups,
    replies: &[Vec<u8>],
) -> Result<Vec<(usize, Vec<u8>)>, SqlError> {
    // (shard, lookup) -> "(value, keyspace_id)" of the lookup rows to delete, and to insert.
    let mut gone: BTreeMap<(usize, usize), Vec<String>> = BTreeMap::new();
    let mut new: BTreeMap<(usize, usize), Vec<String>> = BTreeMap::new();
    let bad = |what: &str| errors::internal(format!("the write's RETURNING row: {what}"));
    let lookups = delete.lookups.len();
    for frame in replies.iter().flat_map(|r| frames(r).map_while(Result::ok)) {
        if frame[0] != b'D' {
            continue;
        }
        let values = data_row(&frame[5..]).ok_or_else(|| bad("malformed"))?;
        let Some(Some(key)) = values.first() else {
            continue;
        };
        let key = std::str::from_utf8(key).map_err(|_| bad("a key that is not text"))?;
        let id = delete
            .key_type
            .parse_key(key)
            .map_err(|e| bad(&e.to_string()))?
            .keyspace_id()
            .as_pg_bigint();
        for (n, lookup) in delete.lookups.iter().enumerate() {
            let now = values.get(n + 1).copied().flatten();
            let (old, added) = if delete.update {
                (values.get(1 + lookups + n).copied().flatten(), now)
            } else {
                (now, None)
            };
            if old == added {
                continue;
            }
            for (value, into) in [(old, &mut gone), (added, &mut new)] {
                let Some(value) = value else {
                    continue;
                };
                let value =
                    std::str::from_utf8(value).map_err(|_| bad("a value that is not text"))?;
                let value = lookup
                    .key_type
                    .parse_key(value)
                    .map_err(|e| bad(&e.to_string()))?;
                into.entry((map.shard_for_key(&value), n))
                    .or_default()
                    .push(format!("({}, {id})", value.sql_literal()));
            }
        }
    }
    let mut by_shard: BTreeMap<usize, Vec<String>> = BTreeMap::new();
    for ((shard, n), values) in gone {
        let lookup = &delete.lookups[n];
        by_shard.entry(shard).or_default().push(format!(
            "DELETE FROM {} WHERE ({}, keyspace_id) IN ({})",
            lookup.quoted_name(),
            shardmap::sql::quote_ident(&lookup.key),
            values.join(", ")
        ));
    }
    for ((shard, n), values) in new {
        let lookup = &delete.lookups[n];
        by_shard.entry(shard).or_default().push(format!(
            "INSERT INTO {} ({}, keyspace_id) VALUES {}",
            lookup.quoted_name(),
            shardmap::sql::quote_ident(&lookup.key),
            values.join(", ")
        ));
    }
    by_shard
        .into_iter()
        .map(|(shard, statements)| {
            let mut buf = BytesMut::new();
            request::query(&mut buf, &statements.join("; ")).map_err(errors::internal)?;
            Ok((shard, buf.to_vec()))
        })
        .collect()
}

/// The columns of a DataRow's body (`None` for NULL).
fn data_row(body: &[u8]) -> Option<Vec<Option<&[u8]>>> {
    let count = u16::from_be_bytes(body.get(..2)?.try_into().ok()?);
    let mut at = 2;
    let mut out = Vec::with_capacity(usize::from(count));
    for _ in 0..count {
        let len = i32::from_be_bytes(body.get(at..at + 4)?.try_into().ok()?);
        at += 4;
        if len < 0 {
            out.push(None);
            continue;
        }
        let len = usize::try_from(len).ok()?;
        out.push(Some(body.get(at..at + len)?));
        at += len;
    }
    Some(out)
}

/// The descriptions of the client's DELETE (it returns no rows): its parameters, as the
/// first shard typed them, and NoData; NoData for its portal.
fn descriptions(replies: &[Vec<u8>], client_params: usize) -> (Vec<u8>, Vec<u8>) {
    let mut statement = Vec::new();
    let typed = replies
        .first()
        .and_then(|r| frames(r).map_while(Result::ok).find(|f| f[0] == b't'));
    match typed {
        Some(t) => statement.extend_from_slice(t),
        None => {
            let zero = vec![[0u8; 4]; client_params];
            reply::parameter_description(&mut statement, zero.iter().map(|o| &o[..]));
        }
    }
    let mut no_data = Vec::new();
    crate::protocol::frame::put_frame(&mut no_data, b'n', &[]);
    statement.extend_from_slice(&no_data);
    (statement, no_data)
}
