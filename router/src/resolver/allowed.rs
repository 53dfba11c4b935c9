//! What this protocol and this transaction allow, whatever the plan says: some statements
//! exist only in the simple query protocol; an open transaction stays on its shard unless the
//! config lets it go on to others, and even then a failed one, or one held there by a
//! savepoint or a portal, cannot; work on several shards at once cannot join a transaction
//! that cannot span shards. A statement refused here resolves to the SQLSTATE the client gets.

use super::target::Dest;
use super::{range, Context, Resolved, Statement, Transaction};
use crate::errors;
use crate::planner::{Plan, Route};
use crate::protocol::reply::SqlError;

/// What holds an open transaction to its shard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Anchor {
    /// A savepoint made there (other shards would not roll back to it).
    Savepoint,
    /// A named portal bound there (other shards do not have it).
    Portal,
}

/// What keeps an open transaction where it is, beyond the config's `cross_shard`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Keeps {
    /// The shard of the client's pinned connection, if any.
    pub pinned: Option<usize>,
    /// It failed on its shard: only its end goes anywhere.
    pub failed: bool,
    /// It spans shards already: a savepoint cannot be made in it.
    pub spread: bool,
    /// It is held to its shard.
    pub anchor: Option<Anchor>,
}

/// Statements that only the simple query protocol carries, refused in a Bind.
pub(super) fn protocol(stmt: &Statement<'_>) -> Result<(), SqlError> {
    if stmt.params.bind.is_none() {
        return Ok(());
    }
    let (what, hint) = match stmt.plan.statements.as_slice() {
        [Route::PreparedSql] => (
            "PREPARE, EXECUTE and DEALLOCATE are supported in the simple query protocol only",
            "use the driver's own prepared statements, or send the command as a simple query",
        ),
        [Route::ExplainRoute(_)] => (
            "EXPLAIN (ROUTE) is answered in the simple query protocol only",
            "send it as a simple query, as psql does, with the key values written out",
        ),
        [Route::CopyIn(_)] => (
            "COPY into a sharded or reference table is supported in the simple query protocol only",
            "send COPY ... FROM STDIN as a simple query, as psql's \\copy does",
        ),
        _ => return Ok(()),
    };
    Err(SqlError::new(errors::FEATURE_NOT_SUPPORTED, what).with_hint(hint))
}

/// The rules of an open transaction: it stays on one shard unless the config lets it go on to
/// others (each statement still names one shard), and work on several shards at once (each part
/// in a transaction of its own) cannot join it.
pub(super) fn in_transaction<'a>(
    resolved: Resolved<'a>,
    cx: &Context<'a>,
) -> Result<Resolved<'a>, SqlError> {
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
        Dest::CopyIn(_) => Err(SqlError::new(
            errors::FEATURE_NOT_SUPPORTED,
            "COPY into a sharded or reference table cannot run inside a transaction: it commits on several shards by itself",
        )),
        Dest::SplitInsert(_) | Dest::ChangesLookups(_) if cx.cross_shard => Ok(resolved),
        Dest::ChangesLookups(_) => Err(SqlError::new(
            errors::FEATURE_NOT_SUPPORTED,
            "a DELETE from a table with lookup columns also deletes lookup rows on other shards, which a transaction that stays on one shard cannot do",
        )),
        Dest::SplitInsert(_) => Err(SqlError::new(
            errors::FEATURE_NOT_SUPPORTED,
            "the rows of this INSERT fall on several shards, which an INSERT inside a transaction cannot do yet",
        )
        .with_hint("insert the rows of each shard with an INSERT of their own, or run the INSERT outside a transaction")),
        _ => Ok(resolved),
    }
}

/// Why a statement with this destination cannot run in the open transaction, if it cannot: it
/// would take a transaction that failed, or one held to its shard by a savepoint or a portal,
/// to other shards; or it makes a savepoint in a transaction that spans shards.
pub(super) fn keeps_from(dest: &Dest, plan: &Plan, cx: &Context<'_>) -> Option<SqlError> {
    let savepoint = plan
        .statements
        .iter()
        .any(|r| matches!(r, Route::Savepoint));
    keeps(dest, savepoint, cx)
}

/// [`keeps_from`] for a statement that makes a savepoint (`savepoint`) or not.
pub(super) fn keeps(dest: &Dest, savepoint: bool, cx: &Context<'_>) -> Option<SqlError> {
    let keeps = cx.keeps;
    let pinned = keeps.pinned?;
    if savepoint && keeps.spread {
        return Some(errors::savepoint_across_shards());
    }
    if !leaves_shard(dest, pinned) {
        return None;
    }
    if keeps.failed {
        return Some(errors::in_failed_transaction());
    }
    keeps
        .anchor
        .map(|a| errors::held_to_its_shard(a == Anchor::Savepoint))
}

/// Whether `dest` runs anywhere but on shard `pinned` (a DECLARE: where its query runs).
fn leaves_shard(dest: &Dest, pinned: usize) -> bool {
    match dest {
        Dest::Shard(s) => *s != pinned,
        Dest::Read(_) | Dest::Write(_) | Dest::SplitInsert(_) | Dest::ChangesLookups(_) => true,
        Dest::Declare { query, .. } => leaves_shard(query, pinned),
        _ => false,
    }
}
