//! A multi-row INSERT whose rows belong to several shards: each shard gets an INSERT of its own
//! rows (cut from the client's text by [`crate::planner::values`]), run one shard after another
//! in shard order, each in a transaction that is committed only when every shard's INSERT
//! succeeded, and rolled back everywhere otherwise. So a failing row (a duplicate key, a bad value) leaves no row anywhere,
//! as with one Postgres. Only a failure between the first and the last COMMIT can leave a part
//! applied; the error then names the shards that committed and those that did not.
//!
//! The client's answer is combined by the session: one command tag with the total, and
//! RETURNING rows given back in VALUES order.

use std::sync::Arc;

use super::broadcast::error_fields;
use super::settings::Settings;
use crate::backend::pool::PooledConn;
use crate::errors;
use crate::protocol::frame::put_query;
use crate::protocol::reply::SqlError;
use crate::shared::Shared;

/// How the whole INSERT ended.
pub enum Outcome {
    /// Every part committed: each part's reply frames (RowDescription, DataRows,
    /// CommandComplete), in the order of `parts`.
    Committed(Vec<Vec<u8>>),
    /// A part failed and nothing was committed: Postgres's ErrorResponse frame, to forward.
    RolledBack(Vec<u8>),
    /// Nothing was committed, for a reason the router found (a shard unreachable).
    Failed(SqlError),
}

/// Runs `parts` (shard, INSERT text) as described above.
pub async fn run(
    shared: &Arc<Shared>,
    parts: Vec<(usize, String)>,
    settings: &Settings,
) -> Outcome {
    let n = parts.len();
    let shards: Vec<usize> = parts.iter().map(|p| p.0).collect();
    // Phase 1: BEGIN and the INSERT on each shard, one after another in shard order (see
    // `scatter::start` on why the order matters); the transactions stay open.
    let mut conns: Vec<(usize, PooledConn)> = Vec::with_capacity(n);
    let mut replies: Vec<Vec<u8>> = vec![Vec::new(); n];
    let mut failure: Option<Outcome> = None;
    for (i, (shard, sql)) in parts.into_iter().enumerate() {
        match insert(shared, shard, &sql, settings).await {
            Ok((conn, Ok(frames))) => {
                conns.push((i, conn));
                replies[i] = frames;
            }
            Ok((conn, Err(error))) => {
                // Postgres refused the rows; that shard's transaction is aborted.
                conns.push((i, conn));
                failure = Some(Outcome::RolledBack(error));
                break;
            }
            Err(e) => {
                failure = Some(Outcome::Failed(e));
                break;
            }
        }
    }
    let commit = failure.is_none();
    // Phase 2: COMMIT everywhere, or ROLLBACK everywhere.
    let mut ends = tokio::task::JoinSet::new();
    for (i, conn) in conns {
        ends.spawn(async move { (i, end(conn, commit).await) });
    }
    let mut not_committed = Vec::new();
    let mut first_error = String::new();
    while let Some(joined) = ends.join_next().await {
        let (i, result) = match joined {
            Ok(r) => r,
            Err(e) => {
                tracing::error!("an INSERT's COMMIT task failed: {e}");
                continue;
            }
        };
        if let Err(why) = result {
            if commit {
                not_committed.push(i);
                if first_error.is_empty() {
                    first_error = why;
                }
            }
        }
    }
    if let Some(f) = failure {
        return f;
    }
    if !not_committed.is_empty() {
        let name = |i: usize| shared.map.shards()[shards[i]].range.to_string();
        let failed: Vec<String> = not_committed.iter().map(|&i| name(i)).collect();
        let committed: Vec<String> = (0..n)
            .filter(|i| !not_committed.contains(i))
            .map(name)
            .collect();
        return Outcome::Failed(
            SqlError::new(
                errors::CONNECTION_FAILURE,
                format!(
                    "the INSERT committed on shards {} but its COMMIT failed on {}: {first_error}",
                    committed.join(", "),
                    failed.join(", ")
                ),
            )
            .with_hint("the rows of the failed shards may be missing: check them by key and insert them again"),
        );
    }
    Outcome::Committed(replies)
}

type Inserted = Result<(PooledConn, Result<Vec<u8>, Vec<u8>>), SqlError>;

