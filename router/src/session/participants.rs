//! A transaction on several shards (`[transactions] cross_shard = "multi"`): the shards it
//! touched besides the one of its current statement, each a connection with a transaction of
//! its own open on it, and how the transaction moves between them and ends on all of them.
//!
//! The pinned connection ([`super::pin`]) stays the one the client's messages go to; when a
//! statement names another shard, the pinned connection is brought in step (everything sent
//! on it answered) and joins the session's others, and the statement's shard becomes the pinned one:
//! a connection it already has, or a new one that begins the same transaction (the client's
//! `BEGIN`, so its isolation level and read-only mode). An extended-protocol batch that
//! touches a second shard before its Sync is an implicit transaction in Postgres: its first
//! shard's part is turned into a transaction block there (`BEGIN` in the middle of the batch
//! does exactly that), and the client's Sync commits every shard, or rolls every shard back
//! when anything failed. COMMIT and ROLLBACK end every shard's part at once
//! ([`crate::multishard::commit::finish`]).
//!
//! A transaction that stays on one shard never gets here: it costs what it cost before.

use std::fmt::Write as _;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::task::JoinHandle;

use super::pinned::{Link, Pinned};
use super::replies::Audience;
use super::state::Tx;
use super::{Session, SessionError};
use crate::multishard::{commit, fanout, two_phase};
use crate::protocol::reply::SqlError;

/// What a statement on several shards sends each: the same messages, or each its own (in the
/// order of the shards).
pub enum Requests {
    Same(std::sync::Arc<Vec<u8>>),
    Each(Vec<std::sync::Arc<Vec<u8>>>),
}

/// What came of moving a transaction's next statement to another shard.
pub enum Joined {
    /// The statement's shard is the pinned connection now.
    Ready,
    /// The shard cannot be had: the statement fails with this error.
    Refused(SqlError),
    /// Something already sent failed (the client has its error): the batch skips to its Sync.
    Failed,
}

impl<S: AsyncRead + AsyncWrite + Unpin> Session<S> {
    /// The transaction (if any) runs on several shards, or has: it ends here, on all of them.
    /// Otherwise it runs on one shard only, as it would without this module.
    pub(super) fn spans_shards(&self) -> bool {
        !self.others.is_empty() || self.state.spread()
    }

    /// Whether a statement for `shard` needs the transaction to move there.
    fn moves_to(&self, shard: usize) -> bool {
        self.pin.as_ref().is_some_and(|p| p.shard != shard)
    }

    /// [`Session::reach`] for a simple Query: `false` when it cannot run there (the client
    /// has its error and ReadyForQuery).
    pub(super) async fn reach_for_query(
        &mut self,
        wanted: Option<usize>,
    ) -> Result<bool, SessionError> {
        match self.reach(wanted).await? {
            Joined::Ready => Ok(true),
            Joined::Refused(err) => self.refuse_query(&err).await.map(|()| false),
            Joined::Failed => {
                self.ready();
                Ok(false)
            }
        }
    }

    /// The pinned connection for a statement that needs `wanted` (`None`: any shard): the one
    /// held, the connection of another shard of the transaction, or a new one (with the
    /// client's pending `BEGIN` in front of the statement).
    pub(super) async fn reach(&mut self, wanted: Option<usize>) -> Result<Joined, SessionError> {
        match wanted {
            Some(shard) if self.moves_to(shard) => self.join(shard).await,
            _ => Ok(match self.attach(wanted, true).await {
                Ok(()) => Joined::Ready,
                Err(err) => Joined::Refused(err),
            }),
        }
    }

    /// Makes `shard` the pinned connection of the transaction under way (see the module
    /// documentation).
    pub(super) async fn join(&mut self, shard: usize) -> Result<Joined, SessionError> {
        // A transaction's connections are its own.
        if let Err(err) = self.unshare().await {
            return Ok(Joined::Refused(err));
        }
        let replay = match self.changes_to_replay() {
            Ok(replay) => replay,
            Err(err) => return Ok(Joined::Refused(err)),
        };
        if !self.bring_in_step().await? {
            return Ok(Joined::Failed);
        }
        if !self.spans_shards() && !self.open_on_first_shard(true).await? {
            return Ok(Joined::Failed);
        }
        let Some(current) = self.pin.take() else {
            return Ok(Joined::Failed);
        };
        self.others.push(current);
        if let Some(i) = self.others.iter().position(|p| p.shard == shard) {
            self.pin = Some(self.others.swap_remove(i));
            self.state.spans();
            self.point_cancel_at_pin();
            return Ok(Joined::Ready);
        }
        if let Err(err) = self.attach(Some(shard), false).await {
            // The transaction stays where it was.
            self.pin = self.others.pop();
            self.point_cancel_at_pin();
            return Ok(Joined::Refused(err));
        }
        self.state.spans();
        let begin = self.joining_prelude(&replay, true);
        if let Some(pin) = self.pin.as_mut() {
            // Inside a transaction: never sent again elsewhere.
            pin.fresh = false;
        }
        // In the same write as the statement; its error, if any, is the client's.
        self.out.query(&begin, Audience::Router)?;
        Ok(Joined::Ready)
    }

