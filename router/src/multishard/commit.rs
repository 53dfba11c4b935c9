//! The one way a write on several shards runs: each shard's part in a transaction of its own,
//! begun one shard after another in shard order, and committed only when every part succeeded
//! (rolled back everywhere otherwise).
//!
//! Why in shard order: two such writes then take their row locks, and their pooled
//! connections, in the same order, so they cannot wait for each other in a cycle across shards,
//! which no single Postgres would detect. Why `SET CONSTRAINTS ALL IMMEDIATE`: deferred checks
//! then fail with the statement, not at a COMMIT that other shards may already have passed.
//! Only a failure between the first and the last COMMIT (a shard going away, a serialization
//! failure) can leave part of a write applied; the error then names the shards on each side.
//! With `cross_shard = "two_phase"` the parts commit through [`super::two_phase`] instead,
//! atomically.

use bytes::BytesMut;

use crate::backend::conn::Replies;
use crate::backend::pool::{discard, PooledConn};
use crate::backend::settings::Settings;
use crate::errors;
use crate::protocol::reply::{SqlError, TxStatus};
use crate::protocol::request;
use crate::routing::Routing;

/// How each part begins.
pub const BEGIN_PART: &str = "BEGIN; SET CONSTRAINTS ALL IMMEDIATE";

/// The parts begun so far, each an open transaction on its shard.
pub struct Parts<'s> {
    routing: &'s Routing,
    settings: &'s Settings,
    /// What the write is, for messages ("the write", "the INSERT").
    what: &'static str,
    open: Vec<(usize, PooledConn)>,
    /// How many ReadyForQuery of the last part's settings and BEGIN come before its request's.
    skip: usize,
}

/// One part's replies to its request (after the settings' and BEGIN's, which are the router's
/// business unless they fail).
pub struct Part<'p> {
    replies: Replies<'p>,
    skip: usize,
    /// An error of the settings or of BEGIN, reported as the request's: it did not run (or
    /// ran in an aborted transaction), and its own replies are dropped.
    early: Option<Vec<u8>>,
    reported: bool,
}

impl Part<'_> {
    /// The next reply frame of the request, up to its ReadyForQuery; an I/O error means the
    /// connection is lost.
    pub async fn next(&mut self) -> std::io::Result<Option<&[u8]>> {
        if self.skip > 0 {
            let early = &mut self.early;
            let skipped = self
                .replies
                .skip_prelude(self.skip, |error| {
                    early.get_or_insert_with(|| error.to_vec());
                })
                .await?;
            self.skip = 0;
            if !skipped {
                return Ok(None);
            }
        }
        if self.early.is_none() {
            return self.replies.next().await;
        }
        if self.reported {
            return Ok(None);
        }
        while self.replies.next().await?.is_some() {}
        self.reported = true;
        Ok(self.early.as_deref())
    }
}

impl<'s> Parts<'s> {
    pub fn new(routing: &'s Routing, settings: &'s Settings, what: &'static str) -> Parts<'s> {
        Parts {
            routing,
            settings,
            what,
            open: Vec::new(),
            skip: 0,
        }
    }

    /// Begins the next part on `shard` (after every part begun before, whose replies the caller
    /// has read) and sends `request` in its transaction; [`Parts::replies`] then reads them. A
    /// shard that has a part already runs `request` in that part's transaction: one transaction
    /// per shard, as two-phase commit names them.
    pub async fn begin(&mut self, shard: usize, request: &[u8]) -> Result<(), SqlError> {
        if let Some(at) = self.open.iter().position(|(s, _)| *s == shard) {
            let (_, mut conn) = self.open.remove(at);
            if let Err(e) = conn.stream.send_parts(&[], request).await {
                discard(conn);
                return Err(self.lost(shard, &e));
            }
            self.skip = 0;
            self.open.push((shard, conn));
            return Ok(());
        }
        let mut conn = self.routing.checkout_for(shard, self.settings).await?;
        let mut head = BytesMut::new();
        let settings_sent = self
            .settings
            .write_apply(conn.settings_fp, &mut head)
            .map_err(errors::internal)?;
        request::query(&mut head, BEGIN_PART).map_err(errors::internal)?;
        if settings_sent > 0 {
            conn.settings_fp = self.settings.fingerprint();
        }
        if let Err(e) = conn.stream.send_parts(&head, request).await {
            discard(conn);
            return Err(self.lost(shard, &e));
        }
        self.skip = 1 + settings_sent;
        self.open.push((shard, conn));
        Ok(())
    }

    /// The replies of the part begun last (`None` before the first).
    pub fn replies(&mut self) -> Option<Part<'_>> {
        let skip = self.skip;
        let (_, conn) = self.open.last_mut()?;
        Some(Part {
            replies: conn.replies(skip + 1),
            skip,
            early: None,
            reported: false,
        })
    }

