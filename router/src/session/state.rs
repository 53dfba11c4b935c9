//! What a session is doing, as two small types instead of a dozen flags: the client's
//! transaction ([`Tx`]) and its extended-protocol batch ([`Batch`]), with every transition in
//! this file. Pure: the session's I/O code asks and tells; this decides.
//!
//! ```text
//!  Tx:     Idle ──BEGIN (answered by the router)──▶ Pending ──first statement sent──▶ Open
//!           ▲                                         │  │                            │
//!           └──── COMMIT/ROLLBACK (router), or ◀──────┘  └─ router's error ─▶ Failed ◀─┘ backend says E
//!                 backend says I                            (only COMMIT/ROLLBACK accepted)
//!
//!  Batch:  Idle ──message, no route yet──▶ Held ──route found, connection pinned──▶ OnBackend
//!           ▲ ▲                             │ └──Bind of DDL──▶ Broadcast   ─┐        │
//!           │ │                             └────Bind of a read across shards──▶ Scatter
//!           │ └──────────── Sync ◀──────────────────────────────────────────────────────┘
//!           └── Sync ◀── Skipping ◀── an error in any of them
//! ```
//!
//! Invariants the session keeps: `Tx::Open` holds a pinned backend connection; `Batch::Held`
//! holds none (the batch has no shard yet); `Batch::OnBackend` holds one; `Broadcast` and
//! `Scatter` batches run outside any transaction and are answered by the router until Sync.

use crate::protocol::reply::TxStatus;
use crate::resolver::Transaction;

use super::extended::Held;
use super::spread::ScatterBatch;

/// The client's transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tx {
    /// No transaction: autocommit.
    Idle,
    /// The client's `BEGIN`, answered by the router and not yet sent anywhere: it goes out in
    /// front of the transaction's first statement, on the shard that statement needs.
    Pending { begin: String },
    /// Open on the pinned backend connection.
    Open,
    /// Failed: on the pinned backend (Postgres said so), or before reaching any shard (the
    /// router refused a statement). Only COMMIT or ROLLBACK end it.
    Failed,
}

/// The client's extended-protocol batch: the messages since its last Sync.
#[derive(Debug, Default)]
pub enum Batch {
    /// No batch open.
    #[default]
    Idle,
    /// Messages waiting for the batch's shard (no Bind has named one yet), in [`State::held`].
    Held,
    /// Messages went to the pinned connection. Once one ran something (a Bind, an Execute, the
    /// Close of a portal), the batch is a transaction on that connection until its Sync and
    /// cannot move; before that it only prepared statements there, and can.
    OnBackend { executed: bool },
    /// After an error: messages are dropped until Sync, as Postgres does.
    Skipping,
    /// DDL for every shard: the router answers the batch's messages, and its Execute runs it.
    Broadcast { sql: String },
    /// A read across shards: the router answers the batch's messages, in order, at its Execute.
    Scatter(Box<ScatterBatch>),
}

/// A session's state: its transaction and its batch.
#[derive(Debug)]
pub struct State {
    pub tx: Tx,
    pub batch: Batch,
    /// The messages of a [`Batch::Held`] (empty otherwise). Kept across batches, so that
    /// holding messages allocates nothing once it has grown.
    held: Held,
}

impl Default for State {
    fn default() -> Self {
        State {
            tx: Tx::Idle,
            batch: Batch::Idle,
            held: Held::default(),
        }
    }
}

impl State {
    /// The transaction status the client is told in ReadyForQuery.
    pub fn status(&self) -> TxStatus {
        match self.tx {
            Tx::Idle => TxStatus::Idle,
            Tx::Pending { .. } | Tx::Open => TxStatus::InTransaction,
            Tx::Failed => TxStatus::Failed,
        }
    }

    /// The pinned connection holds nothing of the client's but statements prepared by the
    /// current batch: no transaction, nothing run. Work for another shard may then finish
    /// that batch there and move.
    pub fn only_prepared(&self) -> bool {
        matches!(self.batch, Batch::OnBackend { executed: false })
            && matches!(self.tx, Tx::Idle | Tx::Pending { .. })
    }

    /// The transaction as the resolver sees it, given the shard of the pinned connection.
    pub fn transaction(&self, pinned: Option<usize>) -> Transaction {
        let pinned = pinned.filter(|_| !self.only_prepared());
        match (&self.tx, pinned) {
            (Tx::Failed, None) => Transaction::Failed,
            (Tx::Idle, None) => Transaction::None,
            (_, shard) => Transaction::Open { shard },
        }
    }

    /// The router answered `BEGIN` itself.
    pub fn begin(&mut self, sql: &str) {
        self.tx = Tx::Pending {
            begin: sql.to_string(),
        };
    }

    /// The client's pending `BEGIN`, taken to be sent in front of its first statement.
    pub fn take_begin(&mut self) -> Option<String> {
        match std::mem::replace(&mut self.tx, Tx::Open) {
            Tx::Pending { begin } => Some(begin),
            other => {
                self.tx = other;
                None
            }
        }
    }