    /// Makes the pinned connection ready to be one shard of several (it is in step): an
    /// extended batch's implicit transaction becomes a block there (`BEGIN`, which Postgres
    /// allows in the middle of a batch), and, with `lock_timeout`, the transaction gets its lock
    /// timeout. From then on the batch ends on every shard at its Sync. `false` when the
    /// connection was lost (the client has the error).
    pub(super) async fn open_on_first_shard(
        &mut self,
        lock_timeout: bool,
    ) -> Result<bool, SessionError> {
        let implicit = self.state.opens_implicit();
        if self.pin.is_some() {
            let mut sql = String::new();
            if implicit {
                sql.push_str("BEGIN");
            }
            if lock_timeout {
                self.push_lock_timeout(&mut sql);
            }
            if !sql.is_empty() {
                self.out.query(&sql, Audience::Router)?;
                self.exchange().await?;
                match self.pin.as_mut() {
                    // A simple Query drops the unnamed statement.
                    Some(pin) => pin.unnamed = 0,
                    None => {
                        self.abandon_participants();
                        return Ok(false);
                    }
                }
            }
        }
        if implicit {
            self.state.open_implicit();
        }
        Ok(true)
    }

    /// Reads the replies to every message sent on the pinned connection so far (extended
    /// messages before their Sync: a Flush of the router's asks for them). `false` when one of
    /// them failed or the connection was lost: the client has the error, and the batch skips
    /// to its Sync.
    pub(super) async fn bring_in_step(&mut self) -> Result<bool, SessionError> {
        if self.pin.is_none() {
            // Nothing was sent anywhere.
            return Ok(true);
        }
        if !self.out.bytes.is_empty() || self.out.replies.awaits_backend() {
            self.out.flush();
            self.exchange().await?;
            if self.pin.is_none() {
                // Lost: the client was told, and the transaction's other shards roll back.
                self.abandon_participants();
                return Ok(false);
            }
        }
        if self.out.replies.take_error() {
            self.state.skip_to_sync();
            return Ok(false);
        }
        Ok(true)
    }

    /// Ends the transaction on every shard it touched, the pinned one included (each at rest:
    /// nothing owed), and gives the connections back. A COMMIT of a failed transaction rolls
    /// back, as on Postgres.
    pub(super) async fn end_participants(&mut self, commit: bool) -> Result<(), SqlError> {
        let commit = commit && self.state.tx != Tx::Failed;
        let mut open: Vec<_> = self
            .others
            .drain(..)
            .filter_map(|p| Some((p.shard, p.conn.into_own()?)))
            .collect();
        // (A transaction's connections are its own: a shared one never takes part.)
        if let Some((shard, Some(conn))) = self.pin.take().map(|p| (p.shard, p.conn.into_own())) {
            open.push((shard, conn));
        }
        self.slot.set_running(None);
        if !self.changes.is_empty() {
            // A SET ran on some of them, and which is not known: the next client of each
            // gets its settings applied afresh.
            for (_, conn) in &mut open {
                conn.settings_fp = crate::backend::settings::UNKNOWN;
            }
        }
        open.sort_by_key(|(shard, _)| *shard);
        self.state.ended_on_every_shard();
        let transactions = &self.routing.config.transactions;
        let ended = if commit
            && open.len() > 1
            && transactions.cross_shard == crate::config::CrossShard::TwoPhase
        {
            two_phase::commit(&self.routing, open, transactions.test_fault).await
        } else {
            commit::finish(&self.routing, open, commit, "the transaction").await
        };
        if commit && ended.is_ok() {
            self.changes.settle(&mut self.settings);
        } else {
            self.changes.rollback();
        }
        ended
    }

    /// The connections of a transaction that cannot go on (its pinned connection was lost, the
    /// client left): closed, which rolls each back.
    pub(super) fn abandon_participants(&mut self) {
        for p in self.others.drain(..) {
            if let Some(conn) = p.conn.into_own() {
                crate::backend::pool::discard(conn);
            }
        }
        self.state.ended_on_every_shard();
    }