    /// The connection of the part begun last broke: it is discarded (Postgres rolls it back).
    pub fn drop_last(&mut self) {
        if let Some((_, conn)) = self.open.pop() {
            discard(conn);
        }
    }

    /// The error for a part whose connection broke.
    pub fn lost(&self, shard: usize, e: &std::io::Error) -> SqlError {
        errors::shard_lost(
            &self.routing.map.shards()[shard].range.to_string(),
            &self.routing.pools().for_shard(shard).endpoint.name(),
            &e.to_string(),
        )
    }

    /// Rolls every part back.
    pub async fn rollback(self) {
        end_all(self.open, false).await;
    }

    /// Commits every part; the error names the shards that committed and those that did not.
    /// With `cross_shard = "two_phase"`, parts on several shards commit atomically with
    /// two-phase commit, as a client's transaction across shards does.
    pub async fn commit(self) -> Result<(), SqlError> {
        commit_all(self.routing, self.open, self.what).await
    }
}

/// Commits `open` (each connection at rest inside its part, in shard order): with two-phase
/// commit when the config says so and there are several, else one COMMIT each; the error
/// names the shards that committed and those that did not.
pub async fn commit_all(
    routing: &Routing,
    open: Vec<(usize, PooledConn)>,
    what: &'static str,
) -> Result<(), SqlError> {
    let transactions = &routing.config.transactions;
    if open.len() > 1 && transactions.cross_shard == crate::config::CrossShard::TwoPhase {
        return super::two_phase::commit(routing, open, transactions.test_fault).await;
    }
    let shards: Vec<usize> = open.iter().map(|(s, _)| *s).collect();
    let results = end_all(open, true).await;
    outcome(routing, what, &shards, results)
}

/// Ends a transaction that ran on several shards: `open` holds its connections, each at rest
/// inside it. A ROLLBACK rolls every one back. A COMMIT first makes every deferred constraint
/// check now (`SET CONSTRAINTS ALL IMMEDIATE` on each, so that a violation rolls everything
/// back instead of failing one shard's COMMIT after others passed theirs), then commits them
/// all; the error names the shards that committed and those that did not. The connections go
/// back to their pools (or are discarded when broken).
pub async fn finish(
    routing: &Routing,
    mut open: Vec<(usize, PooledConn)>,
    commit: bool,
    what: &'static str,
) -> Result<(), SqlError> {
    if commit && open.len() > 1 {
        let checks = open
            .iter_mut()
            .map(|(_, conn)| run(conn, "SET CONSTRAINTS ALL IMMEDIATE"));
        let checked = futures_util::future::join_all(checks).await;
        if let Some((i, (code, why))) = checked
            .into_iter()
            .enumerate()
            .find_map(|(i, r)| r.err().map(|e| (i, e)))
        {
            let shard = routing.map.shards()[open[i].0].range.to_string();
            end_all(open, false).await;
            let mut err = SqlError::new(
                errors::TRANSACTION_ROLLBACK,
                format!("{what} was rolled back on every shard: on shard {shard}, {why}"),
            );
            // The client sees Postgres's own SQLSTATE (23505, 23503, ...), as for the same
            // check at a COMMIT on one Postgres.
            err.code = std::borrow::Cow::Owned(code);
            return Err(err);
        }
    }
    let shards: Vec<usize> = open.iter().map(|(s, _)| *s).collect();
    let results = end_all(open, commit).await;
    if !commit {
        return Ok(());
    }
    outcome(routing, what, &shards, results)
}