/// BEGIN and the INSERT on one shard: the connection (in its open transaction) with the
/// INSERT's reply frames, or Postgres's error frame.
async fn insert(shared: &Shared, shard: usize, sql: &str, settings: &Settings) -> Inserted {
    let mut conn = shared.checkout(shard).await?;
    let mut out = Vec::with_capacity(sql.len() + 64);
    let settings_sent = settings.write_apply(conn.settings_fp, &mut out);
    put_query(&mut out, BEGIN_PART);
    put_query(&mut out, sql);
    let readies = 2 + usize::from(settings_sent);
    let (mut seen, mut frames, mut error) = (0, Vec::new(), None);
    let result = conn
        .round_trip(&out, readies, |frame| match frame[0] {
            b'Z' => seen += 1,
            // The settings' and BEGIN's errors are the INSERT's too: it did not run.
            b'E' if error.is_none() => error = Some(frame.to_vec()),
            b'T' | b'D' | b'C' if seen + 1 == readies => frames.extend_from_slice(frame),
            _ => {}
        })
        .await;
    if let Err(e) = result {
        let endpoint = shared.pools().for_shard(shard).endpoint.name();
        let name = shared.map.shards()[shard].range.to_string();
        drop(deadpool::managed::Object::take(conn));
        return Err(errors::shard_lost(&name, &endpoint, &e.to_string()));
    }
    if settings_sent {
        conn.settings_fp = settings.fingerprint();
    }
    Ok((conn, error.map_or(Ok(frames), Err)))
}

/// How each shard's part of a write on several shards begins: deferred constraints are checked
/// with the statement, not at a COMMIT that other shards may already have passed.
pub(super) const BEGIN_PART: &str = "BEGIN; SET CONSTRAINTS ALL IMMEDIATE";

/// COMMIT or ROLLBACK on a connection left in a transaction; `Err` with Postgres's message
/// (or the connection's failure) if it did not end as asked. A broken connection is discarded.
pub(super) async fn end(mut conn: PooledConn, commit: bool) -> Result<(), String> {
    let mut out = Vec::with_capacity(16);
    put_query(&mut out, if commit { "COMMIT" } else { "ROLLBACK" });
    let mut error = None;
    let mut status = b'?';
    let result = conn
        .round_trip(&out, 1, |frame| match frame[0] {
            b'E' => error = Some(error_fields(frame).1),
            b'Z' => status = frame.get(5).copied().unwrap_or(b'?'),
            _ => {}
        })
        .await;
    match (result, error) {
        (Err(e), _) => {
            drop(deadpool::managed::Object::take(conn));
            Err(e.to_string())
        }
        (Ok(()), Some(message)) => Err(message),
        // A COMMIT of an aborted transaction answers ROLLBACK without an error.
        (Ok(()), None) if status != b'I' => {
            drop(deadpool::managed::Object::take(conn));
            Err("the connection stayed in a transaction".into())
        }
        (Ok(()), None) => Ok(()),
    }
}

/// The client's answer from every part's reply frames (without ReadyForQuery): the first
/// RowDescription, RETURNING rows in VALUES order (`part_of_row[i]` is the part that inserted
/// row i; each part returns its rows in its own order) and `INSERT 0 <total>`.
pub fn combine(replies: &[Vec<u8>], part_of_row: &[usize], out: &mut Vec<u8>) {
    use crate::protocol::frame::frames;
    let mut description: Option<&[u8]> = None;
    let mut rows: Vec<std::collections::VecDeque<&[u8]>> = vec![Default::default(); replies.len()];
    let mut total = 0;
    for (p, reply) in replies.iter().enumerate() {
        for frame in frames(reply).map_while(Result::ok) {
            match frame[0] {
                b'T' => {
                    description.get_or_insert(frame);
                }
                b'D' => rows[p].push_back(frame),
                b'C' => total += super::scatter::rows_in_tag(&frame[5..]),
                _ => {}
            }
        }
    }
    if let Some(d) = description {
        out.extend_from_slice(d);
    }
    for &p in part_of_row {
        if let Some(row) = rows.get_mut(p).and_then(|q| q.pop_front()) {
            out.extend_from_slice(row);
        }
    }
    crate::protocol::reply::command_complete(out, &format!("INSERT 0 {total}"));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::frame::put_frame;

    #[test]
    fn returning_rows_come_back_in_values_order() {
        let part = |ids: &[&str]| {
            let mut v = Vec::new();
            put_frame(&mut v, b'T', b"desc");
            for id in ids {
                put_frame(&mut v, b'D', id.as_bytes());
            }
            crate::protocol::reply::command_complete(&mut v, &format!("INSERT 0 {}", ids.len()));
            v
        };
        // Rows 0, 2, 3 went to part 0 and rows 1, 4 to part 1.
        let replies = [part(&["r0", "r2", "r3"]), part(&["r1", "r4"])];
        let mut out = Vec::new();
        combine(&replies, &[0, 1, 0, 0, 1], &mut out);
        let got: Vec<(u8, &[u8])> = crate::protocol::frame::frames(&out)
            .map_while(Result::ok)
            .map(|f| (f[0], &f[5..]))
            .collect();
        assert_eq!(
            got,
            [
                (b'T', &b"desc"[..]),
                (b'D', b"r0"),
                (b'D', b"r1"),
                (b'D', b"r2"),
                (b'D', b"r3"),
                (b'D', b"r4"),
                (b'C', b"INSERT 0 5\0"),
            ]
        );
    }
}
