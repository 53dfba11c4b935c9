//! Reads across all shards: the same request sent to every shard at once, the answers merged
//! in shard order as they stream in.
//!
//! Each shard runs on its own task with its own pooled connection and hands whole reply frames
//! to the session through a small bounded channel, so a big scan never sits in memory: a shard
//! whose rows are not yet wanted simply waits. The session forwards rows of shard 0, then shard
//! 1, ...; a lone `count()` is summed instead. The first error ends the read; connections whose
//! replies were not read to the end are discarded, never reused.

use std::sync::Arc;

use bytes::Buf;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

use super::settings::Settings;
use crate::errors;
use crate::protocol::frame::{begin_frame, end_frame, next_frame};
use crate::protocol::reply::SqlError;
use crate::shared::Shared;

/// Whole reply frames from one shard, or why that shard failed.
pub type Chunk = Result<Vec<u8>, SqlError>;

/// Sends `request` (whole frontend messages ending in Sync or a Query) to each of `shards`; the
/// receivers, in the same order, yield each shard's reply frames up to and including its
/// ReadyForQuery.
pub fn start(
    shared: &Arc<Shared>,
    shards: &[usize],
    request: Vec<u8>,
    settings: &Settings,
) -> Vec<mpsc::Receiver<Chunk>> {
    let request = Arc::new(request);
    shards
        .iter()
        .map(|&shard| {
            let (tx, rx) = mpsc::channel(8);
            let shared = shared.clone();
            let request = request.clone();
            let settings = settings.clone();
            tokio::spawn(async move {
                if let Err(e) = on_shard(&shared, shard, &request, &settings, &tx).await {
                    let _ = tx.send(Err(e)).await;
                }
            });
            rx
        })
        .collect()
}

async fn on_shard(
    shared: &Shared,
    shard: usize,
    request: &[u8],
    settings: &Settings,
    tx: &mpsc::Sender<Chunk>,
) -> Result<(), SqlError> {
    let name = shared.map.shards()[shard].range.to_string();
    let pool = shared.pools().for_shard(shard);
    let mut pooled = shared.checkout(shard).await?;
    let conn = &mut *pooled;
    let fp = settings.fingerprint();
    let mut out = Vec::with_capacity(request.len() + 64);
    let mut skip_ready = usize::from(settings.write_apply(conn.settings_fp, &mut out));
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
    if complete && result.is_ok() {
        conn.settings_fp = fp;
    } else {
        drop(deadpool::managed::Object::take(pooled));
    }
    result
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

/// The single value of a one-column DataRow body, as a count, in text or binary (int8) format.
pub fn count_in_row(body: &[u8], binary: bool) -> Option<i64> {
    if body.len() < 6 || i16::from_be_bytes([body[0], body[1]]) != 1 {
        return None;
    }
    let len = i32::from_be_bytes([body[2], body[3], body[4], body[5]]);
    let value = body.get(6..6 + usize::try_from(len).ok()?)?;
    if binary {
        return value.try_into().ok().map(i64::from_be_bytes);
    }
    std::str::from_utf8(value).ok()?.parse().ok()
}

/// A one-column DataRow holding `n`, text or binary.
pub fn count_row(out: &mut Vec<u8>, n: i64, binary: bool) {
    let at = begin_frame(out, b'D');
    out.extend_from_slice(&1i16.to_be_bytes());
    if binary {
        out.extend_from_slice(&8i32.to_be_bytes());
        out.extend_from_slice(&n.to_be_bytes());
    } else {
        let text = n.to_string();
        out.extend_from_slice(&(text.len() as i32).to_be_bytes());
        out.extend_from_slice(text.as_bytes());
    }
    end_frame(out, at);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_tags_and_counts() {
        assert_eq!(rows_in_tag(b"SELECT 42\0"), 42);
        assert_eq!(rows_in_tag(b"SELECT\0"), 0);
        let mut row = Vec::new();
        count_row(&mut row, 1234, false);
        assert_eq!(count_in_row(&row[5..], false), Some(1234));
        row.clear();
        count_row(&mut row, 0x3030_3030_3030_3030, true);
        assert_eq!(count_in_row(&row[5..], true), Some(0x3030_3030_3030_3030));
        assert_eq!(count_in_row(b"\0\x02", false), None);
    }
}
