//! Two-phase commit of a transaction that spans shards (`[transactions] cross_shard =
//! "two_phase"`), and the recovery of transactions a router left in doubt.
//!
//! **Commit.** The participant of the lowest shard is the coordinator. Inside its transaction
//! the router writes the decision to come: a row of [`DECISIONS`] keyed by the transaction's
//! id. Then every participant runs `PREPARE TRANSACTION`, the coordinator first. `COMMIT
//! PREPARED` on the coordinator is the decision: it commits the row together with the
//! coordinator's part, atomically. The other participants are committed after it. Anything that
//! fails before the decision rolls every participant back.
//!
//! **Recovery** ([`recover`], every router, at start and periodically): a prepared transaction of
//! shardgate's that is older than a grace period is committed if its decision row exists on
//! its coordinator, and rolled back otherwise, after first rolling back the coordinator's own
//! prepared part if it is still there (deciding "abort"). Postgres lets only one of `COMMIT
//! PREPARED` and `ROLLBACK PREPARED` of the coordinator's part succeed, so the router that ran
//! the transaction and any number of recovering routers always agree: the row exists exactly
//! when the coordinator committed.
//!
//! Global transaction ids ([`Gid`]) carry the router's id, the transaction's id (unique per
//! router start), and the shard ranges of the coordinator and of the participant.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use crate::backend::pool::PooledConn;
use crate::backend::BackendConn;
use crate::config::TwoPhaseFault as Fault;
use crate::errors;
use crate::protocol::reply::SqlError;
use crate::routing::Routing;
use shardmap::sql::quote_literal;

/// Where coordinators keep their decisions; made on every shard by [`prepare_shard`].
pub const DECISIONS: &str = "shardgate.prepared_decisions";

/// What a router in two-phase mode makes sure every shard has. `IF NOT EXISTS` alone is not
/// safe when several routers of a fleet start at once: two sessions can both find the schema
/// missing and one then fails on the catalog's unique index (`23505`). So the statements run as
/// one implicit transaction that first takes a transaction-level advisory lock (released at its
/// end; the key is `hashtext('shardgate.prepared_decisions')`), and the creators go one by one.
const SCHEMA_SQL: &str = "SELECT pg_advisory_xact_lock(hashtext('shardgate.prepared_decisions')); \
    CREATE SCHEMA IF NOT EXISTS shardgate; \
    CREATE TABLE IF NOT EXISTS shardgate.prepared_decisions \
    (txid text PRIMARY KEY, decided_at timestamptz NOT NULL DEFAULT now())";

/// The id of one participant's prepared transaction: `sg:<router>:<txid>:<coordinator>:<shard>`
/// (shard ranges such as `40-80`, which hold no `:`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gid {
    pub router: u8,
    pub txid: String,
    pub coordinator: String,
    pub shard: String,
}

impl Gid {
    pub fn text(&self) -> String {
        format!(
            "sg:{}:{}:{}:{}",
            self.router, self.txid, self.coordinator, self.shard
        )
    }

    /// A gid of shardgate's, or `None` for any other (prepared by someone else: left alone).
    pub fn parse(text: &str) -> Option<Gid> {
        let mut parts = text.split(':');
        if parts.next()? != "sg" {
            return None;
        }
        let gid = Gid {
            router: parts.next()?.parse().ok()?,
            txid: parts.next()?.to_string(),
            coordinator: parts.next()?.to_string(),
            shard: parts.next()?.to_string(),
        };
        (parts.next().is_none() && !gid.txid.is_empty()).then_some(gid)
    }

    /// The gid of the coordinator's own part of the same transaction.
    pub fn of_coordinator(&self) -> Gid {
        Gid {
            shard: self.coordinator.clone(),
            ..self.clone()
        }
    }
}

/// A transaction id no other transaction of any start of this router has had: the start time
/// in microseconds and a counter.
fn next_txid() -> String {
    static START: OnceLock<u64> = OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let start = *START.get_or_init(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as u64)
    });
    format!("{start:x}.{:x}", COUNTER.fetch_add(1, Ordering::Relaxed))
}

