//! COPY FROM STDIN into a reference table: every shard takes all of the client's rows, each in
//! a transaction of its own, and they commit together (two-phase where the config says so)
//! only when every shard took them; otherwise none does. The client's CopyData goes to every
//! shard as it came: each shard's COPY reads its own format and HEADER, so the router reads no
//! row, and a binary COPY works as well as text.

use super::broadcast::Outcome;
use super::client::Client;
use super::commit;
use super::copy_in::{copy_fail_message, next_frame, unexpected, ClientFailed, CopyTarget};
use crate::backend::pool::PooledConn;
use crate::backend::settings::Settings;
use crate::errors;
use crate::protocol::backend::rows_in_tag;
use crate::protocol::frame::put_frame;
use crate::protocol::reply::{self, SqlError};
use crate::routing::Routing;

/// Runs the client's COPY FROM STDIN statement `sql` on every shard, and writes the client's
/// answer without ReadyForQuery.
pub async fn run<C: Client>(
    routing: &Routing,
    settings: &Settings,
    client: &mut C,
    sql: &str,
) -> Result<(), ClientFailed> {
    let mut targets: Vec<(usize, CopyTarget)> = Vec::new();
    // Each shard takes every row as it comes, so two such COPYs with the same keys may wait
    // for each other on two shards, which no Postgres sees: the lock timeout of transactions
    // across shards breaks that.
    let mut begin = commit::BEGIN_PART.to_string();
    if let Some(timeout) = routing.config.transactions.lock_timeout {
        begin.push_str(&format!(
            "; SET LOCAL lock_timeout = {}",
            timeout.as_millis()
        ));
    }
    // In shard order, as every write on several shards takes its locks.
    for shard in 0..routing.map.shards().len() {
        let opened = CopyTarget::open(routing, shard, sql, settings, None, Some(&begin)).await;
        let refused = match opened {
            Ok(t) if t.started() => {
                targets.push((shard, t));
                continue;
            }
            // Its COPY did not start (no such column, no permission): Postgres's error. Its
            // transaction is rolled back with the others'.
            Ok(t) => {
                let mut frame = t.refusal();
                if frame.is_empty() {
                    frame = error_frame(&errors::internal("a COPY that did not start"));
                }
                targets.push((shard, t));
                frame
            }
            Err(e) => error_frame(&e),
        };
        let _ = end(routing, targets, Some("refused by another shard")).await;
        client.out().extend_from_slice(&refused);
        return Ok(());
    }
    let Some((_, first)) = targets.first() else {
        reply::command_complete(client.out(), "COPY 0");
        return Ok(());
    };
    // The first shard's CopyInResponse is the client's: the table's own column count.
    put_frame(client.out(), b'G', &first.response);
    if let Err(e) = client.flush().await {
        abandon(targets);
        return Err(ClientFailed::Io(e));
    }
    let client_failed = match tee(client, &mut targets).await {
        Ok(failed) => failed,
        Err(why) => {
            // Nothing is committed anywhere: each shard's connection goes, and its COPY.
            abandon(targets);
            return Err(why);
        }
    };
    let answer = end(routing, targets, client_failed.as_deref()).await;
    match (client_failed, answer) {
        (Some(msg), _) => SqlError::new(
            errors::QUERY_CANCELED,
            format!("COPY from stdin failed: {msg}"),
        )
        .write(client.out()),
        (None, Ok(rows)) => reply::command_complete(client.out(), &format!("COPY {rows}")),
        (None, Err(frame)) => client.out().extend_from_slice(&frame),
    }
    Ok(())
}

/// Sends the client's CopyData to every shard, to its CopyDone (`Ok(None)`) or CopyFail
/// (`Ok(Some(its message))`).
async fn tee<C: Client>(
    client: &mut C,
    targets: &mut [(usize, CopyTarget)],
) -> Result<Option<String>, ClientFailed> {
    loop {
        let frame = next_frame(client).await?;
        match frame[0] {
            b'd' => {
                for (_, t) in targets.iter_mut() {
                    t.push(&frame[5..]).await;
                }
            }
            b'c' => return Ok(None),
            b'f' => return Ok(Some(copy_fail_message(&frame))),
            b'H' | b'S' => {}
            other => return Err(unexpected(other)),
        }
    }
}

/// Ends every shard's COPY (failed on purpose with `fail`), then commits them all when every
/// one took its rows, or rolls them all back: the row count of one shard, or the error frame
/// for the client (the first shard's that failed: nothing was applied anywhere).
async fn end(
    routing: &Routing,
    targets: Vec<(usize, CopyTarget)>,
    fail: Option<&str>,
) -> Result<u64, Vec<u8>> {
    let mut open: Vec<(usize, PooledConn)> = Vec::new();
    let (mut rows, mut failed) = (None, None);
    for (shard, t) in targets {
        let (outcome, conn) = t.finish(fail).await;
        if let Some(conn) = conn {
            open.push((shard, conn));
        }
        match outcome {
            Outcome::Done(tags) => {
                rows.get_or_insert_with(|| rows_in_tag(tags.get(5..).unwrap_or_default()));
            }
            Outcome::Failed { frame, .. } => {
                failed.get_or_insert(frame);
            }
            Outcome::Unavailable(e) => {
                failed.get_or_insert_with(|| error_frame(&e));
            }
        }
    }
    if fail.is_some() || failed.is_some() {
        // (A rollback's own failure leaves nothing applied either.)
        let _ = commit::finish(routing, open, false, "the COPY").await;
        return Err(failed.unwrap_or_default());
    }
    match commit::commit_all(routing, open, "the COPY").await {
        Ok(()) => Ok(rows.unwrap_or(0)),
        Err(e) => Err(error_frame(&e)),
    }
}

/// Drops every shard's connection mid-COPY: Postgres rolls each back.
fn abandon(targets: Vec<(usize, CopyTarget)>) {
    for (_, mut t) in targets {
        t.abandon();
    }
}

fn error_frame(e: &SqlError) -> Vec<u8> {
    let mut out = Vec::new();
    e.write(&mut out);
    out
}
