//! Reads on several shards at once: the same request sent to each shard, each on its own task
//! with its own pooled connection, handing whole reply frames to the session through a small
//! bounded channel. A big scan never sits in memory: a shard whose rows are not yet wanted
//! simply waits. Connections whose replies were not read to the end are discarded, never
//! reused.

use std::sync::Arc;

use bytes::BytesMut;
use tokio::sync::mpsc;

use crate::errors;
use crate::protocol::reply::SqlError;
use crate::server::Routing;
use crate::session::Settings;

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
    let mut pooled = routing.checkout(shard).await?;
    let mut head = BytesMut::new();
    let settings_sent = settings
        .write_apply(pooled.settings_fp, &mut head)
        .map_err(errors::internal)?;
    let result = relay(&mut pooled, &head, request, usize::from(settings_sent), tx).await;
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
/// the replies of the `skip` settings queries in `head` (those are the router's business).
async fn relay(
    conn: &mut crate::backend::BackendConn,
    head: &[u8],
    request: &[u8],
    skip: usize,
    tx: &mpsc::Sender<Chunk>,
) -> Result<(), Stopped> {
    let mut replies = conn
        .request_parts(head, request, skip + 1)
        .await
        .map_err(Stopped::Lost)?;
    let mut skipped = 0;
    let mut chunk = Vec::new();
    while let Some(frame) = replies.next().await.map_err(Stopped::Lost)? {
        if skipped < skip {
            skipped += usize::from(frame[0] == b'Z');
            continue;
        }
        chunk.extend_from_slice(frame);
        let full = frame[0] == b'Z' || chunk.len() >= CHUNK;
        if full && tx.send(Ok(std::mem::take(&mut chunk))).await.is_err() {
            return Err(Stopped::Abandoned);
        }
    }
    Ok(())
}
