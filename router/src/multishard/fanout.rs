//! Reads on several shards at once: the same request sent to each shard, each on its own task
//! with its own pooled connection, handing whole reply frames to the session through a small
//! bounded channel. A big scan never sits in memory: a shard whose rows are not yet wanted
//! simply waits. Connections whose replies were not read to the end are discarded, never
//! reused.
//!
//! Inside a transaction that spans shards ([`start_in_transaction`]) each shard's part runs on
//! the transaction's own connection for that shard (or one that begins the transaction there),
//! and the task gives the connection back when its reply is read to the end, which it then is
//! even when the session stops reading early (a LIMIT, an error elsewhere).

use std::sync::Arc;

use bytes::BytesMut;
use tokio::sync::mpsc;

use crate::backend::pool::PooledConn;
use crate::backend::settings::Settings;
use crate::errors;
use crate::protocol::reply::SqlError;
use crate::protocol::request;
use crate::routing::Routing;

/// Whole reply frames from one shard, or why that shard failed.
pub type Chunk = Result<Vec<u8>, SqlError>;

/// Frames are handed over in chunks of about this size.
const CHUNK: usize = 64 * 1024;

/// Sends `request` (whole frontend messages ending in Sync, or a Query) to each of `shards`;
/// the receivers, in the same order, yield each shard's reply frames up to and including its
/// ReadyForQuery.
pub fn start(
    routing: &Arc<Routing>,
    shards: &[usize],
    request: Vec<u8>,
    settings: &Settings,
) -> Vec<mpsc::Receiver<Chunk>> {
    let request = Arc::new(request);
    shards
        .iter()
        .map(|&shard| {
            let (tx, rx) = mpsc::channel(8);
            let routing = routing.clone();
            let request = request.clone();
            let settings = settings.clone();
            tokio::spawn(async move {
                if let Err(e) = on_shard(&routing, shard, &request, &settings, &tx).await {
                    let _ = tx.send(Err(e)).await;
                }
            });
            rx
        })
        .collect()
}

async fn on_shard(
    routing: &Routing,
    shard: usize,
    request: &[u8],
    settings: &Settings,
    tx: &mpsc::Sender<Chunk>,
) -> Result<(), SqlError> {
    let mut pooled = routing.checkout_for(shard, settings).await?;
    let mut head = BytesMut::new();
    let settings_sent = settings
        .write_apply(pooled.settings_fp, &mut head)
        .map_err(errors::internal)?;
    let result = relay(&mut pooled, &head, request, settings_sent, tx, false).await;
    match result {
        Ok(()) => {
            pooled.settings_fp = settings.fingerprint();
            Ok(())
        }
        Err(e) => {
            crate::backend::pool::discard(pooled);
            Err(e.into_sql(routing, shard))
        }
    }
}

/// One shard's part of a statement inside the client's transaction.
pub struct Member {
    pub shard: usize,
    /// The transaction's connection to the shard; `None`: the shard joins the transaction now,
    /// on a connection checked out and given the client's settings.
    pub conn: Option<PooledConn>,
    /// What the router runs there first, in the same write (the `BEGIN` of a joining shard,
    /// `SET LOCAL lock_timeout`); empty for nothing. Its errors are the statement's.
    pub prelude: String,
    /// The statement's messages for this shard (a Query, or extended messages ending in Sync).
    pub request: Arc<Vec<u8>>,
}

/// What a task of [`start_in_transaction`] gives back: the shard and its connection, at rest
/// inside the transaction, or `None` when it broke (the receiver had the error).
pub type Returned = (usize, Option<PooledConn>);

