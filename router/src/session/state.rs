//! What a session is doing, as small types instead of flags: the client's transaction
//! ([`Tx`]) and what it knows of itself ([`Scope`]: how shards joining it begin, whether it
//! spans shards, what holds it to its shard), and its extended-protocol batch ([`Batch`]), with
//! every transition in this file. Pure: the session's I/O code asks and tells; this decides.
//!
//! ```text
//!  Tx:     Idle ──BEGIN (answered by the router)──▶ Pending ──first statement sent──▶ Open
//!           ▲ ▲                                       │  │                            │
//!           │ └── COMMIT/ROLLBACK (router), or ◀──────┘  └─ router's error ─▶ Failed ◀─┘ backend says E
//!           │     backend says I                            (only COMMIT/ROLLBACK accepted)
//!           │
//!           └── Sync (committed or rolled back on every shard) ◀── Implicit ◀── an extended batch
//!                                                                 outside a transaction reaches
//!                                                                 a second shard
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
//! `Scatter` batches are answered by the router until Sync. The [`Scope`] of a transaction is
//! empty whenever `Tx` is `Idle`.

use crate::planner::{Plan, Route};
use crate::protocol::reply::TxStatus;
use crate::resolver::{Anchor, Dest, Keeps, Transaction};

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
    /// An extended batch outside a transaction that went on to a second shard: Postgres makes
    /// a batch one implicit transaction, so the router holds a transaction block open on each
    /// of its shards until the batch's Sync, which commits all of them or none. The client is
    /// told `Idle`, as it would be by one Postgres.
    Implicit,
    /// Failed: on the pinned backend (Postgres said so), or before reaching any shard (the
    /// router refused a statement). Only COMMIT or ROLLBACK end it.
    Failed,
}

/// What the transaction under way knows of itself besides where it stands; empty outside one.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Scope {
    /// How a shard joining it begins it: the client's `BEGIN` (empty: a plain `BEGIN`), so
    /// its isolation level and read-only mode hold on every shard.
    begin: String,
    /// It has gone on to several shards (even if a shard's part is gone since, with a broken
    /// connection): it can only end, and the router ends it, on all of them.
    spans: bool,
    /// What holds it to its shard: a savepoint made there, a named portal bound there.
    anchor: Option<Anchor>,
    /// It wrote lookup rows (`crate::resolver::lookups`), which a lookup read outside it
    /// would not see.
    wrote_lookups: bool,
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
    scope: Scope,
    /// The current batch sent the client's own `BEGIN` to the pinned connection: the batch is
    /// the start of the client's transaction, not an implicit one, although no ReadyForQuery
    /// has said so yet. Until the batch's Sync.
    began_in_batch: bool,
    /// The messages of a [`Batch::Held`] (empty otherwise). Kept across batches, so that
    /// holding messages allocates nothing once it has grown.
    held: Held,
}

impl Default for State {
    fn default() -> Self {
        State {
            tx: Tx::Idle,
            batch: Batch::Idle,
            scope: Scope::default(),
            began_in_batch: false,
            held: Held::default(),
        }
    }
}

impl State {
    /// The transaction status the client is told in ReadyForQuery.
    pub fn status(&self) -> TxStatus {
        match self.tx {
            Tx::Idle | Tx::Implicit => TxStatus::Idle,
            Tx::Pending { .. } | Tx::Open => TxStatus::InTransaction,
            Tx::Failed => TxStatus::Failed,
        }
    }

    /// The transaction wrote lookup rows: reads by lookup in it run as without the lookup.
    pub fn wrote_lookups(&self) -> bool {
        self.scope.wrote_lookups
    }

    /// Notes that the open transaction wrote lookup rows.
    pub fn writes_lookups(&mut self) {
        self.scope.wrote_lookups = true;
    }