/// Commits `open` (each connection at rest inside the transaction, in shard order, at least
/// two) with two-phase commit, as the module documentation says.
pub async fn commit(
    routing: &Routing,
    mut open: Vec<(usize, PooledConn)>,
    fault: Option<Fault>,
) -> Result<(), SqlError> {
    let name = |shard: usize| routing.shard_name(shard);
    let txid = next_txid();
    let coordinator = name(open[0].0);
    let gid = |shard: usize| Gid {
        router: routing.config.router_id,
        txid: txid.clone(),
        coordinator: coordinator.clone(),
        shard: name(shard),
    };
    // The decision to come, in the coordinator's transaction (none in a read-only one, which
    // then commits plainly: there is nothing of it to keep atomic).
    let record = format!(
        "DO $$BEGIN IF current_setting('transaction_read_only') = 'off' THEN \
         INSERT INTO {DECISIONS} (txid) VALUES ({}); END IF; END$$",
        quote_literal(&txid)
    );
    if let Err(failed) = run(&mut open[0].1, &record).await {
        super::commit::finish(routing, open, false, "the transaction").await?;
        return Err(failed.into_error(&coordinator, "recording the commit decision"));
    }
    // The coordinator first: no other part is ever prepared without it.
    let first = gid(open[0].0);
    let mut outcomes = vec![prepare(&mut open[0].1, first).await];
    if outcomes[0].is_ok() {
        let others = open
            .iter_mut()
            .skip(1)
            .map(|(shard, conn)| prepare(conn, gid(*shard)));
        outcomes.extend(futures_util::future::join_all(others).await);
    }
    if let Some((i, why)) = outcomes
        .iter()
        .enumerate()
        .find_map(|(i, o)| o.as_ref().err().map(|why| (i, why.clone())))
    {
        // Nothing is decided: every part goes. (A part whose PREPARE failed is rolled back
        // already; one that was not asked is still an open transaction.)
        let err = SqlError::new(
            errors::TRANSACTION_ROLLBACK,
            format!(
                "the transaction was rolled back on every shard: PREPARE TRANSACTION failed on shard {}: {why}",
                name(open[i].0)
            ),
        );
        let mut not_asked = Vec::new();
        for (j, (shard, mut conn)) in open.into_iter().enumerate() {
            match outcomes.get(j) {
                Some(Ok(())) => {
                    let sql = format!("ROLLBACK PREPARED {}", quote_literal(&gid(shard).text()));
                    if let Err(e) = run(&mut conn, &sql).await {
                        tracing::warn!(shard = %name(shard), "ROLLBACK PREPARED failed; recovery will roll it back: {}", e.message);
                    }
                }
                Some(Err(_)) => {}
                None => not_asked.push((shard, conn)),
            }
        }
        super::commit::finish(routing, not_asked, false, "the transaction").await?;
        return Err(err);
    }
    if fault == Some(Fault::AfterPrepare) {
        tracing::error!("test fault: stopping after PREPARE TRANSACTION");
        std::process::abort();
    }
    let decision = format!("COMMIT PREPARED {}", quote_literal(&gid(open[0].0).text()));
    if let Err(failed) = run(&mut open[0].1, &decision).await {
        if failed.connection_lost {
            return Err(SqlError::new(
                errors::TRANSACTION_RESOLUTION_UNKNOWN,
                format!(
                    "the connection to shard {coordinator} broke while the transaction committed there; whether it committed is decided there, and recovery finishes the other shards the same way: {}",
                    failed.message
                ),
            ));
        }
        // A recovering router rolled the coordinator's part back first (it took longer than
        // recovery_grace_ms): that decided "abort".
        for (shard, conn) in open.iter_mut().skip(1) {
            let sql = format!("ROLLBACK PREPARED {}", quote_literal(&gid(*shard).text()));
            let _ = run(conn, &sql).await;
        }
        return Err(SqlError::new(
            errors::TRANSACTION_ROLLBACK,
            format!(
                "the transaction was rolled back on every shard: its commit on shard {coordinator} came after recovery had rolled it back ({})",
                failed.message
            ),
        ));
    }
    if fault == Some(Fault::AfterDecision) {
        tracing::error!("test fault: stopping after the commit decision");
        std::process::abort();
    }
    // Decided: the rest commit, now or by recovery.
    let rest = open.iter_mut().skip(1).map(|(shard, conn)| {
        let sql = format!("COMMIT PREPARED {}", quote_literal(&gid(*shard).text()));
        let shard = *shard;
        async move { (shard, run(conn, &sql).await) }
    });
    let mut all_committed = true;
    for (shard, result) in futures_util::future::join_all(rest).await {
        if let Err(e) = result {
            all_committed = false;
            tracing::warn!(shard = %name(shard), "COMMIT PREPARED failed after the commit decision; recovery will commit it: {}", e.message);
        }
    }
    if all_committed {
        // The decision is no longer needed; forgotten after the client has its answer.
        let forget = format!(
            "DELETE FROM {DECISIONS} WHERE txid = {}",
            quote_literal(&txid)
        );
        let (_, mut conn) = open.swap_remove(0);
        tokio::spawn(async move {
            if let Err(e) = run(&mut conn, &forget).await {
                tracing::debug!("could not delete a commit decision: {}", e.message);
            }
        });
    }
    // Back to their pools, which check a connection before handing it out again.
    drop(open);
    Ok(())
}

