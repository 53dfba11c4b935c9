//! The session's side of a multi-row INSERT whose rows belong to several shards
//! ([`crate::frontend::split_insert`]): which rows go where, and the one answer.

use std::collections::BTreeMap;

use super::{routing, Session, SessionError, SqlError, TxStatus};
use crate::errors;
use crate::frontend::split_insert::{self, Outcome};
use crate::planner::values::values_rows;
use crate::protocol::reply;

impl Session {
    pub(super) async fn split_insert(&mut self, sql: &str) -> Result<(), SessionError> {
        if self.pinned.is_some() || self.tx != TxStatus::Idle {
            let err = SqlError::new(
                errors::FEATURE_NOT_SUPPORTED,
                "the rows of this INSERT fall on several shards, and a transaction runs on one shard",
            )
            .with_hint("insert the rows of each shard in their own transaction, or run the INSERT outside a transaction");
            return self.refuse_simple(err).await;
        }
        let planned = self.shared.planner.plan(sql, &mut self.nbuf);
        let shard_of_row = routing::row_shards(
            &planned,
            planned.params_before(),
            &planned,
            &self.shared.map,
        );
        drop(planned);
        let shard_of_row = match shard_of_row {
            Ok(s) => s,
            Err(err) => return self.refuse_simple(err).await,
        };
        let rows = match values_rows(sql) {
            Some(v) if v.rows.len() == shard_of_row.len() => v,
            _ => {
                let err = SqlError::new(
                    errors::FEATURE_NOT_SUPPORTED,
                    "the rows of this INSERT fall on several shards, and the router could not split its text",
                )
                .with_hint("send one INSERT per shard");
                return self.refuse_simple(err).await;
            }
        };
        let mut by_shard: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for (row, &shard) in shard_of_row.iter().enumerate() {
            by_shard.entry(shard).or_default().push(row);
        }
        let part_of_shard: BTreeMap<usize, usize> =
            by_shard.keys().enumerate().map(|(p, &s)| (s, p)).collect();
        let parts: Vec<(usize, String)> = by_shard
            .iter()
            .map(|(&shard, picked)| (shard, rows.statement(sql, picked.iter().copied())))
            .collect();
        let part_of_row: Vec<usize> = shard_of_row
            .iter()
            .map(|s| part_of_shard.get(s).copied().unwrap_or(0))
            .collect();
        match split_insert::run(&self.shared, parts, &self.settings).await {
            Outcome::Committed(replies) => {
                split_insert::combine(&replies, &part_of_row, &mut self.cout)
            }
            Outcome::RolledBack(frame) => self.cout.extend_from_slice(&frame),
            Outcome::Failed(err) => err.write(&mut self.cout),
        }
        reply::ready_for_query(&mut self.cout, TxStatus::Idle);
        Ok(())
    }
}