/// The error, if any, of COMMITs on `shards` (`results` in the same order).
fn outcome(
    routing: &Routing,
    what: &str,
    shards: &[usize],
    results: Vec<Result<(), String>>,
) -> Result<(), SqlError> {
    let mut first = String::new();
    let mut failed = Vec::new();
    for (i, r) in results.into_iter().enumerate() {
        if let Err(why) = r {
            if first.is_empty() {
                first = why;
            }
            failed.push(i);
        }
    }
    if failed.is_empty() {
        return Ok(());
    }
    let names = |pick: &dyn Fn(usize) -> bool| -> String {
        (0..shards.len())
            .filter(|&i| pick(i))
            .map(|i| routing.map.shards()[shards[i]].range.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    if failed.len() == shards.len() {
        return Err(SqlError::new(
            errors::TRANSACTION_ROLLBACK,
            format!(
                "{what} was not committed: its COMMIT failed on every shard ({}): {first}",
                names(&|_| true)
            ),
        ));
    }
    Err(SqlError::new(
        errors::CONNECTION_FAILURE,
        format!(
            "{what} committed on shards {} but its COMMIT failed on {}: {first}",
            names(&|i| !failed.contains(&i)),
            names(&|i| failed.contains(&i)),
        ),
    )
    .with_hint(
        "the failed shards' part may be missing: check those rows by key and run it there again",
    ))
}

/// Runs one statement on a connection at rest inside a transaction; `Err` with Postgres's
/// SQLSTATE and message when it failed (the transaction is then aborted there).
async fn run(conn: &mut PooledConn, sql: &str) -> Result<(), (String, String)> {
    let answer = conn
        .simple_query(sql)
        .await
        .map_err(|e| (errors::CONNECTION_FAILURE.to_string(), e.to_string()))?;
    answer.error.map_or(Ok(()), Err)
}

/// Ends every part at once; the outcomes are in the parts' order.
async fn end_all(open: Vec<(usize, PooledConn)>, commit: bool) -> Vec<Result<(), String>> {
    let mut tasks = tokio::task::JoinSet::new();
    let n = open.len();
    for (i, (_, conn)) in open.into_iter().enumerate() {
        tasks.spawn(async move { (i, end(conn, commit).await) });
    }
    let mut results: Vec<Result<(), String>> = (0..n)
        .map(|_| Err("the COMMIT task did not finish".into()))
        .collect();
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok((i, r)) => results[i] = r,
            Err(e) => tracing::error!("a COMMIT task failed: {e}"),
        }
    }
    results
}

/// COMMIT or ROLLBACK on a connection left in a transaction; `Err` with Postgres's message
/// (or the connection's failure) if it did not end as asked. A broken connection is discarded.
pub async fn end(mut conn: PooledConn, commit: bool) -> Result<(), String> {
    let answer = match conn
        .simple_query(if commit { "COMMIT" } else { "ROLLBACK" })
        .await
    {
        Ok(answer) => answer,
        Err(e) => {
            discard(conn);
            return Err(e.to_string());
        }
    };
    match answer.error {
        Some((_, message)) => Err(message),
        // A COMMIT of an aborted transaction answers ROLLBACK without an error.
        None if answer.status != Some(TxStatus::Idle) => {
            discard(conn);
            Err("the connection stayed in a transaction".into())
        }
        None => Ok(()),
    }
}