/// Like [`start`], on the connections of the client's transaction (see the module's
/// documentation); the handles give the connections back, in the same order. With `ordered`
/// (writes) each shard's part starts only when the one before it has answered, so that two
/// writes on the same shards take their row locks in the same (shard) order and cannot wait for
/// each other in a cycle across shards; reads run on every shard at once.
pub fn start_in_transaction(
    routing: &Arc<Routing>,
    members: Vec<Member>,
    settings: &Settings,
    ordered: bool,
) -> (
    Vec<mpsc::Receiver<Chunk>>,
    Vec<tokio::task::JoinHandle<Returned>>,
) {
    let mut previous: Option<tokio::sync::oneshot::Receiver<()>> = None;
    members
        .into_iter()
        .map(|member| {
            let (tx, rx) = mpsc::channel(8);
            let routing = routing.clone();
            let settings = settings.clone();
            let after = if ordered { previous.take() } else { None };
            let (done, next) = tokio::sync::oneshot::channel();
            if ordered {
                previous = Some(next);
            }
            let task = tokio::spawn(async move {
                if let Some(after) = after {
                    // Whatever became of the part before (an error ends the statement anyway).
                    let _ = after.await;
                }
                let shard = member.shard;
                let returned = match in_transaction(&routing, member, &settings, &tx).await {
                    Ok(conn) => (shard, Some(conn)),
                    Err(e) => {
                        let _ = tx.send(Err(e)).await;
                        (shard, None)
                    }
                };
                let _ = done.send(());
                returned
            });
            (rx, task)
        })
        .unzip()
}

async fn in_transaction(
    routing: &Routing,
    member: Member,
    settings: &Settings,
    tx: &mpsc::Sender<Chunk>,
) -> Result<PooledConn, SqlError> {
    let mut conn = match member.conn {
        Some(conn) => conn,
        None => routing.checkout_for(member.shard, settings).await?,
    };
    let mut head = BytesMut::new();
    let written = settings
        .write_apply(conn.settings_fp, &mut head)
        .and_then(|sent| {
            if member.prelude.is_empty() {
                return Ok(sent);
            }
            request::query(&mut head, &member.prelude).map(|()| sent + 1)
        });
    let skip = match written {
        Ok(skip) => skip,
        Err(e) => {
            // Inside the transaction: never back to the pool.
            crate::backend::pool::discard(conn);
            return Err(errors::internal(e));
        }
    };
    match relay(&mut conn, &head, &member.request, skip, tx, true).await {
        Ok(()) => {
            conn.settings_fp = settings.fingerprint();
            Ok(conn)
        }
        Err(e) => {
            crate::backend::pool::discard(conn);
            Err(e.into_sql(routing, member.shard))
        }
    }
}

/// Why one shard's read stopped.
enum Stopped {
    /// The session stopped reading (an error elsewhere, or the client left).
    Abandoned,
    Lost(std::io::Error),
}

impl Stopped {
    fn into_sql(self, routing: &Routing, shard: usize) -> SqlError {
        match self {
            Stopped::Abandoned => {
                SqlError::new(errors::CONNECTION_FAILURE, "the read was abandoned")
            }
            Stopped::Lost(e) => errors::shard_lost(
                &routing.map.shards()[shard].range.to_string(),
                &routing.pools().for_shard(shard).endpoint.name(),
                &e.to_string(),
            ),
        }
    }
}

/// Writes `head` and `request` and hands the request's reply frames to the session, skipping
/// the replies of the `skip` queries in `head` (those are the router's business, but for their
/// errors). With `drain`, replies the session no longer wants are read to the end anyway, so
/// that the connection stays usable.
async fn relay(
    conn: &mut crate::backend::BackendConn,
    head: &[u8],
    request: &[u8],
    skip: usize,
    tx: &mpsc::Sender<Chunk>,
    drain: bool,
) -> Result<(), Stopped> {
    let mut replies = conn
        .request_parts(head, request, skip + 1)
        .await
        .map_err(Stopped::Lost)?;
    let mut chunk = Vec::new();
    replies
        .skip_prelude(skip, |error| chunk.extend_from_slice(error))
        .await
        .map_err(Stopped::Lost)?;
    while let Some(frame) = replies.next().await.map_err(Stopped::Lost)? {
        chunk.extend_from_slice(frame);
        let full = frame[0] == b'Z' || chunk.len() >= CHUNK;
        if full && tx.send(Ok(std::mem::take(&mut chunk))).await.is_err() {
            if !drain {
                return Err(Stopped::Abandoned);
            }
            while replies.next().await.map_err(Stopped::Lost)?.is_some() {}
            return Ok(());
        }
    }
    Ok(())
}