    /// A transaction is open: the client's, or an extended batch's that spans shards.
    pub fn in_transaction(&self) -> bool {
        self.tx != Tx::Idle
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
            // On one shard the backend decides what a failed transaction accepts (ROLLBACK TO
            // SAVEPOINT too); across shards the router does: any shard but the one that
            // failed would accept anything.
            (Tx::Failed, _) if self.spread() => Transaction::Failed,
            (Tx::Failed, None) => Transaction::Failed,
            (Tx::Idle, None) => Transaction::None,
            (_, shard) => Transaction::Open { shard },
        }
    }

    /// What keeps the transaction where it is, for the resolver, given the shard of the
    /// pinned connection.
    pub fn keeps(&self, pinned: Option<usize>) -> Keeps {
        Keeps {
            pinned,
            failed: self.tx == Tx::Failed,
            spread: self.spread(),
            anchor: self.scope.anchor,
        }
    }

    /// The transaction spans shards (or is an extended batch's that does).
    pub fn spread(&self) -> bool {
        self.scope.spans || self.tx == Tx::Implicit
    }

    /// How a shard joining the transaction begins it (empty: a plain `BEGIN`).
    pub fn begin_text(&self) -> &str {
        &self.scope.begin
    }

    /// The router answered `BEGIN` itself.
    pub fn begin(&mut self, sql: &str) {
        self.tx = Tx::Pending {
            begin: sql.to_string(),
        };
    }

    /// The client's pending `BEGIN`, taken to be sent in front of its first statement: the
    /// transaction is open from here on, and other shards it goes on to begin it the same way.
    pub fn take_begin(&mut self) -> Option<String> {
        match std::mem::replace(&mut self.tx, Tx::Open) {
            Tx::Pending { begin } => {
                self.scope.begin.clone_from(&begin);
                Some(begin)
            }
            other => {
                self.tx = other;
                None
            }
        }
    }

    /// The router ended a transaction that never reached a shard (COMMIT or ROLLBACK of a
    /// pending or failed one), or one it ended on every shard. Returns the command tag
    /// Postgres would answer.
    pub fn end_unsent(&mut self, commit: bool) -> &'static str {
        let tag = if commit && self.tx != Tx::Failed {
            "COMMIT"
        } else {
            "ROLLBACK"
        };
        self.set_tx(Tx::Idle);
        tag
    }

    /// The router answered a statement with an error: the client's transaction fails, as on
    /// Postgres. An implicit transaction stays what it is: the batch skips to its Sync, which
    /// rolls it back on every shard.
    pub fn refused(&mut self) {
        if matches!(self.tx, Tx::Pending { .. } | Tx::Open) {
            self.tx = Tx::Failed;
        }
    }

    /// A backend's ReadyForQuery for the client's own Sync or Query.
    pub fn ready(&mut self, status: TxStatus) {
        self.set_tx(match status {
            TxStatus::Idle => Tx::Idle,
            TxStatus::InTransaction => Tx::Open,
            TxStatus::Failed => Tx::Failed,
        });
    }

    /// The pinned connection was lost: nothing of the client's is open anywhere now.
    pub fn lost(&mut self) {
        self.set_tx(Tx::Idle);
        self.set_batch(Batch::Idle);
        self.began_in_batch = false;
    }

    /// Whether an extended batch outside a transaction that reaches a second shard becomes an
    /// implicit transaction on its shards ([`Tx::Implicit`]): not when it began the client's.
    pub fn opens_implicit(&self) -> bool {
        self.tx == Tx::Idle && !self.began_in_batch
    }

    /// The batch's first shard is now a transaction block: the batch is an implicit
    /// transaction over its shards, until its Sync.
    pub fn open_implicit(&mut self) {
        if self.opens_implicit() {
            self.tx = Tx::Implicit;
        }
    }

    /// The transaction went on to another shard.
    pub fn spans(&mut self) {
        self.scope.spans = true;
    }

    /// The transaction was ended on every shard it touched, or abandoned on all of them (its
    /// pinned connection was lost): nothing spans any more. The client's status is the
    /// caller's to set.
    pub fn ended_on_every_shard(&mut self) {
        self.scope = Scope::default();
        if self.tx == Tx::Implicit {
            self.tx = Tx::Idle;
        }
    }

    /// A statement held the transaction (if one is open) to its shard: a savepoint, which
    /// other shards would not roll back to, outranks a portal, which they do not have.
    pub fn anchor(&mut self, anchor: Option<Anchor>) {
        let open = !matches!(self.tx, Tx::Idle | Tx::Implicit);
        let (Some(anchor), true) = (anchor, open) else {
            return;
        };
        if self.scope.anchor != Some(Anchor::Savepoint) {
            self.scope.anchor = Some(anchor);
        }
    }

    /// The batch's Sync was handled, however it ended.
    pub fn batch_over(&mut self) {
        self.began_in_batch = false;
    }

    fn set_tx(&mut self, tx: Tx) {
        if tx == Tx::Idle {
            self.scope = Scope::default();
        }
        self.tx = tx;
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

    /// Extended messages went to the pinned connection; `executes` when one ran something,
    /// `begins` with the text of the client's own `BEGIN` when it was one of them.
    pub fn sent_to_backend(&mut self, executes: bool, begins: Option<&str>) {
        match &mut self.batch {
            Batch::OnBackend { executed } => *executed |= executes,
            Batch::Skipping => {}
            _ => self.set_batch(Batch::OnBackend { executed: executes }),
        }
        if let Some(begin) = begins {
            self.began_in_batch = true;
            self.scope.begin = begin.to_string();
        }
    }

    /// Whether the current batch sent the client's own `BEGIN` (see [`State::opens_implicit`]).
    pub fn began_in_batch(&self) -> bool {
        self.began_in_batch
    }

    /// The batch ended (its Sync was answered).
    pub fn synced(&mut self) {
        self.set_batch(Batch::Idle);
        self.began_in_batch = false;
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

/// What a statement (its plan, where it resolved to, and for a Bind whether it names a portal)
/// does to hold its transaction to its shard: a savepoint made, or a named portal bound there.
pub fn anchor_of(plan: &Plan, dest: &Dest, named_portal: bool) -> Option<Anchor> {
    let savepoint = plan
        .statements
        .iter()
        .any(|r| matches!(r, Route::Savepoint));
    if savepoint && !matches!(dest, Dest::Refused(_)) {
        return Some(Anchor::Savepoint);
    }
    // A portal that reads several shards is the router's, not a shard's.
    (named_portal && matches!(dest, Dest::Shard(_) | Dest::Any)).then_some(Anchor::Portal)
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
        s.sent_to_backend(false, None);
        assert!(s.only_prepared());
        assert_eq!(
            s.transaction(Some(1)),
            Transaction::None,
            "the pin is only for preparing"
        );
        s.sent_to_backend(true, None);
        assert!(!s.only_prepared());
        assert_eq!(s.transaction(Some(1)), Transaction::Open { shard: Some(1) });
        s.synced();
        assert!(s.at_rest());
    }

    #[test]
    fn errors_skip_to_sync_and_a_lost_connection_ends_everything() {
        let mut s = State::default();
        s.sent_to_backend(true, None);
        s.skip_to_sync();
        assert!(s.skipping());
        s.sent_to_backend(true, None);
        assert!(s.skipping(), "still skipping");
        s.synced();
        assert!(!s.skipping());
        s.ready(TxStatus::InTransaction);
        s.sent_to_backend(true, None);
        s.lost();
        assert!(s.at_rest());
    }

    #[test]
    fn a_transaction_knows_how_it_began_and_forgets_it_when_it_ends() {
        let mut s = State::default();
        s.begin("BEGIN ISOLATION LEVEL REPEATABLE READ");
        assert_eq!(s.begin_text(), "", "not yet sent");
        s.take_begin();
        assert_eq!(s.begin_text(), "BEGIN ISOLATION LEVEL REPEATABLE READ");
        s.spans();
        assert!(s.spread());
        s.ready(TxStatus::InTransaction);
        assert!(
            s.spread(),
            "a ReadyForQuery inside the transaction keeps it"
        );
        s.ready(TxStatus::Idle);
        assert_eq!(s.begin_text(), "");
        assert!(!s.spread());
        assert_eq!(
            s.keeps(Some(0)),
            Keeps {
                pinned: Some(0),
                ..Keeps::default()
            }
        );
    }

    #[test]
    fn a_batch_that_sent_the_clients_begin_is_not_an_implicit_transaction() {
        let mut s = State::default();
        assert!(s.opens_implicit());
        s.sent_to_backend(true, Some("BEGIN READ ONLY"));
        assert!(s.began_in_batch());
        assert_eq!(s.begin_text(), "BEGIN READ ONLY");
        assert!(!s.opens_implicit());
        s.open_implicit();
        assert_eq!(
            s.tx,
            Tx::Idle,
            "the client's own transaction, not an implicit one"
        );
        s.batch_over();
        assert!(!s.began_in_batch());
    }

    #[test]
    fn an_implicit_transaction_spans_shards_until_it_ends_on_all_of_them() {
        let mut s = State::default();
        s.sent_to_backend(true, None);
        s.open_implicit();
        assert_eq!(s.tx, Tx::Implicit);
        assert_eq!(s.status(), TxStatus::Idle, "the client never said BEGIN");
        assert!(s.in_transaction() && s.spread() && !s.at_rest());
        assert_eq!(s.transaction(Some(3)), Transaction::Open { shard: Some(3) });
        s.refused();
        assert_eq!(
            s.tx,
            Tx::Implicit,
            "an error skips the batch to its Sync, which rolls back every shard"
        );
        s.ended_on_every_shard();
        assert_eq!(s.tx, Tx::Idle);
        assert!(!s.spread());
    }

    #[test]
    fn a_savepoint_or_a_named_portal_holds_an_open_transaction_to_its_shard() {
        let mut s = State::default();
        s.anchor(Some(Anchor::Portal));
        assert_eq!(
            s.keeps(None).anchor,
            None,
            "no transaction: nothing to hold"
        );
        s.ready(TxStatus::InTransaction);
        s.anchor(Some(Anchor::Portal));
        s.anchor(Some(Anchor::Savepoint));
        s.anchor(Some(Anchor::Portal));
        assert_eq!(
            s.keeps(Some(1)).anchor,
            Some(Anchor::Savepoint),
            "a savepoint outranks a portal"
        );
        s.refused();
        assert!(s.keeps(Some(1)).failed);
        assert_eq!(s.end_unsent(true), "ROLLBACK");
        assert_eq!(s.keeps(None), Keeps::default());
    }

    #[test]
    fn a_failed_transaction_across_shards_is_judged_by_the_router() {
        let mut s = State::default();
        s.ready(TxStatus::Failed);
        assert_eq!(
            s.transaction(Some(2)),
            Transaction::Open { shard: Some(2) },
            "on one shard its backend judges"
        );
        s.spans();
        assert_eq!(s.transaction(Some(2)), Transaction::Failed);
    }
}
