//! The resolver: a plan, the statement's values, the shard map and the client's transaction in;
//! a [`Target`] out. Step 3 of the statement path, between the planner (text → [`Plan`], shared
//! by every text of the same shape) and the session (which executes targets).
//!
//! A plan says *how* to find the shards (which parameter or literal holds each key); this module
//! reads those values ([`values`]), hashes them, looks the shards up in the map, and applies the
//! rules that depend on the moment rather than on the text: a transaction stays on one shard,
//! multi-shard work runs outside transactions, some statements exist only in one protocol, an
//! operator may pin statements to a shard ([`manual`]). What the plan says (`plan`, with INSERTs
//! split by shard in `split`) and what the moment allows (`allowed`: the protocol, the
//! transaction) are apart. A key that cannot be read, or a statement that cannot run where it
//! is, resolves to [`Dest::Refused`] with the SQLSTATE the client gets, never to a guess.
//!
//! Pure: no I/O, no clock, no locks. A single-shard statement resolves without allocating.

mod allowed;
pub mod explain;
pub mod lookups;
pub mod manual;
mod plan;
mod split;
mod target;
mod values;

#[cfg(test)]
mod tests;

use shardmap::ShardMap;

pub use allowed::{Anchor, Keeps};
pub use target::{
    ByLookup, ChangesLookups, Dest, NewKeys, Read, Reroute, SplitInsert, Target, Why, Write,
};
pub use values::{Literals, Params};

use crate::errors;
use crate::planner::{Control, Plan, Route};
use crate::protocol::reply::SqlError;
use allowed::{in_transaction, keeps_from};
use plan::by_plan;

/// One statement to resolve: its text, its plan and where its values are.
#[derive(Clone, Copy)]
pub struct Statement<'a> {
    /// The client's text (with its literals): what a rewrite for the shards starts from.
    pub sql: &'a str,
    pub plan: &'a Plan,
    pub params: Params<'a>,
}

impl<'a> Statement<'a> {
    /// A statement planned from its text alone (a simple Query, `EXPLAIN (ROUTE)`,
    /// `shardgate explain`): its values are the literals the planner took out of the text.
    pub fn from_text<'b: 'a>(sql: &'a str, planned: &'a crate::planner::PlanRef<'b>) -> Self {
        Statement {
            sql,
            plan: planned,
            params: Params {
                bind: None,
                params_before: planned.params_before(),
                literals: planned,
            },
        }
    }
}

/// The client's transaction, as far as routing cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transaction {
    /// Nothing open: autocommit.
    None,
    /// A transaction is open (or an extended-protocol batch has run something, which Postgres
    /// treats as one transaction until its Sync), on `shard` once one is chosen.
    Open { shard: Option<usize> },
    /// The transaction failed before it reached any shard: only its end is accepted.
    Failed,
}

/// What besides the statement decides its target.
#[derive(Clone, Copy)]
pub struct Context<'a> {
    pub map: &'a ShardMap,
    pub transaction: Transaction,
    /// What the session says about pinning statements by hand (`shardgate.shard`,
    /// `shardgate.sharding_key`, whether this client may).
    pub pins: manual::Pins<'a>,
    /// UPDATE/DELETE without a key may run on every shard (config or session opt-in).
    pub allow_scatter_writes: bool,
    /// A transaction may go on to other shards (`[transactions] cross_shard = "multi"`): a
    /// statement for another shard goes there, and the session makes that shard a participant.
    pub cross_shard: bool,
    /// What keeps an open transaction on its shard ([`Transaction::Open`]).
    pub keeps: Keeps,
}

/// Resolves one statement (all statements of a simple Query, which must agree on a shard).
pub fn resolve<'a>(stmt: &Statement<'a>, cx: &Context<'a>) -> Target<'a> {
    let mut target = match dest(stmt, cx) {
        Ok((dest, why)) => Target::new(dest, why, cx.map),
        Err(e) => Target::new(Dest::Refused(e), None, cx.map),
    };
    if let Some(err) = keeps_from(&target.dest, stmt.plan, cx) {
        target.dest = Dest::Refused(err);
    }
    target
}

/// A destination, and why for one shard.
pub(super) type Resolved<'a> = (Dest, Option<Why<'a>>);

fn dest<'a>(stmt: &Statement<'a>, cx: &Context<'a>) -> Result<Resolved<'a>, SqlError> {
    let control = transaction_control(stmt.plan);
    if cx.transaction == Transaction::Failed {
        // Like Postgres: a failed transaction accepts only its end.
        return match control {
            Some(d @ (Dest::Commit | Dest::Rollback)) => Ok((d, None)),
            _ => Err(errors::in_failed_transaction()),
        };
    }
    if let Some((shard, hint)) = manual::pinned(stmt.sql, cx.pins, cx.map)? {
        // Everything but transaction control and what the router answers itself goes there,
        // even what could not be routed otherwise: that is what pinning by hand is for. New
        // keys are keys of that shard.
        match stmt.plan.statements.as_slice() {
            [Route::PreparedSql | Route::ExplainRoute(_)] => {}
            [Route::NewKeys { .. }] => {
                return match by_plan(stmt, cx)? {
                    (Dest::NewKeys(new), _) => in_transaction(
                        (
                            Dest::NewKeys(NewKeys {
                                shard: Some(shard),
                                ..new
                            }),
                            Some(Why::Manual(hint)),
                        ),
                        cx,
                    ),
                    other => in_transaction(other, cx),
                };
            }
            _ => {
                return match control {
                    Some(d) => Ok((d, None)),
                    None => in_transaction((Dest::Shard(shard), Some(Why::Manual(hint))), cx),
                }
            }
        }
    }
    in_transaction(by_plan(stmt, cx)?, cx)
}

/// `BEGIN`, `COMMIT` or `ROLLBACK` when that is all the plan is.
pub(super) fn transaction_control(plan: &Plan) -> Option<Dest> {
    plan.control().map(|c| match c {
        Control::Begin => Dest::Begin,
        Control::Commit => Dest::Commit,
        Control::Rollback => Dest::Rollback,
    })
}

pub(super) fn range(map: &ShardMap, shard: usize) -> String {
    map.shards()[shard].range.to_string()
}