/// PREPARE TRANSACTION of one part; why it did not prepare (the part is then rolled back).
async fn prepare(conn: &mut BackendConn, gid: Gid) -> Result<(), String> {
    let sql = format!("PREPARE TRANSACTION {}", quote_literal(&gid.text()));
    match run(conn, &sql).await {
        Ok(tag) if tag == "PREPARE TRANSACTION" => Ok(()),
        // A transaction that had failed there answers ROLLBACK.
        Ok(_) => Err("its part there had failed".into()),
        Err(failed) => Err(failed.message),
    }
}

/// Why a statement of the protocol failed.
pub struct Failed {
    code: String,
    message: String,
    connection_lost: bool,
}

impl Failed {
    fn into_error(self, shard: &str, step: &str) -> SqlError {
        let mut err = SqlError::new(
            errors::TRANSACTION_ROLLBACK,
            format!(
                "the transaction was rolled back on every shard: {step} failed on shard {shard}: {}",
                self.message
            ),
        );
        if !self.connection_lost {
            err.code = std::borrow::Cow::Owned(self.code);
        }
        err
    }
}

/// Runs one simple query; its command tag, or why it failed.
async fn run(conn: &mut BackendConn, sql: &str) -> Result<String, Failed> {
    simple(conn, sql).await.map(|(tag, _)| tag)
}

/// The first column of each row of a simple query, as text.
async fn rows(conn: &mut BackendConn, sql: &str) -> Result<Vec<String>, Failed> {
    simple(conn, sql).await.map(|(_, rows)| rows)
}

/// One simple query: its command tag and the first column of its rows, or why it failed.
async fn simple(conn: &mut BackendConn, sql: &str) -> Result<(String, Vec<String>), Failed> {
    let answer = conn.simple_query(sql).await.map_err(|e| Failed {
        code: errors::CONNECTION_FAILURE.to_string(),
        message: e.to_string(),
        connection_lost: true,
    })?;
    match answer.error {
        Some((code, message)) => Err(Failed {
            code,
            message,
            connection_lost: false,
        }),
        None => Ok((answer.tag, answer.first_column)),
    }
}

/// Makes sure a shard can take part: it allows prepared transactions, and it has the decisions
/// table. `Err` with a sentence for the operator.
pub async fn prepare_shard(conn: &mut BackendConn, shard: &str) -> Result<(), String> {
    let allowed = rows(conn, "SHOW max_prepared_transactions")
        .await
        .map_err(|e| format!("shard {shard}: {}", e.message))?;
    if allowed.first().map(String::as_str).unwrap_or("0") == "0" {
        return Err(format!(
            "shard {shard} does not allow prepared transactions (max_prepared_transactions = 0), which [transactions] cross_shard = \"two_phase\" needs: set max_prepared_transactions (at least max_connections) on its server and restart it, or use cross_shard = \"multi\""
        ));
    }
    run(conn, SCHEMA_SQL)
        .await
        .map_err(|e| format!("shard {shard}: creating {DECISIONS}: {}", e.message))?;
    Ok(())
}

/// What one pass of [`recover`] did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Recovered {
    pub committed: usize,
    pub rolled_back: usize,
    /// Left for a later pass (a shard could not be asked).
    pub left: usize,
    /// How long until the youngest of shardgate's prepared transactions seen, still within the
    /// grace period, is past it: the next pass need not wait longer to resolve it (the rows it
    /// locks stay locked until then, which after a router's crash stalls every write to them).
    pub next_due: Option<Duration>,
}

/// Resolves every prepared transaction of shardgate's older than `grace` on every shard of
/// `routing`, as the module documentation says.
pub async fn recover(routing: &Routing, grace: Duration) -> Recovered {
    let mut done = Recovered::default();
    let shards = routing.map.shards().len();
    let mut all_asked = true;
    for shard in 0..shards {
        let mut conn = match routing.checkout_own(shard).await {
            Ok(conn) => conn,
            Err(e) => {
                all_asked = false;
                tracing::debug!(shard = %routing.shard_name(shard), "recovery cannot reach the shard: {}", e.message);
                continue;
            }
        };
        let sql = format!(
            "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() \
             AND gid LIKE 'sg:%' AND prepared < now() - interval '{} milliseconds'",
            grace.as_millis()
        );
        let gids = match rows(&mut conn, &sql).await {
            Ok(gids) => gids,
            Err(e) => {
                all_asked = false;
                tracing::warn!(shard = %routing.shard_name(shard), "recovery cannot list prepared transactions: {}", e.message);
                continue;
            }
        };
        if let Some(due) = due_in(&mut conn, grace).await {
            done.next_due = Some(done.next_due.map_or(due, |d| d.min(due)));
        }
        for text in gids {
            let Some(gid) = Gid::parse(&text) else {
                continue;
            };
            match decide(routing, &gid).await {
                Some(commit) => {
                    let sql = format!(
                        "{} PREPARED {}",
                        if commit { "COMMIT" } else { "ROLLBACK" },
                        quote_literal(&text)
                    );
                    match run(&mut conn, &sql).await {
                        Ok(_) => {
                            tracing::info!(shard = %routing.shard_name(shard), gid = %text, "recovery {} a prepared transaction left in doubt", if commit { "committed" } else { "rolled back" });
                            if commit {
                                done.committed += 1;
                            } else {
                                done.rolled_back += 1;
                            }
                        }
                        // Resolved meanwhile (by its router, or another recovering one).
                        Err(e) if e.code == "42704" => {}
                        Err(e) => {
                            done.left += 1;
                            tracing::warn!(gid = %text, "recovery could not resolve a prepared transaction: {}", e.message);
                        }
                    }
                }
                None => done.left += 1,
            }
        }
    }
    if all_asked && done.left == 0 {
        // No prepared transaction older than the grace period is left anywhere, so none can
        // need a decision older than that.
        forget_decisions(routing).await;
    }
    done
}