    /// The router ended a transaction that never reached a shard (COMMIT or ROLLBACK of a
    /// pending or failed one). Returns the command tag Postgres would answer.
    pub fn end_unsent(&mut self, commit: bool) -> &'static str {
        let tag = if commit && self.tx != Tx::Failed {
            "COMMIT"
        } else {
            "ROLLBACK"
        };
        self.tx = Tx::Idle;
        tag
    }

    /// The router answered a statement with an error: a transaction fails, as on Postgres.
    pub fn refused(&mut self) {
        if self.tx != Tx::Idle {
            self.tx = Tx::Failed;
        }
    }

    /// A backend's ReadyForQuery for the client's own Sync or Query.
    pub fn ready(&mut self, status: TxStatus) {
        self.tx = match status {
            TxStatus::Idle => Tx::Idle,
            TxStatus::InTransaction => Tx::Open,
            TxStatus::Failed => Tx::Failed,
        };
    }

    /// The pinned connection was lost: nothing of the client's is open anywhere now.
    pub fn lost(&mut self) {
        self.tx = Tx::Idle;
        self.set_batch(Batch::Idle);
    }

    /// An error inside an extended batch: drop the client's messages until its Sync.
    pub fn skip_to_sync(&mut self) {
        self.set_batch(Batch::Skipping);
    }

    /// Every way out of [`Batch::Held`] drops what was held: held messages belong to their
    /// batch only.
    pub fn set_batch(&mut self, batch: Batch) {
        if matches!(self.batch, Batch::Held) {
            self.held.clear();
        }
        self.batch = batch;
    }

    pub fn skipping(&self) -> bool {
        matches!(self.batch, Batch::Skipping)
    }

    /// Extended messages went to the pinned connection; `executes` when one ran something.
    pub fn sent_to_backend(&mut self, executes: bool) {
        match &mut self.batch {
            Batch::OnBackend { executed } => *executed |= executes,
            Batch::Skipping => {}
            _ => self.set_batch(Batch::OnBackend { executed: executes }),
        }
    }

    /// The batch ended (its Sync was answered).
    pub fn synced(&mut self) {
        self.set_batch(Batch::Idle);
    }

    /// The held messages (empty unless the batch is [`Batch::Held`]).
    pub fn held(&self) -> &Held {
        &self.held
    }

    /// The held messages, to add one: the batch now waits for its shard.
    pub fn held_mut(&mut self) -> &mut Held {
        if !matches!(self.batch, Batch::Held) {
            self.held.clear();
            self.batch = Batch::Held;
        }
        &mut self.held
    }

    /// The held messages, taken out to be sent (or answered): the batch no longer waits. Give
    /// the emptied storage back with [`State::keep_held`].
    pub fn take_held(&mut self) -> Held {
        if !matches!(self.batch, Batch::Held) {
            return Held::default();
        }
        self.batch = Batch::Idle;
        std::mem::take(&mut self.held)
    }

    /// Gives back the storage [`State::take_held`] took, emptied, for the next batch.
    pub fn keep_held(&mut self, mut held: Held) {
        held.clear();
        if self.held.is_empty() {
            self.held = held;
        }
    }

    /// Whether the connection may go back to its pool: nothing open, nothing owed.
    pub fn at_rest(&self) -> bool {
        self.tx == Tx::Idle && matches!(self.batch, Batch::Idle)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_transaction_the_router_answered_goes_out_with_its_first_statement() {
        let mut s = State::default();
        assert_eq!(s.status(), TxStatus::Idle);
        s.begin("BEGIN ISOLATION LEVEL SERIALIZABLE");
        assert_eq!(s.status(), TxStatus::InTransaction);
        assert_eq!(s.transaction(None), Transaction::Open { shard: None });
        assert_eq!(
            s.take_begin().as_deref(),
            Some("BEGIN ISOLATION LEVEL SERIALIZABLE")
        );
        assert_eq!(s.tx, Tx::Open);
        assert_eq!(s.take_begin(), None, "sent once");
        assert_eq!(s.transaction(Some(2)), Transaction::Open { shard: Some(2) });
        s.ready(TxStatus::Idle);
        assert!(s.at_rest());
    }

    #[test]
    fn a_refusal_fails_the_transaction_and_only_its_end_is_accepted() {
        let mut s = State::default();
        s.refused();
        assert_eq!(s.tx, Tx::Idle, "autocommit: nothing to fail");
        s.begin("BEGIN");
        s.refused();
        assert_eq!(s.status(), TxStatus::Failed);
        assert_eq!(s.transaction(None), Transaction::Failed);
        assert_eq!(
            s.end_unsent(true),
            "ROLLBACK",
            "COMMIT of a failed one rolls back"
        );
        assert_eq!(s.tx, Tx::Idle);
        s.begin("BEGIN");
        assert_eq!(s.end_unsent(true), "COMMIT");
    }

    #[test]
    fn a_batch_that_only_prepared_may_move() {
        let mut s = State::default();
        s.held_mut();
        assert!(matches!(s.batch, Batch::Held));
        let held = s.take_held();
        assert!(matches!(s.batch, Batch::Idle));
        s.keep_held(held);
        s.sent_to_backend(false);
        assert!(s.only_prepared());
        assert_eq!(
            s.transaction(Some(1)),
            Transaction::None,
            "the pin is only for preparing"
        );
        s.sent_to_backend(true);
        assert!(!s.only_prepared());
        assert_eq!(s.transaction(Some(1)), Transaction::Open { shard: Some(1) });
        s.synced();
        assert!(s.at_rest());
    }

    #[test]
    fn errors_skip_to_sync_and_a_lost_connection_ends_everything() {
        let mut s = State::default();
        s.sent_to_backend(true);
        s.skip_to_sync();
        assert!(s.skipping());
        s.sent_to_backend(true);
        assert!(s.skipping(), "still skipping");
        s.synced();
        assert!(!s.skipping());
        s.ready(TxStatus::InTransaction);
        s.sent_to_backend(true);
        s.lost();
        assert!(s.at_rest());
    }
}
