//! Reads across all shards: the same request sent to every shard at once, the answers merged
//! in shard order as they stream in.
//!
//! Each shard runs on its own task with its own pooled connection and hands whole reply frames
//! to the session through a small bounded channel, so a big scan never sits in memory: a shard
//! whose rows are not yet wanted simply waits. The session forwards rows of shard 0, then shard
//! 1, ...; a lone `count()` is summed instead. The first error ends the read; connections whose
//! replies were not read to the end are discarded, never reused.
//!
//! Writes on several shards (UPDATE/DELETE by a key list, or without a key when the client opted
//! in) take the same path, each shard's part inside a transaction that the session commits on
//! every shard only once all of them answered without an error, and rolls back otherwise.

use std::sync::Arc;

use bytes::Buf;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, watch};

use super::settings::Settings;
use crate::errors;
use crate::planner::{AggOp, Aggregates};
use crate::protocol::frame::{begin_frame, end_frame, next_frame, put_frame};
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
/// item: an empty chunk when it committed, the error when it did not.
pub fn start(
    shared: &Arc<Shared>,
    shards: &[usize],
    request: Vec<u8>,
    settings: &Settings,
    commit: Option<&watch::Sender<Option<bool>>>,
) -> Vec<mpsc::Receiver<Chunk>> {
    let request = Arc::new(request);
    shards
        .iter()
        .map(|&shard| {
            let (tx, rx) = mpsc::channel(8);
            let shared = shared.clone();
            let request = request.clone();
            let settings = settings.clone();
            let commit = commit.map(|c| c.subscribe());
            tokio::spawn(async move {
                if let Err(e) = on_shard(&shared, shard, &request, &settings, &tx, commit).await {
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
    commit: Option<watch::Receiver<Option<bool>>>,
) -> Result<(), SqlError> {
    let name = shared.map.shards()[shard].range.to_string();
    let pool = shared.pools().for_shard(shard);
    let mut pooled = shared.checkout(shard).await?;
    let conn = &mut *pooled;
    let fp = settings.fingerprint();
    let mut out = Vec::with_capacity(request.len() + 64);
    let mut skip_ready = usize::from(settings.write_apply(conn.settings_fp, &mut out));
    if commit.is_some() {
        put_frame(&mut out, b'Q', b"BEGIN\0");
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
    let Some(mut commit) = commit else {
        return result;
    };
    // The session's verdict; a dropped sender (an error elsewhere, the client gone) is a no.
    let verdict = matches!(
        commit.wait_for(|d| d.is_some()).await.as_deref(),
        Ok(Some(true))
    );
    let mut end = Vec::with_capacity(16);
    put_frame(
        &mut end,
        b'Q',
        if verdict { b"COMMIT\0" } else { b"ROLLBACK\0" },
    );
    let (mut error, mut status) = (None, b'?');
    let ended = conn
        .round_trip(&end, 1, |frame| match frame[0] {
            b'E' => error = Some(super::broadcast::error_fields(frame).1),
            b'Z' => status = frame.get(5).copied().unwrap_or(b'?'),
            _ => {}
        })
        .await;
    let failure = match (ended, error) {
        (Err(e), _) => Some(e.to_string()),
        (Ok(()), Some(message)) => Some(message),
        (Ok(()), None) if status != b'I' => Some("the transaction did not end".to_string()),
        (Ok(()), None) => None,
    };
    if let Some(why) = failure {
        drop(deadpool::managed::Object::take(pooled));
        if verdict {
            return Err(SqlError::new(errors::CONNECTION_FAILURE, why));
        }
        return Ok(());
    }
    if verdict {
        let _ = tx.send(Ok(Vec::new())).await;
    }
    Ok(())
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

/// The running merge of one row of aggregates across shards.
pub struct AggregateMerge {
    aggs: Aggregates,
    /// Bit i set: column i is in binary format.
    binary: u8,
    values: Vec<Option<i128>>,
    /// Binary width (2, 4 or 8 bytes) of each column, from the shards' values.
    widths: Vec<usize>,
}

impl AggregateMerge {
    pub fn new(aggs: Aggregates, binary: u8) -> AggregateMerge {
        let n = aggs.ops().len();
        AggregateMerge {
            aggs,
            binary,
            values: aggs
                .ops()
                .iter()
                .map(|op| (*op == AggOp::Count).then_some(0))
                .collect(),
            widths: vec![8; n],
        }
    }

    /// Folds one shard's row (a DataRow body) in; the error says why it cannot be merged.
    pub fn fold(&mut self, body: &[u8]) -> Result<(), &'static str> {
        let n = self.aggs.ops().len();
        if body.len() < 2 || i16::from_be_bytes([body[0], body[1]]) as usize != n {
            return Err("a shard answered with another number of columns");
        }
        let mut at = 2;
        for (i, op) in self.aggs.ops().iter().enumerate() {
            let len = i32::from_be_bytes(
                body.get(at..at + 4)
                    .ok_or("a short row")?
                    .try_into()
                    .map_err(|_| "a short row")?,
            );
            at += 4;
            if len < 0 {
                continue; // NULL: adds nothing
            }
            let raw = body.get(at..at + len as usize).ok_or("a short row")?;
            at += len as usize;
            let v = if self.binary & (1 << i) != 0 {
                self.widths[i] = raw.len();
                match raw.len() {
                    2 => i128::from(i16::from_be_bytes([raw[0], raw[1]])),
                    4 => i128::from(i32::from_be_bytes([raw[0], raw[1], raw[2], raw[3]])),
                    8 => i128::from(i64::from_be_bytes(raw.try_into().map_err(|_| "a short row")?)),
                    _ => return Err("only integer aggregates merge across shards in binary format (ask for text results)"),
                }
            } else {
                std::str::from_utf8(raw)
                    .ok()
                    .and_then(|t| t.parse::<i128>().ok())
                    .ok_or("only integer aggregates merge across shards (numeric with decimals, floats, text and dates do not yet)")?
            };
            let slot = &mut self.values[i];
            *slot = Some(match (op, *slot) {
                (_, None) => v,
                (AggOp::Count | AggOp::Sum, Some(acc)) => {
                    acc.checked_add(v).ok_or("an aggregate overflows")?
                }
                (AggOp::Min, Some(acc)) => acc.min(v),
                (AggOp::Max, Some(acc)) => acc.max(v),
            });
        }
        Ok(())
    }

    /// The merged row, as a DataRow.
    pub fn write(&self, out: &mut Vec<u8>) -> Result<(), &'static str> {
        let at = begin_frame(out, b'D');
        out.extend_from_slice(&(self.values.len() as i16).to_be_bytes());
        for (i, v) in self.values.iter().enumerate() {
            match v {
                None => out.extend_from_slice(&(-1i32).to_be_bytes()),
                Some(v) if self.binary & (1 << i) != 0 => {
                    let bytes: Vec<u8> = match self.widths[i] {
                        2 => i16::try_from(*v)
                            .map_err(|_| "an aggregate overflows")?
                            .to_be_bytes()
                            .to_vec(),
                        4 => i32::try_from(*v)
                            .map_err(|_| "an aggregate overflows")?
                            .to_be_bytes()
                            .to_vec(),
                        _ => i64::try_from(*v)
                            .map_err(|_| "an aggregate overflows")?
                            .to_be_bytes()
                            .to_vec(),
                    };
                    out.extend_from_slice(&(bytes.len() as i32).to_be_bytes());
                    out.extend_from_slice(&bytes);
                }
                Some(v) => {
                    let text = v.to_string();
                    out.extend_from_slice(&(text.len() as i32).to_be_bytes());
                    out.extend_from_slice(text.as_bytes());
                }
            }
        }
        end_frame(out, at);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(values: &[Option<&[u8]>]) -> Vec<u8> {
        let mut b = (values.len() as i16).to_be_bytes().to_vec();
        for v in values {
            match v {
                None => b.extend_from_slice(&(-1i32).to_be_bytes()),
                Some(v) => {
                    b.extend_from_slice(&(v.len() as i32).to_be_bytes());
                    b.extend_from_slice(v);
                }
            }
        }
        b
    }

    #[test]
    fn reads_tags() {
        assert_eq!(rows_in_tag(b"SELECT 42\0"), 42);
        assert_eq!(rows_in_tag(b"SELECT\0"), 0);
    }

    #[test]
    fn merges_aggregates_column_by_column() {
        use crate::planner::{AggOp, Merge};
        let plan = |sql: &str| {
            let stmt = sqlparser::parser::Parser::parse_sql(
                &sqlparser::dialect::PostgreSqlDialect {},
                sql,
            )
            .expect("sql");
            crate::planner::scatter_merge_for_tests(&stmt[0])
        };
        let Ok(Merge::Aggregate(aggs)) = plan("SELECT count(*), sum(n), min(n), max(n) FROM t")
        else {
            panic!("aggregates");
        };
        assert_eq!(
            aggs.ops(),
            [AggOp::Count, AggOp::Sum, AggOp::Min, AggOp::Max]
        );
        let mut m = AggregateMerge::new(aggs, 0);
        m.fold(&row(&[Some(b"3"), Some(b"10"), Some(b"-4"), Some(b"7")]))
            .expect("fold");
        m.fold(&row(&[Some(b"0"), None, None, None])).expect("fold");
        m.fold(&row(&[Some(b"2"), Some(b"5"), Some(b"1"), Some(b"9")]))
            .expect("fold");
        let mut out = Vec::new();
        m.write(&mut out).expect("write");
        assert_eq!(
            &out[5..],
            row(&[Some(b"5"), Some(b"15"), Some(b"-4"), Some(b"9")])
        );
        assert!(
            m.fold(&row(&[Some(b"1"), Some(b"1.5"), None, None]))
                .is_err(),
            "decimals are refused"
        );
        // Binary int8 count, all-NULL sum stays NULL.
        let Ok(Merge::Aggregate(aggs)) = plan("SELECT count(*), sum(n) FROM t") else {
            panic!()
        };
        let mut m = AggregateMerge::new(aggs, 0b01);
        m.fold(&row(&[Some(&7i64.to_be_bytes()), None]))
            .expect("fold");
        m.fold(&row(&[Some(&0x3030_3030_3030_3030i64.to_be_bytes()), None]))
            .expect("fold");
        let mut out = Vec::new();
        m.write(&mut out).expect("write");
        assert_eq!(
            &out[5..],
            row(&[Some(&(0x3030_3030_3030_3037i64).to_be_bytes()), None])
        );
        assert!(plan("SELECT count(*), id FROM t").is_err());
        assert!(plan("SELECT avg(n) FROM t").is_err());
    }
}
