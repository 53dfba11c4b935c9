//! Reads across all shards: the same request sent to every shard at once, the answers merged
//! in shard order as they stream in, or by the merge engine ([`crate::merge`]).
//!
//! Each shard runs on its own task with its own pooled connection and hands whole reply frames
//! to the session through a small bounded channel, so a big scan never sits in memory: a shard
//! whose rows are not yet wanted simply waits. The session forwards rows of shard 0, then shard
//! 1, ..., or hands them to the merge engine. The first error ends the read; connections whose
//! replies were not read to the end are discarded, never reused.
//!
//! Writes on several shards (UPDATE/DELETE by a key list, or without a key when the client opted
//! in) take the same path, each shard's part inside a transaction that the session commits on
//! every shard only once all of them answered without an error, and rolls back otherwise.

use std::sync::Arc;

use bytes::Buf;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot, watch};

use super::settings::Settings;
use crate::errors;
use crate::protocol::frame::{next_frame, put_query};
use crate::protocol::reply::SqlError;
use crate::shared::Shared;

/// Whole reply frames from one shard, or why that shard failed.
pub type Chunk = Result<Vec<u8>, SqlError>;

/// Sends `request` (whole frontend messages ending in Sync or a Query) to each of `shards`; the
/// receivers, in the same order, yield each shard's reply frames up to and including its
/// ReadyForQuery.
///
/// With `commit` (a write), each shard runs the request inside a transaction that stays open
/// after its reply; it ends when `commit` says: COMMIT on `Some(true)`, ROLLBACK on
/// `Some(false)` or when the sender is dropped. After a COMMIT each receiver yields one more
/// item: an empty chunk when it committed, the error when it did not. The shards of a write
/// run one after another in the order given (the caller gives shard order): two writes that
/// lock rows on the same shards then take those locks, and the pooled connections, in the
/// same order, so they cannot wait for each other in a cycle across shards, which no single
/// Postgres could detect.
pub fn start(
    shared: &Arc<Shared>,
    shards: &[usize],
    request: Vec<u8>,
    settings: &Settings,
    commit: Option<&watch::Sender<Option<bool>>>,
) -> Vec<mpsc::Receiver<Chunk>> {
    let request = Arc::new(request);
    let mut previous: Option<oneshot::Receiver<()>> = None;
    shards
        .iter()
        .map(|&shard| {
            let (tx, rx) = mpsc::channel(8);
            let shared = shared.clone();
            let request = request.clone();
            let settings = settings.clone();
            let commit = commit.map(|c| c.subscribe());
            let order = commit.is_some().then(|| {
                let (done, next) = oneshot::channel();
                Turn {
                    after: previous.replace(next),
                    done,
                }
            });
            tokio::spawn(async move {
                let outcome = on_shard(&shared, shard, &request, &settings, &tx, commit, order);
                if let Err(e) = outcome.await {
                    let _ = tx.send(Err(e)).await;
                }
            });
            rx
        })
        .collect()
}

/// A shard's place in a write's order: wait for the shard before it, then tell the next.
struct Turn {
    after: Option<oneshot::Receiver<()>>,
    done: oneshot::Sender<()>,
}

async fn on_shard(
    shared: &Shared,
    shard: usize,
    request: &[u8],
    settings: &Settings,
    tx: &mpsc::Sender<Chunk>,
    commit: Option<watch::Receiver<Option<bool>>>,
    turn: Option<Turn>,
) -> Result<(), SqlError> {
    let (after, done) = match turn {
        Some(t) => (t.after, Some(t.done)),
        None => (None, None),
    };
    if let Some(after) = after {
        if after.await.is_err() {
            // The shard before failed: the session has stopped, and this part never starts.
            return Ok(());
        }
    }
    let name = shared.map.shards()[shard].range.to_string();
    let pool = shared.pools().for_shard(shard);
    let mut pooled = shared.checkout(shard).await?;
    let conn = &mut *pooled;
    let fp = settings.fingerprint();
    let mut out = Vec::with_capacity(request.len() + 64);
    let mut skip_ready = usize::from(settings.write_apply(conn.settings_fp, &mut out));
    if commit.is_some() {
        put_query(&mut out, super::split_insert::BEGIN_PART);
        skip_ready += 1;
    }
    out.extend_from_slice(request);
    let lost = |e: std::io::Error| errors::shard_lost(&name, &pool.endpoint.name(), &e.to_string());
    let mut complete = false;
    let result: Result<(), SqlError> = async {
        conn.stream.write_all(&out).await.map_err(lost)?;
        loop {
            let mut chunk = Vec::new();
            while let Some(h) =
                next_frame(&conn.rbuf).map_err(|e| lost(std::io::Error::other(e)))?
            {
                if skip_ready > 0 {
                    // The settings query's replies are the router's business.
                    if conn.rbuf[0] == b'Z' {
                        skip_ready -= 1;
                    }
                } else {
                    chunk.extend_from_slice(&conn.rbuf[..h.total]);
                    complete = conn.rbuf[0] == b'Z';
                }
                conn.rbuf.advance(h.total);
                if complete || chunk.len() >= 64 * 1024 {
                    break;
                }
            }
            if !chunk.is_empty() && tx.send(Ok(chunk)).await.is_err() {
                // The session stopped reading (an error elsewhere, or the client left).
                return Err(SqlError::new(
                    errors::CONNECTION_FAILURE,
                    "the read was abandoned",
                ));
            }
            if complete {
                return Ok(());
            }
            // More bytes are needed unless a whole frame is already buffered.
            let whole_frame = matches!(next_frame(&conn.rbuf), Ok(Some(_)));
            if !whole_frame && conn.stream.read_buf(&mut conn.rbuf).await.map_err(lost)? == 0 {
                return Err(lost(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "the server closed the connection",
                )));
            }
        }
    }
    .await;
    if !(complete && result.is_ok()) {
        drop(deadpool::managed::Object::take(pooled));
        return result;
    }
    conn.settings_fp = fp;
    if let Some(done) = done {
        let _ = done.send(());
    }
    let Some(mut commit) = commit else {
        return result;
    };
    // The session's verdict; a dropped sender (an error elsewhere, the client gone) is a no.
    let verdict = matches!(
        commit.wait_for(|d| d.is_some()).await.as_deref(),
        Ok(Some(true))
    );
    match super::split_insert::end(pooled, verdict).await {
        Err(why) if verdict => Err(SqlError::new(errors::CONNECTION_FAILURE, why)),
        Ok(()) if verdict => {
            let _ = tx.send(Ok(Vec::new())).await;
            Ok(())
        }
        _ => Ok(()),
    }
}

/// The number in a `SELECT n` (or any `TAG n`) CommandComplete body.
pub fn rows_in_tag(body: &[u8]) -> u64 {
    let text = body.strip_suffix(b"\0").unwrap_or(body);
    text.rsplit(|&b| b == b' ')
        .next()
        .and_then(|n| std::str::from_utf8(n).ok())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_tags() {
        assert_eq!(rows_in_tag(b"SELECT 42\0"), 42);
        assert_eq!(rows_in_tag(b"SELECT\0"), 0);
    }
}