/// How long until the oldest of shardgate's prepared transactions on this shard that is still
/// within `grace` is past it; `None` when there is none (or the shard does not say).
async fn due_in(conn: &mut BackendConn, grace: Duration) -> Option<Duration> {
    let sql = format!(
        "SELECT ceil(extract(epoch FROM min(prepared) + interval '{0} milliseconds' - now()) * 1000)::bigint \
         FROM pg_prepared_xacts WHERE database = current_database() AND gid LIKE 'sg:%' \
         AND prepared >= now() - interval '{0} milliseconds'",
        grace.as_millis()
    );
    let ms: u64 = rows(conn, &sql).await.ok()?.first()?.parse().ok()?;
    Some(Duration::from_millis(ms))
}

/// Whether `gid`'s transaction committed (`Some(true)`), did not and never will
/// (`Some(false)`), or cannot be told now (`None`: its coordinator cannot be asked).
async fn decide(routing: &Routing, gid: &Gid) -> Option<bool> {
    let coordinator = routing
        .map
        .shards()
        .iter()
        .position(|s| s.range.to_string() == gid.coordinator);
    let Some(coordinator) = coordinator else {
        tracing::warn!(gid = %gid.text(), "recovery: the coordinator's shard {} is not in the shard map", gid.coordinator);
        return None;
    };
    let mut conn = routing.checkout_own(coordinator).await.ok()?;
    let recorded = format!(
        "SELECT 1 FROM {DECISIONS} WHERE txid = {}",
        quote_literal(&gid.txid)
    );
    if !rows(&mut conn, &recorded).await.ok()?.is_empty() {
        return Some(true);
    }
    // Not decided yet: decide "abort" by rolling the coordinator's part back, unless its
    // router commits it first; either way the row then says.
    let own = gid.of_coordinator().text();
    let rollback = format!("ROLLBACK PREPARED {}", quote_literal(&own));
    match run(&mut conn, &rollback).await {
        Ok(_) => tracing::info!(gid = %own, "recovery rolled back an undecided coordinator"),
        Err(e) if e.code == "42704" => {}
        Err(e) => {
            tracing::warn!(gid = %own, "recovery could not roll back an undecided coordinator: {}", e.message);
            return None;
        }
    }
    Some(!rows(&mut conn, &recorded).await.ok()?.is_empty())
}

/// Deletes decisions no prepared transaction needs any more (called when none older than the
/// grace period is left): those older than an hour.
async fn forget_decisions(routing: &Routing) {
    for shard in 0..routing.map.shards().len() {
        if let Ok(mut conn) = routing.checkout_own(shard).await {
            let sql =
                format!("DELETE FROM {DECISIONS} WHERE decided_at < now() - interval '1 hour'");
            let _ = run(&mut conn, &sql).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gids_carry_the_router_the_transaction_and_both_shards() {
        let gid = Gid {
            router: 7,
            txid: next_txid(),
            coordinator: "-40".into(),
            shard: "80-c0".into(),
        };
        let text = gid.text();
        assert!(text.starts_with("sg:7:"), "{text}");
        assert_eq!(Gid::parse(&text), Some(gid.clone()));
        assert_eq!(gid.of_coordinator().shard, "-40");
        assert_ne!(next_txid(), next_txid());
        for other in [
            "",
            "sg",
            "sg:x:1:-40:40-",
            "pgbench_1",
            "sg:1::a:b",
            "sg:1:2:3:4:5",
        ] {
            assert_eq!(Gid::parse(other), None, "{other:?}");
        }
    }
}