    /// The transaction's part on each of `shards` for a statement that runs on all of them:
    /// the connections it has there (taken out of the session until [`Session::rejoin`]), and
    /// for the others a `BEGIN` like the client's. A pending `BEGIN` is taken now: the
    /// transaction starts with this statement.
    pub(super) fn enlist(
        &mut self,
        shards: &[usize],
        requests: Requests,
    ) -> Result<Vec<fanout::Member>, SqlError> {
        let replay = self.changes_to_replay()?;
        // A pending `BEGIN`: the transaction starts with this statement.
        self.state.take_begin();
        let spans = shards.len() > 1 || self.pin.as_ref().is_some_and(|p| p.shard != shards[0]);
        let first_spread = spans && !self.spans_shards();
        if spans {
            self.state.spans();
        }
        // A shared connection is nobody's to lend: the statement begins the transaction on a
        // connection of the client's own there.
        let mut held: Vec<Pinned> = self
            .pin
            .take()
            .filter(|p| !p.conn.is_shared())
            .into_iter()
            .collect();
        held.append(&mut self.others);
        let mut members = Vec::with_capacity(shards.len());
        for (i, &shard) in shards.iter().enumerate() {
            let mut prelude = String::new();
            let conn = match held.iter().position(|p| p.shard == shard) {
                Some(i) => {
                    if first_spread {
                        // The transaction spans shards from now on.
                        self.push_lock_timeout(&mut prelude);
                    }
                    held.swap_remove(i).conn.into_own()
                }
                None => {
                    prelude = self.joining_prelude(&replay, spans);
                    None
                }
            };
            let request = match &requests {
                Requests::Same(r) => r.clone(),
                Requests::Each(each) => each[i].clone(),
            };
            members.push(fanout::Member {
                shard,
                conn,
                prelude,
                request,
            });
        }
        // Shards of the transaction the statement does not touch stay as they are.
        self.others = held;
        Ok(members)
    }

    /// The settings statements the transaction ran so far (`SET`, `SET LOCAL`, `SET
    /// TRANSACTION ...`), for a shard that joins it: the transaction's settings are the same on
    /// every shard. Refused when one of them cannot be repeated on its own.
    fn changes_to_replay(&self) -> Result<Vec<String>, SqlError> {
        let texts = self.changes.texts();
        if texts
            .iter()
            .any(|t| t.trim().trim_end_matches(';').contains(';'))
        {
            return Err(SqlError::new(
                crate::errors::FEATURE_NOT_SUPPORTED,
                "this transaction changed settings in a query of several statements, which the router cannot repeat on another shard",
            )
            .with_hint("send each SET as a query of its own, or keep the transaction on one shard"));
        }
        Ok(texts
            .iter()
            .map(|t| t.trim().trim_end_matches(';').to_string())
            .collect())
    }

    /// The connections [`Session::enlist`] lent, back in the transaction; `false` when one
    /// broke (its shard's part is gone: the transaction cannot commit).
    pub(super) async fn rejoin(&mut self, handles: Vec<JoinHandle<fanout::Returned>>) -> bool {
        let mut all_back = true;
        for handle in handles {
            match handle.await {
                Ok((shard, Some(conn))) => self.others.push(Pinned {
                    shard,
                    conn: Link::Own(conn),
                    // The statement replaced the unnamed statement there.
                    unnamed: 0,
                    fresh: false,
                }),
                Ok((_, None)) => all_back = false,
                Err(e) => {
                    tracing::error!("a task of a statement on several shards failed: {e}");
                    all_back = false;
                }
            }
        }
        if self.pin.is_none() {
            self.pin = self.others.pop();
        }
        self.point_cancel_at_pin();
        all_back
    }

    /// How a shard joining the transaction begins it: the client's `BEGIN` (or a plain one),
    /// the settings statements the transaction ran so far (`replay`), and, when it spans
    /// shards, its lock timeout.
    fn joining_prelude(&self, replay: &[String], spans: bool) -> String {
        let mut sql = match self.state.begin_text() {
            "" => "BEGIN".to_string(),
            begin => begin.to_string(),
        };
        for text in replay {
            sql.push_str(";\n");
            sql.push_str(text);
        }
        if spans {
            self.push_lock_timeout(&mut sql);
        }
        sql
    }

    /// Appends the transaction's `SET LOCAL lock_timeout` (config `[transactions]
    /// lock_timeout_ms`) to `sql`, unless the client chose its own lock timeout.
    fn push_lock_timeout(&self, sql: &mut String) {
        let Some(timeout) = self.routing.config.transactions.lock_timeout else {
            return;
        };
        if self.settings.get("lock_timeout").is_some() {
            return;
        }
        if !sql.is_empty() {
            sql.push_str(";\n");
        }
        let _ = write!(sql, "SET LOCAL lock_timeout = {}", timeout.as_millis());
    }
}
